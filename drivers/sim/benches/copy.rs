//! Device copies (issue 9, item 8): the core's migration bandwidth against a `memcpy` of
//! the same bytes, and its bulk zeroing against a `memset` of the same run.
//!
//! The machine: gmem-core with a host (test MMU, a [`SimMemory`] of DRAM) and a device
//! (test MMU, video memory behind a [`DmaEngine`]), one address space, an 8 MiB region
//! whose pages hold distinct bytes. One iteration of `migrate_8m` moves the region to
//! the device and back (`region_migrate` twice: 16 MiB copied, every unmap, TLB
//! invalidation, frame allocation and bookkeeping included); `memcpy_8m` copies two 8 MiB
//! buffers into each other (16 MiB). `zero_fill_2m` is one device fault that zero-fills
//! a 2 MiB block on the device (frame run allocation, one `DeviceMemory::zero` of 512
//! frames, the logical page table, the map; freeing the region is outside the timing);
//! `memset_2m` fills a 2 MiB buffer with zeros.
//!
//! Caveat printed with the figures: a [`SimMemory`] keeps zero pages sparsely, so its
//! zeroing releases page storage instead of writing zeros (a copy of a page is a real
//! 4 KiB copy). After the benches the region's bytes are checked against the pattern.

use criterion::{criterion_group, criterion_main, BatchSize, Criterion, Throughput};
use gmem_core::testing::{EventLog, TableStore, TestMmu};
use gmem_core::{
    Activation, AllocPolicy, AllocRequest, DevCaps, DeviceDesc, DeviceId, Gmem, MapFlags,
    MigrateScope, MmuMode, PhysAddr, Prot, Region, SingleCpu, SpaceId, VirtAddr, PAGE_SIZE,
};
use gmem_sim::{DmaEngine, SimMemory};
use std::hint::black_box;
use std::sync::Arc;

const HOST: u64 = 0x1000_0000;
const VRAM: u64 = 0x8000_0000;
const BYTES: u64 = 8 << 20;
const BLOCK: u64 = 2 << 20;

struct Rig {
    gm: Gmem,
    host_mmu: Arc<TestMmu>,
    host_mem: Arc<SimMemory>,
    vram: Arc<SimMemory>,
    gpu: DeviceId,
    space: SpaceId,
    region: Region,
}

fn page_bytes(p: u64) -> Vec<u8> {
    (0..PAGE_SIZE)
        .map(|i| (i as u8).wrapping_mul(7) ^ (p as u8).wrapping_add(1))
        .collect()
}

fn rig() -> Rig {
    let log: EventLog = Arc::new(gmem_core::sync::Mutex::new(Vec::new()));
    let host_mmu = Arc::new(TestMmu::new(0, 1, TableStore::new(), log.clone()).without_log());
    let host_mem = Arc::new(SimMemory::new("dram", PhysAddr::new(HOST), 4 * BYTES).unwrap());
    let gm = Gmem::new(
        Arc::new(SingleCpu),
        DeviceDesc {
            name: "cpu".into(),
            mmu: host_mmu.clone(),
            memory: Some(host_mem.clone()),
            caps: DevCaps::FAULTABLE,
            data: None,
        },
    )
    .unwrap();
    gm.dev_register_physmem(
        gm.host(),
        PhysAddr::new(HOST),
        PhysAddr::new(HOST + 4 * BYTES),
    )
    .unwrap();
    let vram = Arc::new(SimMemory::new("vram", PhysAddr::new(VRAM), 4 * BYTES).unwrap());
    let gpu = gm
        .dev_create(DeviceDesc {
            name: "gpu".into(),
            mmu: Arc::new(TestMmu::new(1, 7, TableStore::new(), log).without_log()),
            memory: Some(Arc::new(DmaEngine::new(vram.clone()))),
            caps: DevCaps::FAULTABLE,
            data: None,
        })
        .unwrap();
    gm.dev_register_physmem(gpu, PhysAddr::new(VRAM), PhysAddr::new(VRAM + 4 * BYTES))
        .unwrap();
    let space = gm
        .as_create(
            VirtAddr::new(1 << 30),
            VirtAddr::new(2 << 30),
            AllocPolicy::empty(),
        )
        .unwrap();
    for d in [gm.host(), gpu] {
        gm.as_attach(space, d, MmuMode::Coherent, Activation::Switch)
            .unwrap();
    }
    let region = gm.as_alloc(space, AllocRequest::new(BYTES)).unwrap();
    let rig = Rig {
        gm,
        host_mmu,
        host_mem,
        vram,
        gpu,
        space,
        region,
    };
    // Fault every page in on the host and give it distinct bytes.
    for (p, pfn) in rig.host_frames().into_iter().enumerate() {
        rig.host_mem
            .write(PhysAddr::new(pfn * PAGE_SIZE), &page_bytes(p as u64))
            .unwrap();
    }
    rig
}

impl Rig {
    /// Map every page of the region on the host (faulting) and return its frames.
    fn host_frames(&self) -> Vec<u64> {
        let pages = BYTES / PAGE_SIZE;
        for p in 0..pages {
            let va = VirtAddr::new(self.region.start.as_u64() + p * PAGE_SIZE);
            let _retry = self.gm.dev_fault(self.gm.host(), va, Prot::WRITE).unwrap();
        }
        let root = self.host_mmu.active_root().unwrap();
        (0..pages)
            .map(|p| {
                let vpn = (self.region.start.as_u64() >> 12) + p;
                self.host_mmu.store().lookup(root, vpn).unwrap().pfn
            })
            .collect()
    }

    fn round_trip(&self) {
        let to_gpu = self
            .gm
            .region_migrate(self.region, self.gpu, MigrateScope::Populated)
            .unwrap();
        let back = self
            .gm
            .region_migrate(self.region, self.gm.host(), MigrateScope::Populated)
            .unwrap();
        assert_eq!((to_gpu, back), (BYTES / PAGE_SIZE, BYTES / PAGE_SIZE));
    }

    /// Every page still holds its bytes (read back from host memory).
    fn verify(&self) {
        self.gm
            .region_migrate(self.region, self.gm.host(), MigrateScope::Populated)
            .unwrap();
        for (p, pfn) in self.host_frames().into_iter().enumerate() {
            let mut b = vec![0u8; PAGE_SIZE as usize];
            self.host_mem
                .read(PhysAddr::new(pfn * PAGE_SIZE), &mut b)
                .unwrap();
            assert!(b == page_bytes(p as u64), "page {p} lost its bytes");
        }
        self.gm.check_invariants(self.space).unwrap();
    }
}

fn migration(c: &mut Criterion) {
    let rig = rig();
    rig.verify();
    let s = rig.gm.stats();
    rig.round_trip();
    let d = rig.gm.stats();
    println!(
        "one round trip: {} MiB host->dev, {} MiB dev->host, {} unmaps, {} invalidations",
        (d.bytes_host_to_dev - s.bytes_host_to_dev) >> 20,
        (d.bytes_dev_to_host - s.bytes_dev_to_host) >> 20,
        d.mmu_unmaps - s.mmu_unmaps,
        d.invalidations - s.invalidations
    );
    let mut g = c.benchmark_group("copy");
    g.sample_size(20);
    g.throughput(Throughput::Bytes(2 * BYTES));
    g.bench_function("migrate_8m", |b| b.iter(|| rig.round_trip()));
    let mut a = vec![1u8; BYTES as usize];
    let mut z = vec![2u8; BYTES as usize];
    g.bench_function("memcpy_8m", |b| {
        b.iter(|| {
            z.copy_from_slice(black_box(&a));
            a.copy_from_slice(black_box(&z));
        })
    });
    g.finish();
    println!(
        "pages holding storage after the runs: dram {}, vram {} (the region is {})",
        rig.host_mem.stats().resident_pages,
        rig.vram.stats().resident_pages,
        BYTES / PAGE_SIZE
    );
    rig.verify();
}

fn zeroing(c: &mut Criterion) {
    let rig = rig();
    rig.gm
        .region_dealloc(rig.region, MapFlags::empty(), None)
        .unwrap();
    let mut g = c.benchmark_group("zero");
    g.sample_size(20);
    g.throughput(Throughput::Bytes(BLOCK));
    let req = AllocRequest {
        align: BLOCK,
        ..AllocRequest::new(BLOCK)
    };
    // The region of the previous iteration is freed in the next one's (untimed) setup.
    let prev = std::cell::Cell::new(None::<Region>);
    g.bench_function("zero_fill_2m", |b| {
        b.iter_batched(
            || {
                if let Some(p) = prev.take() {
                    rig.gm.region_dealloc(p, MapFlags::empty(), None).unwrap();
                }
                let r = rig.gm.as_alloc(rig.space, req).unwrap();
                rig.gm.region_set_zero_fill_block(r, BLOCK).unwrap();
                r
            },
            |r| {
                let res = rig.gm.dev_fault(rig.gpu, r.start, Prot::WRITE).unwrap();
                assert_eq!(res.pages, BLOCK / PAGE_SIZE);
                prev.set(Some(r));
            },
            BatchSize::PerIteration,
        )
    });
    let mut buf = vec![1u8; BLOCK as usize];
    g.bench_function("memset_2m", |b| {
        b.iter(|| {
            black_box(&mut buf).fill(0);
        })
    });
    g.finish();
}

criterion_group!(benches, migration, zeroing);
criterion_main!(benches);
