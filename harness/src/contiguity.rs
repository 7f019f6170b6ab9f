//! `contiguity` — how much VA→PA contiguity survives a realistic churn, with and
//! without superpage reservations (Navarro et al., OSDI 2002; the core's
//! `physmem::reserve`).
//!
//! ## The experiment
//! One address space, a host CPU (4 KiB leaves) and a discrete GPU whose MMU maps
//! 4 KiB and 2 MiB leaves, with less local memory than the working set (memory
//! pressure: evictions to host memory, reservations broken). Regions of random sizes
//! (64 KiB to 6 MiB, half of them 2 MiB aligned) are populated a page at a time (a
//! 4 KiB zero-fill block, as a device that faults at 4 KiB does: with the default
//! 2 MiB block, first touch would be contiguous whatever the allocator does). A new
//! region is first written whole by the GPU in a shuffled page order (as parallel
//! threads touch an array out of order), two regions at a time interleaved, and then
//! everything is churned by a seeded random sequence:
//! - 72%: the GPU writes a random run of 1 to 64 pages of a random region (faults,
//!   zero-fills or migrations back from host memory);
//! - 14%: the CPU reads a random page (under the unique policy it migrates to host);
//! - 6%: a whole region migrates to host memory, 5%: back to the GPU;
//! - 3%: a region is freed and a new one of random size allocated (and populated).
//!
//! The same seed runs twice, reservations enabled and disabled in both memories; the
//! sequences of operations are identical (the random choices do not depend on where
//! frames land). Then, for every naturally aligned 2 MiB virtual block (and 256 KiB
//! subregion) inside a region whose pages all have frames in one memory, the run counts
//! whether the pages are VA→PA contiguous (one frame offset for the whole block) and
//! whether that offset is also block aligned (the block can be one large leaf). Large
//! leaves held at the end, promotions, splits and reservation counters are the core's
//! own. Every byte the GPU wrote is verified at the end against a CPU-side model.
//!
//! Nothing here is a cost model; the figures are what the allocator did.

use gmem_core::testing::TestSystem;
use gmem_core::{
    Activation, AllocPolicy, AllocRequest, DevCaps, DeviceId, MapFlags, MigrateScope, MmuMode,
    PageSizes, Region, ReservationStats, SpaceId, Stats, VaRange, VirtAddr, PAGE_SIZE,
};
use std::collections::BTreeMap;

const BLOCK: u64 = 2 << 20;
const SUB: u64 = 256 << 10;
const GPU_BASE: u64 = 0x8000_0000;

/// Sizes of one run.
#[derive(Clone, Copy, Debug)]
pub struct Params {
    /// GPU memory in pages.
    pub gpu_pages: u64,
    /// Live regions.
    pub regions: usize,
    /// Churn operations.
    pub ops: u64,
    /// The seed.
    pub seed: u64,
}

impl Params {
    /// The CI size (about a second) or the full one.
    pub fn new(quick: bool, seed: u64) -> Params {
        if quick {
            Params {
                gpu_pages: 6144,
                regions: 12,
                ops: 4_000,
                seed,
            }
        } else {
            Params {
                gpu_pages: 24576,
                regions: 40,
                ops: 40_000,
                seed,
            }
        }
    }
}

/// Contiguity of one block size.
#[derive(Clone, Copy, Debug, Default, serde::Serialize)]
pub struct Fractions {
    /// Aligned virtual blocks inside a region with every page populated in one memory.
    pub populated: u64,
    /// Of those, blocks whose pages are VA→PA contiguous.
    pub contiguous: u64,
    /// Of those, blocks whose frames are also block aligned (mappable as one leaf).
    pub aligned: u64,
}

impl Fractions {
    fn frac(n: u64, d: u64) -> f64 {
        if d == 0 {
            0.0
        } else {
            n as f64 / d as f64
        }
    }
    /// `contiguous / populated`.
    pub fn contiguous_fraction(&self) -> f64 {
        Fractions::frac(self.contiguous, self.populated)
    }
    /// `aligned / populated`.
    pub fn aligned_fraction(&self) -> f64 {
        Fractions::frac(self.aligned, self.populated)
    }
}

/// One run's result.
#[derive(Clone, Debug, serde::Serialize)]
pub struct Row {
    /// Reservations enabled.
    pub reservations: bool,
    /// 2 MiB blocks.
    pub blocks_2m: Fractions,
    /// 256 KiB subregions.
    pub subregions_256k: Fractions,
    /// 2 MiB leaves held at the end (all tables).
    pub large_leaves: u64,
    /// The core's large-page counters.
    pub large_maps: u64,
    /// Splits.
    pub large_splits: u64,
    /// Promotions (opportunistic: the fault that completes a block).
    pub promotions: u64,
    /// Evictions.
    pub evictions: u64,
    /// GPU reservations: made, filled (counted per fill), broken.
    pub gpu_reservations: (u64, u64, u64),
    /// Whether every byte matched the model.
    pub verified: bool,
}

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}

struct Live {
    region: Region,
    pages: u64,
}

fn stamp(region: u64, page: u64, version: u64) -> [u8; 8] {
    (region
        .wrapping_mul(0x9e37_79b9)
        .wrapping_add(page << 20)
        .wrapping_add(version))
    .to_le_bytes()
}

/// Run both configurations.
///
/// # Errors
/// A machine that cannot be built, or an access the core refused.
pub fn run(p: Params) -> Result<Vec<Row>, String> {
    Ok(vec![run_one(p, true)?, run_one(p, false)?])
}

fn run_one(p: Params, reservations: bool) -> Result<Row, String> {
    let e = |e: &dyn std::fmt::Debug| format!("{e:?}");
    let mut sys = TestSystem::without_log(p.gpu_pages * 8);
    let space = sys
        .gm
        .as_create(
            VirtAddr::new(1 << 32),
            VirtAddr::new(1 << 40),
            AllocPolicy::empty(),
        )
        .map_err(|x| e(&x))?;
    let host = sys.host().id;
    sys.gm
        .as_attach(space, host, MmuMode::Coherent, Activation::Switch)
        .map_err(|x| e(&x))?;
    let g = sys.add_device_with_sizes(
        7,
        DevCaps::FAULTABLE,
        GPU_BASE,
        p.gpu_pages,
        PageSizes::S4K | PageSizes::S2M,
    );
    let gpu = sys.devices[g].id;
    sys.gm
        .as_attach(space, gpu, MmuMode::Coherent, Activation::Switch)
        .map_err(|x| e(&x))?;
    for d in [host, gpu] {
        sys.gm
            .dev_set_reservations(d, reservations)
            .map_err(|x| e(&x))?;
    }
    let mut rng = Rng(p.seed | 1);
    let mut next_id = 0u64;
    // Model: (region id, page) → last stamp version written.
    let mut model: BTreeMap<(u64, u64), u64> = BTreeMap::new();
    let mut live: Vec<(u64, Live)> = Vec::new();
    let alloc = |sys: &TestSystem, rng: &mut Rng| -> Result<Live, String> {
        let pages = 16 + rng.below(1536 - 16);
        let mut req = AllocRequest::new(pages * PAGE_SIZE);
        if rng.below(2) == 0 {
            req.align = BLOCK;
        }
        let region = sys.gm.as_alloc(space, req).map_err(|x| e(&x))?;
        sys.gm
            .region_set_zero_fill_block(region, PAGE_SIZE)
            .map_err(|x| e(&x))?;
        Ok(Live { region, pages })
    };
    let mut version = 0u64;
    // Write a region (or two, interleaved) whole through the GPU, in shuffled order.
    let populate = |sys: &TestSystem,
                    rng: &mut Rng,
                    model: &mut BTreeMap<(u64, u64), u64>,
                    version: &mut u64,
                    rs: &[(u64, &Live)]|
     -> Result<(), String> {
        let mut order: Vec<(u64, u64, u64)> = rs
            .iter()
            .flat_map(|(id, l)| (0..l.pages).map(move |pg| (*id, l.region.start.as_u64(), pg)))
            .collect();
        for i in (1..order.len()).rev() {
            let j = rng.below(i as u64 + 1) as usize;
            order.swap(i, j);
        }
        for (id, start, page) in order {
            *version += 1;
            sys.write(
                g,
                VirtAddr::new(start + page * PAGE_SIZE),
                &stamp(id, page, *version),
            )
            .map_err(|x| e(&x))?;
            model.insert((id, page), *version);
        }
        Ok(())
    };
    for _ in 0..p.regions / 2 {
        let a = alloc(&sys, &mut rng)?;
        let b = alloc(&sys, &mut rng)?;
        populate(
            &sys,
            &mut rng,
            &mut model,
            &mut version,
            &[(next_id, &a), (next_id + 1, &b)],
        )?;
        live.push((next_id, a));
        live.push((next_id + 1, b));
        next_id += 2;
    }
    for _ in 0..p.ops {
        let k = rng.below(live.len() as u64) as usize;
        let op = rng.below(100);
        let (id, l) = (&live[k].0, &live[k].1);
        let page = rng.below(l.pages);
        let va = VirtAddr::new(l.region.start.as_u64() + page * PAGE_SIZE);
        match op {
            0..=71 => {
                let run = (1 + rng.below(64)).min(l.pages - page);
                for pg in page..page + run {
                    version += 1;
                    let v = VirtAddr::new(l.region.start.as_u64() + pg * PAGE_SIZE);
                    sys.write(g, v, &stamp(*id, pg, version))
                        .map_err(|x| e(&x))?;
                    model.insert((*id, pg), version);
                }
            }
            72..=85 => {
                let got = sys.read(0, va, 8).map_err(|x| e(&x))?;
                let want = model
                    .get(&(*id, page))
                    .map_or([0u8; 8], |v| stamp(*id, page, *v));
                if got != want {
                    return Err(format!(
                        "region {id} page {page}: read {got:?}, want {want:?}"
                    ));
                }
            }
            86..=91 => {
                sys.gm
                    .region_migrate(l.region, host, MigrateScope::Populated)
                    .map_err(|x| e(&x))?;
            }
            92..=96 => {
                sys.gm
                    .region_migrate(l.region, gpu, MigrateScope::Populated)
                    .map_err(|x| e(&x))?;
            }
            _ => {
                let (id, old) = live.swap_remove(k);
                sys.gm
                    .region_dealloc(old.region, MapFlags::empty(), None)
                    .map_err(|x| e(&x))?;
                model.retain(|(r, _), _| *r != id);
                let n = alloc(&sys, &mut rng)?;
                populate(&sys, &mut rng, &mut model, &mut version, &[(next_id, &n)])?;
                live.push((next_id, n));
                next_id += 1;
            }
        }
    }
    sys.gm.check_invariants(space).map_err(|x| e(&x))?;
    let blocks_2m = measure(&sys, space, &live, BLOCK)?;
    let subregions_256k = measure(&sys, space, &live, SUB)?;
    let large_leaves = sys.gm.as_large_leaves(space).map_err(|x| e(&x))?.len() as u64;
    let s: Stats = sys.gm.stats();
    let rs: ReservationStats = sys.gm.dev_reservations(gpu).map_err(|x| e(&x))?;
    // Verify every byte the GPU wrote (through the CPU, after the measurement).
    let mut verified = true;
    for (id, l) in &live {
        for page in 0..l.pages {
            if let Some(v) = model.get(&(*id, page)) {
                let va = VirtAddr::new(l.region.start.as_u64() + page * PAGE_SIZE);
                let got = sys.read(0, va, 8).map_err(|x| e(&x))?;
                verified &= got == stamp(*id, page, *v);
            }
        }
    }
    sys.gm.check_invariants(space).map_err(|x| e(&x))?;
    Ok(Row {
        reservations,
        blocks_2m,
        subregions_256k,
        large_leaves,
        large_maps: s.large_maps,
        large_splits: s.large_splits,
        promotions: s.promotions,
        evictions: s.evictions,
        gpu_reservations: (rs.made, rs.filled, rs.broken),
        verified,
    })
}

/// Count the `size`-aligned virtual blocks inside live regions that are populated in
/// one memory, contiguous, and aligned.
fn measure(
    sys: &TestSystem,
    space: SpaceId,
    live: &[(u64, Live)],
    size: u64,
) -> Result<Fractions, String> {
    let mut f = Fractions::default();
    let n = size / PAGE_SIZE;
    for (_, l) in live {
        let start = l.region.start.as_u64();
        let end = start + l.pages * PAGE_SIZE;
        let mut b = start.div_ceil(size) * size;
        while b + size <= end {
            let mut frames: Vec<(u64, DeviceId, u64)> = Vec::new();
            let range = VaRange::new(VirtAddr::new(b), size).map_err(|x| format!("{x:?}"))?;
            sys.gm
                .as_frames(space, range, |v, d, pa| {
                    frames.push((v.as_u64(), d, pa.as_u64()))
                })
                .map_err(|x| format!("{x:?}"))?;
            if frames.len() as u64 == n && frames.iter().all(|x| x.1 == frames[0].1) {
                f.populated += 1;
                let off = frames[0].2.wrapping_sub(frames[0].0);
                if frames.iter().all(|x| x.2.wrapping_sub(x.0) == off) {
                    f.contiguous += 1;
                    if frames[0].2 % size == 0 {
                        f.aligned += 1;
                    }
                }
            }
            b += size;
        }
    }
    Ok(f)
}

/// The table of both runs.
pub fn render(rows: &[Row], p: &Params) -> String {
    let mut s = format!(
        "contiguity after churn: GPU {} MiB (4 KiB + 2 MiB leaves), {} live regions (64 KiB-6 MiB, 4 KiB zero-fill), {} ops, seed {}\n",
        (p.gpu_pages * PAGE_SIZE) >> 20,
        p.regions,
        p.ops,
        p.seed
    );
    s += "reservations | 2M blocks populated | contiguous | aligned | 256K populated | contiguous | aligned | large leaves | promotions | splits | evictions | GPU resv made/filled/broken | verified\n";
    for r in rows {
        s += &format!(
            "{:>12} | {:>19} | {:>9.1}% | {:>6.1}% | {:>14} | {:>9.1}% | {:>6.1}% | {:>12} | {:>10} | {:>6} | {:>9} | {:>27} | {}\n",
            if r.reservations { "on" } else { "off" },
            r.blocks_2m.populated,
            100.0 * r.blocks_2m.contiguous_fraction(),
            100.0 * r.blocks_2m.aligned_fraction(),
            r.subregions_256k.populated,
            100.0 * r.subregions_256k.contiguous_fraction(),
            100.0 * r.subregions_256k.aligned_fraction(),
            r.large_leaves,
            r.promotions,
            r.large_splits,
            r.evictions,
            format!(
                "{}/{}/{}",
                r.gpu_reservations.0, r.gpu_reservations.1, r.gpu_reservations.2
            ),
            r.verified
        );
    }
    s
}
