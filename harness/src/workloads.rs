//! Workloads over one shared address space, each verified against a CPU-only reference.
//!
//! VectorAdd (`c = a + b` over `u32`s): the CPU prepares the inputs, a faultable discrete
//! device with local memory computes, the CPU reads the result back — the GMEM paper's
//! first simulated workload. The device memory can be smaller than the working set: the
//! run then exercises eviction to host memory (oversubscription).

use gmem_core::testing::TestSystem;
use gmem_core::{
    AllocPolicy, AllocRequest, DevCaps, MapFlags, MmuMode, Stats, VirtAddr, PAGE_SIZE,
};

const DEVICE_BASE: u64 = 0x40_0000_0000;

/// Run VectorAdd on `elements` u32s with device memory `percent`% of the working set;
/// returns the core's counters and the number of elements that differ from the CPU-only
/// reference.
pub fn vectoradd(elements: u64, percent: u64) -> Result<(Stats, u64), String> {
    let bytes = elements * 4;
    let pages = bytes.div_ceil(PAGE_SIZE);
    let working_set = 3 * pages;
    let device_pages = (working_set * percent / 100).max(1);
    let mut sys = TestSystem::without_log(working_set * 2 + 64);
    let gpu = sys.add_device(7, DevCaps::FAULTABLE, DEVICE_BASE, device_pages);
    let gm = &sys.gm;
    let space = gm
        .as_create(
            VirtAddr::new(1 << 32),
            VirtAddr::new(1 << 40),
            AllocPolicy::empty(),
        )
        .map_err(|e| e.to_string())?;
    gm.as_attach(space, sys.host().id, MmuMode::Coherent, true)
        .map_err(|e| e.to_string())?;
    gm.as_attach(space, sys.devices[gpu].id, MmuMode::Coherent, true)
        .map_err(|e| e.to_string())?;
    let alloc = |n| {
        gm.as_alloc(space, AllocRequest::new(n * PAGE_SIZE))
            .map_err(|e| e.to_string())
    };
    let (a, b, c) = (alloc(pages)?, alloc(pages)?, alloc(pages)?);
    let at = |r: gmem_core::Region, i: u64| VirtAddr::new(r.start.as_u64() + i * 4);
    let input = |i: u64, k: u32| (i as u32).wrapping_mul(2_654_435_761).wrapping_add(k);
    let err = |e: gmem_core::testing::AccessError| format!("{e:?}");

    // The CPU prepares the inputs, a page at a time.
    let per_page = PAGE_SIZE / 4;
    for p in 0..pages {
        let n = per_page.min(elements - p * per_page);
        let xs: Vec<u8> = (0..n)
            .flat_map(|j| input(p * per_page + j, 1).to_le_bytes())
            .collect();
        let ys: Vec<u8> = (0..n)
            .flat_map(|j| input(p * per_page + j, 2).to_le_bytes())
            .collect();
        sys.write(0, at(a, p * per_page), &xs).map_err(err)?;
        sys.write(0, at(b, p * per_page), &ys).map_err(err)?;
    }
    // The device computes through its own MMU.
    for p in 0..pages {
        let n = (per_page.min(elements - p * per_page) * 4) as usize;
        let xs = sys.read(gpu, at(a, p * per_page), n).map_err(err)?;
        let ys = sys.read(gpu, at(b, p * per_page), n).map_err(err)?;
        let zs: Vec<u8> = xs
            .chunks(4)
            .zip(ys.chunks(4))
            .flat_map(|(x, y)| {
                let x = u32::from_le_bytes(x.try_into().expect("4 bytes"));
                let y = u32::from_le_bytes(y.try_into().expect("4 bytes"));
                x.wrapping_add(y).to_le_bytes()
            })
            .collect();
        sys.write(gpu, at(c, p * per_page), &zs).map_err(err)?;
    }
    // The CPU reads the result and checks it against a CPU-only computation.
    let mut mismatches = 0u64;
    for p in 0..pages {
        let n = per_page.min(elements - p * per_page);
        let zs = sys
            .read(0, at(c, p * per_page), (n * 4) as usize)
            .map_err(err)?;
        for j in 0..n {
            let i = p * per_page + j;
            let got = u32::from_le_bytes(
                zs[(j * 4) as usize..(j * 4 + 4) as usize]
                    .try_into()
                    .expect("4 bytes"),
            );
            if got != input(i, 1).wrapping_add(input(i, 2)) {
                mismatches += 1;
            }
        }
    }
    for r in [a, b, c] {
        gm.region_dealloc(r, MapFlags::empty(), None)
            .map_err(|e| e.to_string())?;
    }
    gm.check_invariants(space).map_err(|e| e.to_string())?;
    Ok((gm.stats(), mismatches))
}
