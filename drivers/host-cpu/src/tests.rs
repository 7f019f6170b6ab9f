//! The host CPU on its own: faults, TLB behaviour, protection, typed errors.

use crate::{HostCpu, HostCpuConfig, HostCpuError};
use gmem_core::{
    Activation, AllocPolicy, AllocRequest, FaultError, Gmem, MmuMode, PhysAddr, Prot, Region,
    SpaceId, VirtAddr, PAGE_SIZE,
};
use gmem_sim::AccessError;

fn system(pages: u64) -> (Gmem, HostCpu, SpaceId, Region) {
    let (gm, cpu) = HostCpu::boot(HostCpuConfig::default()).unwrap();
    let space = gm
        .as_create(
            VirtAddr::new(1 << 30),
            VirtAddr::new(1 << 40),
            AllocPolicy::empty(),
        )
        .unwrap();
    gm.as_attach(space, gm.host(), MmuMode::Coherent, Activation::Switch)
        .unwrap();
    let r = gm
        .as_alloc(space, AllocRequest::new(pages * PAGE_SIZE))
        .unwrap();
    (gm, cpu, space, r)
}

fn at(r: &Region, off: u64) -> VirtAddr {
    VirtAddr::new(r.start.as_u64() + off)
}

#[test]
fn first_touch_faults_once_per_page_and_bytes_round_trip_across_pages() {
    let (gm, cpu, space, r) = system(8);
    let data: Vec<u8> = (0..3 * PAGE_SIZE as usize + 100)
        .map(|i| (i * 7) as u8)
        .collect();
    cpu.store(&gm, at(&r, 50), &data).unwrap();
    let mut back = vec![0; data.len()];
    cpu.load(&gm, at(&r, 50), &mut back).unwrap();
    assert_eq!(back, data);
    let s = cpu.stats();
    assert_eq!(s.port.faults, 4);
    assert_eq!(s.port.zero_fills, 4);
    assert_eq!(gm.stats().faults_zero_fill, 4);
    // The bytes are in host memory, at the frames the tables point to.
    let root = cpu.mmu().active_root().unwrap();
    let leaf = cpu.tables().lookup(root, at(&r, 50)).unwrap();
    let mut b = [0u8; 4];
    cpu.memory()
        .read(leaf.translate(at(&r, 50)), &mut b)
        .unwrap();
    assert_eq!(b, data[..4]);
    gm.check_invariants(space).unwrap();
}

#[test]
fn a_cold_walk_reads_four_entries_and_a_second_access_hits_the_tlb() {
    let (gm, cpu, _, r) = system(2);
    cpu.store_u32(&gm, at(&r, 0), 1).unwrap();
    let before = cpu.stats().mmu.caches;
    assert_eq!(cpu.load_u32(&gm, at(&r, 0)).unwrap(), 1);
    let after = cpu.stats().mmu.caches;
    assert_eq!(after.walks, before.walks);
    assert_eq!(after.l1.hits, before.l1.hits + 1);
    // The store walked twice: before the fault (the root entry was empty: 1 read) and
    // after it (4 reads: the page-walk cache had nothing yet), then set A and D once.
    assert_eq!(
        (before.walks, before.walk_reads, before.walk_writes),
        (2, 5, 1)
    );
    assert!(cpu.mmu().cached(0, at(&r, 0)));
}

#[test]
fn a_store_to_a_read_only_region_is_a_typed_fault_and_succeeds_after_protect() {
    let (gm, cpu, _, r) = system(1);
    cpu.store_u32(&gm, at(&r, 0), 5).unwrap();
    gm.region_protect(r, Prot::READ).unwrap();
    assert_eq!(cpu.load_u32(&gm, at(&r, 0)).unwrap(), 5);
    let err = cpu.store_u32(&gm, at(&r, 0), 6).unwrap_err();
    assert!(
        matches!(
            err,
            AccessError::Fault {
                error: FaultError::ProtectionViolation { .. },
                ..
            }
        ),
        "{err:?}"
    );
    assert_eq!(cpu.stats().port.protection_faults, 1);
    gm.region_protect(r, Prot::RW).unwrap();
    cpu.store_u32(&gm, at(&r, 0), 6).unwrap();
    assert_eq!(cpu.load_u32(&gm, at(&r, 0)).unwrap(), 6);
}

#[test]
fn accesses_outside_regions_or_without_a_space_are_typed_errors() {
    let (gm, cpu) = HostCpu::boot(HostCpuConfig::default()).unwrap();
    let va = VirtAddr::new(1 << 30);
    assert!(matches!(
        cpu.load_u32(&gm, va),
        Err(AccessError::Fault {
            error: FaultError::NotActive(_),
            ..
        })
    ));
    let (gm, cpu, _, r) = system(1);
    assert!(matches!(
        cpu.load_u32(&gm, at(&r, PAGE_SIZE)),
        Err(AccessError::Fault {
            error: FaultError::NotAllocated(_),
            ..
        })
    ));
    assert!(matches!(
        cpu.load(&gm, VirtAddr::new(u64::MAX), &mut [0; 2]),
        Err(AccessError::BadAccess { .. })
    ));
    assert_eq!(
        cpu.register(&gm),
        Err(HostCpuError::AlreadyRegistered(gm.host()))
    );
}

#[test]
fn bad_configurations_are_rejected() {
    let c = HostCpuConfig {
        table_frames: 1 << 20,
        ..HostCpuConfig::default()
    };
    assert_eq!(HostCpu::new(c).err(), Some(HostCpuError::NoMemoryLeft));
    let c = HostCpuConfig {
        memory_base: PhysAddr::new(0x800),
        ..HostCpuConfig::default()
    };
    assert!(matches!(
        HostCpu::new(c).err(),
        Some(HostCpuError::Memory(_))
    ));
    let mut c = HostCpuConfig::default();
    c.tlbs.units = 0;
    assert!(matches!(HostCpu::new(c).err(), Some(HostCpuError::Tlb(_))));
}
