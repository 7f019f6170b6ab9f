//! Tests of the VM: the guest CPU and the pass-through device see the same bytes; a
//! shrink removes memory from both (a DMA to a removed page is a typed IOMMU fault, the
//! host frames are free); a regrow brings fresh zeroed memory back to both; random
//! sequences of grow, shrink and accesses from either side agree with a model.

use crate::*;
use gmem_core::{AllocError, FaultError, Gmem, PhysAddr, Prot, SingleCpu, VirtAddr, PAGE_SIZE};
use gmem_host_cpu::{HostCpu, HostCpuConfig};
use gmem_iommu::{DmaError, DmaFault, InvalidationLatency, Iommu, IommuConfig};
use gmem_sim::{AccessError, Miss};
use std::collections::BTreeMap;
use std::sync::Arc;

const CPU_TABLES: u64 = 256;
const EPT_TABLES: u64 = 256;

struct Host {
    cpu: HostCpu,
    gm: Gmem,
}

/// 64 MiB of host memory: the CPU's tables, the EPT's tables, then memory the core
/// manages (guest memory comes from there).
fn host() -> Host {
    let cpu = HostCpu::new(HostCpuConfig {
        memory_bytes: 64 << 20,
        table_frames: CPU_TABLES,
        ..HostCpuConfig::default()
    })
    .unwrap();
    let gm = Gmem::new(Arc::new(SingleCpu), cpu.device_desc()).unwrap();
    cpu.port().bind(gm.host()).unwrap();
    cpu.memory_map()
        .add(gm.host(), cpu.memory().clone())
        .unwrap();
    let managed = cpu.memory().base().as_u64() + (CPU_TABLES + EPT_TABLES) * PAGE_SIZE;
    gm.dev_register_physmem(gm.host(), PhysAddr::new(managed), cpu.memory().end())
        .unwrap();
    Host { cpu, gm }
}

fn vm(h: &Host) -> Vm {
    let pool = PhysAddr::new(h.cpu.memory().base().as_u64() + CPU_TABLES * PAGE_SIZE);
    Vm::new(
        &h.gm,
        h.cpu.memory().clone(),
        h.cpu.memory_map().clone(),
        VmConfig::new(2, (pool, EPT_TABLES)),
    )
    .unwrap()
}

fn iommu(h: &Host) -> Iommu {
    let config = IommuConfig {
        latency: InvalidationLatency::accounted(2000),
        ..IommuConfig::default()
    };
    Iommu::new(config, h.cpu.memory_map().clone()).unwrap()
}

fn pattern(seed: u64, len: usize) -> Vec<u8> {
    (0..len as u64)
        .map(|i| (i.wrapping_mul(31) ^ seed.wrapping_mul(0x9e37)) as u8)
        .collect()
}

#[test]
fn the_guest_cpu_and_the_passthrough_device_see_the_same_bytes() {
    let h = host();
    let mut vm = vm(&h);
    let io = iommu(&h);
    vm.attach_passthrough(&h.gm, &io, "nic").unwrap();
    vm.grow(&h.gm, 1 << 20, 256 << 10).unwrap();
    // The guest writes across a page boundary on vCPU 1; the device reads it.
    let data = pattern(1, 10_000);
    vm.guest_write(&h.gm, 1, (1 << 20) + 0x0ff0, &data).unwrap();
    let mut got = vec![0u8; data.len()];
    vm.dma_read(0, (1 << 20) + 0x0ff0, &mut got).unwrap();
    assert_eq!(got, data);
    // The device writes; both vCPUs read it.
    let data = pattern(2, 5000);
    vm.dma_write(0, (1 << 20) + 0x3_0000, &data).unwrap();
    for vcpu in 0..2 {
        let mut got = vec![0u8; data.len()];
        vm.guest_read(&h.gm, vcpu, (1 << 20) + 0x3_0000, &mut got)
            .unwrap();
        assert_eq!(got, data, "vCPU {vcpu}");
    }
    // The device never faulted: its slot was wired and mapped when it grew.
    let dev = vm.passthrough().unwrap();
    assert_eq!(dev.stats().faults, 0);
    assert_eq!(h.gm.dev_frames(h.gm.host()).unwrap().wired, 64);
}

#[test]
fn after_a_shrink_a_dma_to_a_removed_page_is_an_iommu_fault_and_after_regrow_it_succeeds() {
    let h = host();
    let mut vm = vm(&h);
    let io = iommu(&h);
    vm.attach_passthrough(&h.gm, &io, "nic").unwrap();
    let before = h.gm.dev_frames(h.gm.host()).unwrap();
    vm.grow(&h.gm, 0, 64 << 10).unwrap();
    let gpa = 0x5000;
    // Both translations are cached before the shrink.
    vm.dma_write(0, gpa, b"old secret").unwrap();
    let mut b = [0u8; 10];
    vm.guest_read(&h.gm, 0, gpa, &mut b).unwrap();
    assert_eq!(&b, b"old secret");
    assert!(vm
        .passthrough()
        .unwrap()
        .mmu()
        .cached(0, VirtAddr::new(gpa)));

    vm.shrink(&h.gm, 0).unwrap();
    assert_eq!(
        vm.dma_write(0, gpa, b"late"),
        Err(DmaError::Fault(DmaFault {
            va: VirtAddr::new(gpa),
            access: Prot::WRITE,
            miss: Miss::NotPresent
        }))
    );
    assert!(matches!(
        vm.guest_read(&h.gm, 0, gpa, &mut b),
        Err(AccessError::Fault {
            error: FaultError::NotAllocated(_),
            ..
        })
    ));
    // Every host frame of the slot is free again; both tables hold nothing.
    assert_eq!(h.gm.dev_frames(h.gm.host()).unwrap(), before);
    assert!(vm
        .ept_tables()
        .leaves(vm.ept().active_root().unwrap())
        .is_empty());
    assert_eq!(io.table_stats().memory.in_use, 1, "IOMMU tables reclaimed");

    vm.grow(&h.gm, 0, 64 << 10).unwrap();
    let mut got = [0xffu8; 10];
    vm.dma_read(0, gpa, &mut got).unwrap();
    assert_eq!(
        got, [0; 10],
        "fresh memory: nothing of the old slot is visible"
    );
    vm.dma_write(0, gpa, b"new packet").unwrap();
    vm.guest_read(&h.gm, 1, gpa, &mut b).unwrap();
    assert_eq!(&b, b"new packet");
    let s = vm.stats(&h.gm);
    assert_eq!((s.grows, s.shrinks, s.guest_bytes), (2, 1, 64 << 10));
}

#[test]
fn memory_grown_before_the_device_attached_is_wired_and_mapped_when_it_attaches() {
    let h = host();
    let mut vm = vm(&h);
    vm.grow(&h.gm, 2 << 20, 32 << 10).unwrap();
    vm.guest_write(&h.gm, 0, (2 << 20) + 8, b"boot").unwrap();
    assert_eq!(
        h.gm.dev_frames(h.gm.host()).unwrap().wired,
        0,
        "faulted, not wired"
    );
    assert!(matches!(
        vm.dma_read(0, 2 << 20, &mut [0u8; 4]),
        Err(DmaError::Fault(DmaFault {
            miss: Miss::Inactive,
            ..
        }))
    ));
    let io = iommu(&h);
    vm.attach_passthrough(&h.gm, &io, "nic").unwrap();
    assert_eq!(h.gm.dev_frames(h.gm.host()).unwrap().wired, 8);
    let mut b = [0u8; 4];
    vm.dma_read(0, (2 << 20) + 8, &mut b).unwrap();
    assert_eq!(&b, b"boot");
    assert_eq!(
        vm.attach_passthrough(&h.gm, &io, "second").err(),
        Some(KvmError::PassthroughAttached)
    );
}

#[test]
fn a_passthrough_attach_that_cannot_wire_every_slot_leaves_no_device_and_nothing_wired() {
    let h = host();
    let mut vm = vm(&h);
    let io = iommu(&h);
    // Two 40 MiB slots in 62 MiB of managed host memory: the first wires, the second
    // cannot.
    vm.grow(&h.gm, 0, 40 << 20).unwrap();
    vm.grow(&h.gm, 64 << 20, 40 << 20).unwrap();
    let err = vm.attach_passthrough(&h.gm, &io, "nic").unwrap_err();
    assert!(matches!(err, KvmError::Wire(_)), "{err:?}");
    assert!(vm.passthrough().is_none());
    assert_eq!(h.gm.dev_frames(h.gm.host()).unwrap().wired, 0);
    h.gm.check_invariants(vm.space()).unwrap();
    // With the second slot gone the same attach succeeds, and wires what is left.
    vm.shrink(&h.gm, 64 << 20).unwrap();
    vm.attach_passthrough(&h.gm, &io, "nic").unwrap();
    assert_eq!(
        h.gm.dev_frames(h.gm.host()).unwrap().wired,
        (40 << 20) / PAGE_SIZE
    );
}

#[test]
fn slots_that_overlap_or_leave_the_space_are_refused_and_change_nothing() {
    let h = host();
    let mut vm = vm(&h);
    vm.grow(&h.gm, 1 << 20, 1 << 20).unwrap();
    assert!(matches!(
        vm.grow(&h.gm, (1 << 20) + (512 << 10), 1 << 20),
        Err(KvmError::SlotUnavailable { .. })
    ));
    assert!(matches!(
        vm.grow(&h.gm, (64 << 30) - PAGE_SIZE, 2 * PAGE_SIZE),
        Err(KvmError::SlotUnavailable { .. })
    ));
    assert!(matches!(
        vm.grow(&h.gm, 0x800, PAGE_SIZE),
        Err(KvmError::SlotUnavailable {
            error: AllocError::BadArgument(_),
            ..
        })
    ));
    assert_eq!(vm.shrink(&h.gm, 0), Err(KvmError::NoSlot { gpa: 0 }));
    assert_eq!(vm.slots(&h.gm), vec![(1 << 20, 1 << 20)]);
}

struct Rng(u64);
impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n
    }
}

#[test]
fn random_grow_shrink_and_accesses_from_both_sides_agree_with_a_model() {
    const SLOT: u64 = 16 * PAGE_SIZE;
    let h = host();
    let mut vm = vm(&h);
    let io = iommu(&h);
    vm.attach_passthrough(&h.gm, &io, "nic").unwrap();
    // Slot k lives at k MiB; the model holds the bytes of the present slots.
    let mut model: BTreeMap<u64, Vec<u8>> = BTreeMap::new();
    let mut rng = Rng(0xc0ffee);
    let (mut dma_faults, mut cpu_faults) = (0, 0);
    for step in 0..3000u64 {
        let k = rng.below(4);
        let gpa = k << 20;
        let off = rng.below(SLOT - 64);
        let len = 1 + rng.below(64) as usize;
        match rng.below(10) {
            0 => {
                if model.remove(&gpa).is_some() {
                    vm.shrink(&h.gm, gpa).unwrap();
                } else {
                    vm.grow(&h.gm, gpa, SLOT).unwrap();
                    model.insert(gpa, vec![0; SLOT as usize]);
                }
            }
            1..=3 => {
                let data = pattern(step, len);
                let r = if rng.below(2) == 0 {
                    vm.dma_write(rng.below(2) as usize, gpa + off, &data)
                        .map_err(|_| ())
                } else {
                    vm.guest_write(&h.gm, rng.below(2) as usize, gpa + off, &data)
                        .map_err(|_| ())
                };
                match model.get_mut(&gpa) {
                    Some(m) => {
                        r.unwrap();
                        m[off as usize..off as usize + len].copy_from_slice(&data);
                    }
                    None => assert!(r.is_err(), "step {step}: write to an absent slot"),
                }
            }
            _ => {
                let mut got = vec![0u8; len];
                let by_dma = rng.below(2) == 0;
                let r = if by_dma {
                    vm.dma_read(0, gpa + off, &mut got).map_err(|e| {
                        assert!(matches!(e, DmaError::Fault(_)), "{e:?}");
                    })
                } else {
                    vm.guest_read(&h.gm, 1, gpa + off, &mut got).map_err(|e| {
                        assert!(matches!(e, AccessError::Fault { .. }), "{e:?}");
                    })
                };
                match model.get(&gpa) {
                    Some(m) => {
                        r.unwrap();
                        assert_eq!(got, m[off as usize..off as usize + len], "step {step}");
                    }
                    None => {
                        assert!(r.is_err(), "step {step}: read of an absent slot");
                        if by_dma {
                            dma_faults += 1;
                        } else {
                            cpu_faults += 1;
                        }
                    }
                }
            }
        }
    }
    assert!(dma_faults > 0 && cpu_faults > 0);
    assert!(vm.stats(&h.gm).shrinks > 10);
    // The core's view is intact after all of it.
    assert_eq!(
        h.gm.dev_frames(h.gm.host()).unwrap().wired,
        model.len() as u64 * 16
    );
}
