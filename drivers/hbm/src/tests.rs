//! The decode's group tiling, the granularity bit being really used, traffic
//! accounting, and the core placing coarse pages in their stacks through page groups
//! and frame requests (bytes verified through both views).

use crate::attrs::CodaAttrs;
use crate::config::HbmConfig;
use crate::decode::{decode, Granularity};
use crate::memory::{HbmMemory, Requester};
use gmem_core::testing::{EventLog, TableStore, TestMmu, TestSystem};
use gmem_core::*;
use std::collections::HashSet;
use std::sync::Arc;
use std::vec;
use std::vec::Vec;

fn cfg() -> HbmConfig {
    HbmConfig {
        stack_bytes: 1 << 20,
        ..HbmConfig::default()
    }
}

#[test]
fn both_modes_tile_each_page_group_onto_one_window_of_every_stack() {
    let c = cfg();
    for g in [0u64, 1, 7, 255] {
        for mode in [Granularity::Fine, Granularity::Coarse] {
            let mut seen = HashSet::new();
            for b in (0..c.group_bytes()).step_by(64) {
                let pa = PhysAddr::new(c.base.as_u64() + g * c.group_bytes() + b);
                let l = decode(&c, pa, mode).unwrap();
                assert!(
                    (g * PAGE_SIZE..(g + 1) * PAGE_SIZE).contains(&l.offset),
                    "{mode:?} group {g}: {l:?} outside the group's window"
                );
                assert!(
                    seen.insert((l.stack, l.offset)),
                    "{mode:?}: two bytes share {l:?}"
                );
            }
            assert_eq!(seen.len() as u64, c.group_bytes() / 64);
        }
    }
    // Fine grain: one page spreads over every stack in 128-byte chunks; coarse: one stack.
    let page = PhysAddr::new(c.base.as_u64() + 2 * PAGE_SIZE);
    let stacks = |mode| {
        (0..PAGE_SIZE)
            .step_by(128)
            .map(|o| {
                decode(&c, PhysAddr::new(page.as_u64() + o), mode)
                    .unwrap()
                    .stack
            })
            .collect::<HashSet<_>>()
    };
    assert_eq!(stacks(Granularity::Fine).len(), 4);
    assert_eq!(stacks(Granularity::Coarse), HashSet::from([2]));
    assert_eq!(decode(&c, c.end(), Granularity::Fine), None);
}

#[test]
fn the_granularity_bit_decides_where_the_bytes_are_and_traffic_follows_it() {
    let m = HbmMemory::new(cfg()).unwrap();
    let c = *m.config();
    let pa = PhysAddr::new(c.base.as_u64() + 5 * PAGE_SIZE);
    let data: Vec<u8> = (0..PAGE_SIZE).map(|i| (i * 7 % 251) as u8).collect();
    m.store(Requester::Host, pa, Granularity::Coarse, &data)
        .unwrap();
    let mut back = vec![0u8; PAGE_SIZE as usize];
    m.load(Requester::Sm(4), pa, Granularity::Coarse, &mut back)
        .unwrap();
    assert_eq!(back, data);
    m.load(Requester::Sm(4), pa, Granularity::Fine, &mut back)
        .unwrap();
    assert_ne!(
        back, data,
        "the same address under the other bit reads other bytes"
    );
    let t = m.traffic();
    assert_eq!(t.host, PAGE_SIZE);
    // Page 5 is coarse in stack 1 = SM 4's stack: local. Fine: a quarter local.
    assert_eq!(t.local, PAGE_SIZE + PAGE_SIZE / 4);
    assert_eq!(t.remote, 3 * PAGE_SIZE / 4);
    assert!((t.remote_fraction() - 0.375).abs() < 1e-9);
    assert!(m
        .load(Requester::Host, c.end(), Granularity::Fine, &mut back[..1])
        .is_err());
}

/// A core with a test host and the HBM device (a test MMU, memory in page groups).
fn system() -> (TestSystem, SpaceId, DeviceId, Arc<HbmMemory>) {
    system_with(cfg())
}

fn system_with(cfg: HbmConfig) -> (TestSystem, SpaceId, DeviceId, Arc<HbmMemory>) {
    let s = TestSystem::new(256);
    let space =
        s.gm.as_create(
            VirtAddr::new(1 << 32),
            VirtAddr::new(2 << 32),
            AllocPolicy::empty(),
        )
        .unwrap();
    s.gm.as_attach(space, s.host().id, MmuMode::Coherent, Activation::Switch)
        .unwrap();
    let mem = Arc::new(HbmMemory::new(cfg).unwrap());
    let log: EventLog = EventLog::default();
    let mmu = Arc::new(TestMmu::new(9, 9, TableStore::new(), log));
    let c = *mem.config();
    let dev =
        s.gm.dev_create(DeviceDesc {
            name: "hbm".into(),
            mmu,
            memory: Some(mem.clone()),
            caps: DevCaps::FAULTABLE,
            data: None,
        })
        .unwrap();
    s.gm.dev_register_physmem(dev, c.base, c.end()).unwrap();
    s.gm.dev_set_page_groups(dev, Some(c.group_order()))
        .unwrap();
    (s, space, dev, mem)
}

#[test]
fn the_core_puts_each_coarse_page_in_its_chunks_stack_and_groups_stay_uniform() {
    let (s, space, dev, mem) = system();
    let c = *mem.config();
    // An object of 16 pages, each thread block touching 8 KiB: chunks of two pages.
    let chunk = 2 * PAGE_SIZE;
    let req = AllocRequest {
        align: chunk * u64::from(c.stacks),
        ..AllocRequest::new(16 * PAGE_SIZE)
    };
    let r = s.gm.as_alloc(space, req).unwrap();
    s.gm.region_set_zero_fill_block(r, PAGE_SIZE).unwrap();
    s.gm.region_set_attrs(
        r,
        CodaAttrs::coarse(r.start.as_u64(), chunk, c.stacks).encode(),
    )
    .unwrap();
    // A fine-grain object beside it.
    let f =
        s.gm.as_alloc(space, AllocRequest::new(4 * PAGE_SIZE))
            .unwrap();
    let on_hbm = Placement {
        target: PlacementTarget::Device(dev),
        mode: PlacementMode::Unique,
    };
    for region in [r, f] {
        s.gm.region_set_policy(region, on_hbm).unwrap();
    }
    // The host's first touch places the pages (its fault), then writes them through
    // the core's view of the memory (the page's group decides the decode).
    let host = s.host().id;
    let touch = |va: VirtAddr, byte: u8| {
        let placed = s.gm.dev_fault(host, va, Prot::WRITE).unwrap();
        assert_eq!(
            placed.pages, 1,
            "one page per fault (4 KiB zero-fill blocks)"
        );
        let (_, pa) = s.gm.as_page_frame(space, va).unwrap().unwrap();
        mem.write(pa, &[byte; 64]).unwrap();
    };
    for k in 0..16u64 {
        touch(VirtAddr::new(r.start.as_u64() + k * PAGE_SIZE), k as u8 + 1);
    }
    for k in 0..4u64 {
        touch(
            VirtAddr::new(f.start.as_u64() + k * PAGE_SIZE),
            0xf0 | k as u8,
        );
    }
    s.gm.check_invariants(space).unwrap();
    for k in 0..16u64 {
        let va = VirtAddr::new(r.start.as_u64() + k * PAGE_SIZE);
        let (d, pa) = s.gm.as_page_frame(space, va).unwrap().unwrap();
        assert_eq!(d, dev);
        assert_eq!(mem.granularity(pa), Some(Granularity::Coarse));
        let want = CodaAttrs::coarse(r.start.as_u64(), chunk, c.stacks)
            .stack_of(va.as_u64(), c.stacks)
            .unwrap();
        assert_eq!(
            decode(&c, pa, Granularity::Coarse).unwrap().stack,
            want,
            "page {k}"
        );
        // The hardware view with the right bit sees the bytes the core wrote.
        let mut b = [0u8; 64];
        mem.load(
            Requester::Sm(want * c.sms_per_stack),
            pa,
            Granularity::Coarse,
            &mut b,
        )
        .unwrap();
        assert_eq!(b, [k as u8 + 1; 64]);
    }
    for k in 0..4u64 {
        let va = VirtAddr::new(f.start.as_u64() + k * PAGE_SIZE);
        let (_, pa) = s.gm.as_page_frame(space, va).unwrap().unwrap();
        assert_eq!(mem.granularity(pa), Some(Granularity::Fine));
        let mut b = [0u8; 64];
        mem.load(Requester::Host, pa, Granularity::Fine, &mut b)
            .unwrap();
        assert_eq!(b, [0xf0 | k as u8; 64]);
    }
    assert_eq!(mem.traffic().remote, 0, "each SM read its own stack");
    // Every group that holds a page is of one class (the core's page groups).
    let groups = s.gm.dev_page_groups(dev).unwrap().unwrap();
    assert!(groups.groups > 0);
}

#[test]
fn a_coarse_page_whose_stack_is_full_goes_fine_grain_and_is_counted() {
    // Eight page groups: one slot per group in each stack.
    let (s, space, dev, mem) = system_with(HbmConfig {
        stack_bytes: 8 * PAGE_SIZE,
        ..cfg()
    });
    let c = *mem.config();
    let host = s.host().id;
    let on_hbm = Placement {
        target: PlacementTarget::Device(dev),
        mode: PlacementMode::Unique,
    };
    let fault = |va: VirtAddr| {
        let placed = s.gm.dev_fault(host, va, Prot::WRITE).unwrap();
        assert_eq!(placed.pages, 1);
        let (_, pa) = s.gm.as_page_frame(space, va).unwrap().unwrap();
        let g = mem.granularity(pa).unwrap();
        (g, decode(&c, pa, g).unwrap().stack)
    };
    // Three fine-grain pages make one group fine (one of its frames stays free).
    let f =
        s.gm.as_alloc(space, AllocRequest::new(3 * PAGE_SIZE))
            .unwrap();
    s.gm.region_set_zero_fill_block(f, PAGE_SIZE).unwrap();
    s.gm.region_set_policy(f, on_hbm).unwrap();
    for k in 0..3 {
        let (g, _) = fault(VirtAddr::new(f.start.as_u64() + k * PAGE_SIZE));
        assert_eq!(g, Granularity::Fine);
    }
    // One-page chunks: page k belongs to stack k mod 4; every fourth page wants stack 1.
    let r =
        s.gm.as_alloc(
            space,
            AllocRequest {
                align: c.group_bytes(),
                ..AllocRequest::new(32 * PAGE_SIZE)
            },
        )
        .unwrap();
    s.gm.region_set_zero_fill_block(r, PAGE_SIZE).unwrap();
    s.gm.region_set_attrs(
        r,
        CodaAttrs::coarse(r.start.as_u64(), PAGE_SIZE, c.stacks).encode(),
    )
    .unwrap();
    s.gm.region_set_policy(r, on_hbm).unwrap();
    // The other seven groups turn coarse, one stack-1 slot each; the eighth page finds
    // none and takes the fine group's free frame.
    for n in 0..8u64 {
        let (g, stack) = fault(VirtAddr::new(r.start.as_u64() + (1 + 4 * n) * PAGE_SIZE));
        if n < 7 {
            assert_eq!((g, stack), (Granularity::Coarse, 1), "page {n}");
        } else {
            assert_eq!(g, Granularity::Fine, "no coarse slot of stack 1 was free");
        }
    }
    assert_eq!(s.gm.stats().placement_fallbacks, 1);
    s.gm.check_invariants(space).unwrap();
}

#[test]
fn the_sms_route_each_access_by_the_bit_their_translation_carries() {
    use crate::mmu::{granularity_of, HbmTables};
    use gmem_sim::{HierarchyConfig, Replacement, SimMemory, SimMmu, TlbConfig, Translator};
    let c = cfg();
    let mem = Arc::new(HbmMemory::new(c).unwrap());
    let host_mem = Arc::new(SimMemory::new("tables", PhysAddr::new(0), 4 << 20).unwrap());
    let tables = Arc::new(HbmTables::new(host_mem, PhysAddr::new(0), 256, mem.clone()).unwrap());
    let tlbs = HierarchyConfig {
        units: c.sms() as usize,
        l1: TlbConfig::new(4, 4, Replacement::Lru),
        l2: Some(TlbConfig::new(16, 8, Replacement::Lru)),
        walk_cache: None,
    };
    let mmu = Arc::new(SimMmu::new(tables, tlbs).unwrap());
    let s = TestSystem::new(64);
    let space =
        s.gm.as_create(
            VirtAddr::new(1 << 32),
            VirtAddr::new(2 << 32),
            AllocPolicy::empty(),
        )
        .unwrap();
    let dev =
        s.gm.dev_create(DeviceDesc {
            name: "hbm-sms".into(),
            mmu: mmu.clone(),
            memory: Some(mem.clone()),
            caps: DevCaps::FAULTABLE,
            data: None,
        })
        .unwrap();
    s.gm.dev_register_physmem(dev, c.base, c.end()).unwrap();
    s.gm.dev_set_page_groups(dev, Some(c.group_order()))
        .unwrap();
    s.gm.as_attach(space, dev, MmuMode::Coherent, Activation::Switch)
        .unwrap();
    let coarse =
        s.gm.as_alloc(
            space,
            AllocRequest {
                align: c.group_bytes(),
                ..AllocRequest::new(8 * PAGE_SIZE)
            },
        )
        .unwrap();
    s.gm.region_set_zero_fill_block(coarse, PAGE_SIZE).unwrap();
    s.gm.region_set_attrs(
        coarse,
        CodaAttrs::coarse(coarse.start.as_u64(), PAGE_SIZE, c.stacks).encode(),
    )
    .unwrap();
    let fine =
        s.gm.as_alloc(space, AllocRequest::new(2 * PAGE_SIZE))
            .unwrap();
    // SM `k` touches page `k` of the coarse object (the page of its stack) and the fine
    // object's first page; every access faults once, then translates.
    for (region, pages, want) in [
        (coarse, 8, Granularity::Coarse),
        (fine, 2, Granularity::Fine),
    ] {
        for k in 0..pages {
            let sm = (k * u64::from(c.sms_per_stack)) as u32 % c.sms();
            let va = VirtAddr::new(region.start.as_u64() + k * PAGE_SIZE);
            let leaf = match mmu.translate(sm as usize, va, Prot::WRITE) {
                Ok(l) => l,
                Err(_) => {
                    let placed = s.gm.dev_fault(dev, va, Prot::WRITE).unwrap();
                    assert_eq!(placed.pages, 1);
                    mmu.translate(sm as usize, va, Prot::WRITE).unwrap()
                }
            };
            let g = granularity_of(leaf.bits);
            assert_eq!(g, want, "page {k}: the translation carries the page's mode");
            let pa = leaf.translate(va);
            // A whole page of distinct bytes (the first chunk of a group's first frame
            // decodes alike in both modes; the rest does not).
            let data: Vec<u8> = (0..PAGE_SIZE).map(|i| (i * 31 + k * 7) as u8).collect();
            mem.store(Requester::Sm(sm), pa, g, &data).unwrap();
            // The core's view (by the page's group) sees the same bytes...
            let mut back = vec![0u8; PAGE_SIZE as usize];
            mem.read(pa, &mut back).unwrap();
            assert_eq!(back, data);
            // ...and the wrong bit would not.
            let other = match g {
                Granularity::Fine => Granularity::Coarse,
                Granularity::Coarse => Granularity::Fine,
            };
            mem.load(Requester::Host, pa, other, &mut back).unwrap();
            assert_ne!(back, data, "page {k}: the bit is really used");
        }
    }
    // Each SM's coarse page was in its own stack: no remote traffic from the coarse
    // object; the fine one spread (remote for three quarters of its chunks).
    assert!(mem.traffic().local >= 8 * PAGE_SIZE);
    s.gm.check_invariants(space).unwrap();
}
