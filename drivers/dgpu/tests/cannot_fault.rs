//! The GPU configured as one that cannot fault: created without `FAULTABLE`, it reaches
//! only what the core maps for it eagerly (wired pages, its private frames); a miss is
//! an error the core refuses to serve, and nothing is populated or migrated for it.

use gmem_core::{
    Activation, AllocPolicy, AllocRequest, DevCaps, FaultError, MmuMode, VirtAddr, PAGE_SIZE,
};
use gmem_dgpu::{Dgpu, DgpuConfig};
use gmem_host_cpu::{HostCpu, HostCpuConfig};
use gmem_sim::{AccessError, Grid};

#[test]
fn a_gpu_that_cannot_fault_reaches_only_eager_mappings() {
    let (gm, cpu) = HostCpu::boot(HostCpuConfig::default()).unwrap();
    let space = gm
        .as_create(
            VirtAddr::new(1 << 30),
            VirtAddr::new(1 << 38),
            AllocPolicy::empty(),
        )
        .unwrap();
    gm.as_attach(space, gm.host(), MmuMode::Coherent, Activation::Switch)
        .unwrap();
    let config = DgpuConfig::new(0, 4 << 20, 2).cannot_fault();
    assert!(!config.faultable && DgpuConfig::new(0, 4 << 20, 2).faultable);
    let gpu = Dgpu::new(cpu.memory_map().clone(), config).unwrap();
    let id = gpu.create(&gm, "dgpu").unwrap();
    assert_eq!(gm.dev_caps(id).unwrap(), DevCaps::LOCAL_MEMORY);
    gm.as_attach(space, id, MmuMode::Coherent, Activation::Switch)
        .unwrap();
    let plain = gm.as_alloc(space, AllocRequest::new(PAGE_SIZE)).unwrap();
    let wired = gm.as_alloc(space, AllocRequest::new(PAGE_SIZE)).unwrap();
    let private = gm.as_alloc(space, AllocRequest::new(PAGE_SIZE)).unwrap();
    cpu.store_u32(&gm, wired.start, 7).unwrap();
    gm.region_wire(wired).unwrap();
    gm.region_alloc_private(private, id).unwrap();
    cpu.store_u32(&gm, private.start, 9).unwrap();
    let seen = std::cell::Cell::new((0, 0));
    gpu.launch(&gm, Grid::covering(1, 1), |w| {
        let a = w.load_u32(wired.start)?; // the shared, wired page (host memory)
        let b = w.load_u32(private.start)?; // its own zeroed copy, not the CPU's 9
        w.store_u32(private.start, 5)?;
        seen.set((a, b));
        Ok(())
    })
    .unwrap();
    assert_eq!(seen.get(), (7, 0));
    assert_eq!(cpu.load_u32(&gm, private.start).unwrap(), 9);
    let err = gpu
        .launch(&gm, Grid::covering(1, 1), |w| {
            w.load_u32(plain.start).map(|_| ())
        })
        .unwrap_err();
    assert!(
        matches!(
            err.error,
            AccessError::Fault {
                error: FaultError::NotFaultable(d),
                ..
            } if d == id
        ),
        "{err:?}"
    );
    let s = gpu.stats().port;
    assert_eq!((s.zero_fills, s.migrations, s.remote), (0, 0, 0));
    assert_eq!(
        gm.as_page_frame(space, plain.start).unwrap(),
        None,
        "nothing populated for it"
    );
    gm.check_invariants(space).unwrap();
}
