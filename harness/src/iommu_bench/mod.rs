//! `reproduce iommu` — GMEM's Table 3 (BUS_DMA) on simulated hardware: NIC-style DMA
//! churn through the IOMMU driver, every GMEM variant against the giant-lock baseline,
//! in the same run.
//!
//! ## The workload
//! A NIC's receive path, one thread per receive queue. Each queue keeps a ring of
//! [`RING`] buffers posted (mapped for DMA), as a NIC keeps its RX ring full. Per
//! packet:
//! 1. the device writes the packet (`PACKET_BYTES` bytes, unique per queue and
//!    sequence number) into the oldest posted buffer: every 4 KiB piece is translated
//!    by the IOMMU (IOTLB, walk on a miss) and the bytes land in host memory;
//! 2. the driver checks the bytes that landed in the buffer's frame against what was
//!    sent (**every DMA is verified**);
//! 3. the driver unmaps the buffer — strict: the IOTLB invalidation has completed when
//!    the unmap returns; asynchronous: the invalidation is queued and coalesced with
//!    the space's other queued unmaps (the core's batch limit, 64), and the buffer may be
//!    reused only after the completion callback;
//! 4. the driver posts a fresh buffer (a new mapping: IOVA allocation + table edits).
//!
//! ## The variants (Table 3's columns)
//! | row | allocator | page table | unmap |
//! |---|---|---|---|
//! | baseline | FreeBSD's GAS: augmented tree, first fit with guard pages, under the domain lock; busdma maps | locked (one lock per table: `DMAR_DOMAIN_PGLOCK`) | strict, the wait under the unit lock (`dmar_qi_invalidate_sync`) |
//! | GM-V | the core's vmem arena (quantum caches, per-CPU magazines) | locked | strict |
//! | GM-V-CAS | vmem | lock-free (CAS), no table reclamation | strict |
//! | GM-V-RW | vmem | reader-writer, table reclamation | strict |
//! | GM-V-CAS-A | vmem | CAS | async, coalesced |
//! | GM-V-RW-A | vmem | RW | async, coalesced |
//!
//! All run on the same simulated hardware: x86-64 tables in the IOMMU's table memory,
//! the IOTLB of `gmem_iommu::iotlb`, and an invalidation whose latency `--inval-ns` is
//! **busy-waited** by the CPU that issued it (see `gmem_iommu::mmu`).
//!
//! ## What is measured
//! Packets per second = packets of all queues / wall time of the packet loops (from
//! the first queue's start to the last queue's end). CPU time per packet = the queues'
//! thread CPU time (`CLOCK_THREAD_CPUTIME_ID`) / packets; CPU% = CPU time / (wall ×
//! threads). Each configuration runs [`REPS`] times on a fresh machine, the
//! repetitions interleaved across variants so that drift in the machine's load hits all
//! variants alike; the run with the median packets/s is reported. Ratios are against
//! the baseline with the same number of threads.
//!
//! **The mapping layer alone** (issue 36): per packet, the time inside the driver's
//! map and unmap calls (`Instant` around each call, on the queue's own thread) less the
//! time spent inside IOTLB invalidations in them
//! (`gmem_iommu::invalidating_nanos_on_this_thread`, measured: the busy-wait and the
//! simulated IOTLB dropping its entries, the hardware's part): IOVA allocation and
//! free, the bookkeeping, the table edits and the locks (waiting for a lock included),
//! without the DMA, the verification and the invalidation. It is wall time of the calls, equal to their CPU time while
//! the thread is not preempted (the locks spin; nothing sleeps); a preemption inside a
//! call counts, so on a loaded machine the figure is an upper bound. Waiting in `take`
//! for an asynchronously unmapped buffer to come back is not counted (it is rare: the
//! pool holds two batches more than the ring).
//!
//! ## The table disciplines alone
//! Through the core every table edit of a space happens under the space's lock (the
//! `Mmu` contract), so the three table disciplines can only differ in their cost per
//! edit there. A second, driver-level measurement takes the core out: threads call the
//! IOMMU table's map and unmap directly, each keeping [`RING`] pages of its own mapped in
//! leaf tables shared with the other threads and replacing one per step — what the
//! disciplines of GMEM section 5.5 do when edits really run in parallel. Ratios are
//! against the locked discipline with the same number of threads.
//!
//! This module owns the NIC workload and Table 3's measurement; [`edits`] the table
//! disciplines alone; [`report`] the printing, the files and the paper's figures.

mod edits;
mod report;

pub use edits::{edits_table, EditRow};
pub use report::run;

use gmem_core::{
    AllocPolicy, Callback, DeviceId, DmaMapping, Gmem, MapFlags, PhysAddr, Platform, Prot, SpaceId,
    VirtAddr, PAGE_SIZE,
};
use gmem_host_cpu::{HostCpu, HostCpuConfig};
use gmem_iommu::{
    BusDmaMap, Discipline, DmaDevice, DmaError, DmaPort, GiantLockDomain, InvalidationLatency,
    Iommu, IommuConfig,
};
use gmem_sim::SimMemory;
use std::cell::Cell;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

/// Buffers posted per queue.
pub const RING: usize = 256;
/// Bytes per packet (an Ethernet MTU's worth).
pub const PACKET_BYTES: usize = 1500;
/// Repetitions per configuration (the median is reported).
pub const REPS: usize = 3;
/// Thread (queue) counts measured.
pub const THREADS: [usize; 2] = [1, 2];
/// Largest `--inval-ns`: 100 µs, fifty times a real IOTLB invalidation's ~2 µs
/// ([`InvalidationLatency::TYPICAL`]), so a run's busy-waits stay bounded (at most
/// [`MAX_PACKETS`] × 100 µs per queue and run).
pub const MAX_INVAL_NS: u64 = 100_000;
/// Largest `--packets` per queue and run.
pub const MAX_PACKETS: u64 = 1_000_000;
/// Buffers per queue: the ring plus what two batches of queued unmaps may hold back.
const POOL: usize = RING + 2 * 64 + 8;
const IOVA_BEGIN: u64 = 1 << 20;
const IOVA_END: u64 = 1 << 32;

/// One column of Table 3.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Variant {
    /// Tree allocator + giant lock (FreeBSD before GMEM).
    Baseline,
    /// GMEM's vmem arena, locked tables, strict.
    Vmem,
    /// Lock-free tables, strict.
    Cas,
    /// Reader-writer tables, strict.
    Rw,
    /// Lock-free tables, asynchronous unmap.
    CasAsync,
    /// Reader-writer tables, asynchronous unmap.
    RwAsync,
}

impl Variant {
    /// Every variant, in Table 3's order.
    pub const ALL: [Variant; 6] = [
        Variant::Baseline,
        Variant::Vmem,
        Variant::Cas,
        Variant::Rw,
        Variant::CasAsync,
        Variant::RwAsync,
    ];

    /// The paper's name.
    pub fn name(self) -> &'static str {
        match self {
            Variant::Baseline => "baseline",
            Variant::Vmem => "GM-V",
            Variant::Cas => "GM-V-CAS",
            Variant::Rw => "GM-V-RW",
            Variant::CasAsync => "GM-V-CAS-A",
            Variant::RwAsync => "GM-V-RW-A",
        }
    }

    fn discipline(self) -> Discipline {
        match self {
            Variant::Baseline | Variant::Vmem => Discipline::Locked,
            Variant::Cas | Variant::CasAsync => Discipline::Cas,
            Variant::Rw | Variant::RwAsync => Discipline::Rw,
        }
    }

    fn asynchronous(self) -> bool {
        matches!(self, Variant::CasAsync | Variant::RwAsync)
    }
}

/// The run's parameters.
#[derive(Clone, Copy, Debug, serde::Serialize)]
pub struct Params {
    /// Modeled IOTLB invalidation latency, busy-waited (ns).
    pub inval_ns: u64,
    /// Packets per queue per run.
    pub packets: u64,
    /// Repetitions per configuration.
    pub reps: usize,
}

/// One measured configuration.
#[derive(Clone, Debug, serde::Serialize)]
pub struct Row {
    /// The variant's name.
    pub variant: &'static str,
    /// Threads (receive queues).
    pub threads: usize,
    /// Packets received (all queues).
    pub packets: u64,
    /// Wall time of the packet loops, seconds.
    pub wall_s: f64,
    /// Thousands of packets per second.
    pub kpps: f64,
    /// CPU microseconds per packet.
    pub cpu_us_per_packet: f64,
    /// CPU time / (wall × threads), percent.
    pub cpu_percent: f64,
    /// Packets/s over the baseline's (same threads).
    pub pps_vs_baseline: f64,
    /// CPU per packet over the baseline's (same threads).
    pub cpu_vs_baseline: f64,
    /// The mapping layer alone: nanoseconds per packet inside the map and unmap calls,
    /// less the invalidations in them (no DMA, no verification).
    pub map_unmap_ns_per_packet: f64,
    /// That cost over the baseline's (same threads; below 1 is cheaper).
    pub map_unmap_vs_baseline: f64,
    /// IOTLB invalidations completed during the run (teardown included).
    pub invalidations: u64,
    /// Invalidations per packet.
    pub invalidations_per_packet: f64,
    /// Of the invalidations, walk-cache flushes after maps that rebuilt reclaimed tables.
    pub walk_cache_flushes: u64,
    /// Most IOMMU table pages in use at once.
    pub table_pages_peak: u64,
    /// IOMMU table pages in use after teardown (root included).
    pub table_pages_end: u64,
    /// Every DMA landed intact, none faulted, nothing stayed mapped or cached.
    pub verified: bool,
}

thread_local! {
    static CPU: Cell<usize> = const { Cell::new(0) };
}

/// The core's platform for the run: each queue thread is its own CPU (per-CPU vmem
/// magazines).
struct ThreadCpus(usize);

impl Platform for ThreadCpus {
    fn current_cpu(&self) -> usize {
        CPU.with(Cell::get) % self.0
    }
    fn cpu_count(&self) -> usize {
        self.0
    }
}

/// The calling thread's CPU time.
fn thread_cpu() -> Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable `timespec` for the duration of the call, which
    // is all `clock_gettime` needs; the clock id is a constant the kernel knows.
    let r = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    if r != 0 {
        return Duration::ZERO;
    }
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

/// What a queue's driver does; implemented by the GMEM driver and the baseline.
trait Driver: Sync {
    type Handle: Copy;
    /// Post `frame`: map it for device writes; returns the handle and the IOVA.
    fn map(&self, frame: PhysAddr) -> Result<(Self::Handle, VirtAddr), String>;
    /// Unmap; `reusable` is set once the buffer may be reused.
    fn unmap(&self, h: Self::Handle, reusable: &Arc<AtomicBool>) -> Result<(), String>;
    /// No buffer is reusable yet: complete queued unmaps.
    fn wait(&self) -> Result<(), String>;
    /// The device writes `data` at `va` from queue `queue`.
    fn dma(&self, queue: usize, va: VirtAddr, data: &[u8]) -> Result<(), DmaError>;
}

struct GmemNic<'a> {
    gm: &'a Gmem,
    nic: &'a DmaDevice,
    space: SpaceId,
    host: DeviceId,
    asynchronous: bool,
}

impl Driver for GmemNic<'_> {
    type Handle = DmaMapping;
    fn map(&self, frame: PhysAddr) -> Result<(DmaMapping, VirtAddr), String> {
        let r = self
            .nic
            .map_buffer(self.gm, self.space, &[frame], self.host, Prot::WRITE)
            .map_err(|e| e.to_string())?;
        Ok((r, r.start))
    }
    fn unmap(&self, r: DmaMapping, reusable: &Arc<AtomicBool>) -> Result<(), String> {
        if self.asynchronous {
            let flag = reusable.clone();
            let cb: Callback = Box::new(move |res| {
                if res.is_ok() {
                    flag.store(true, Ordering::Release);
                }
            });
            self.nic
                .unmap_buffer(self.gm, r, MapFlags::ASYNC, Some(cb))
                .map_err(|e| e.to_string())
        } else {
            self.nic
                .unmap_buffer(self.gm, r, MapFlags::empty(), None)
                .map_err(|e| e.to_string())?;
            reusable.store(true, Ordering::Release);
            Ok(())
        }
    }
    fn wait(&self) -> Result<(), String> {
        self.gm
            .as_synchronize(self.space)
            .map_err(|e| e.to_string())
    }
    fn dma(&self, queue: usize, va: VirtAddr, data: &[u8]) -> Result<(), DmaError> {
        self.nic.write(queue, va, data)
    }
}

/// The baseline driver: one busdma map per buffer (a NIC driver creates one per ring
/// slot at attach time), loaded and unloaded per packet.
struct Legacy<'a> {
    dom: &'a GiantLockDomain,
    maps: Vec<BusDmaMap>,
    /// The first buffer frame: buffer `i` is the frame `i` pages above it.
    base: u64,
}

impl Driver for Legacy<'_> {
    type Handle = usize;
    fn map(&self, frame: PhysAddr) -> Result<(usize, VirtAddr), String> {
        let map = frame
            .as_u64()
            .checked_sub(self.base)
            .map(|off| (off / PAGE_SIZE) as usize)
            .and_then(|i| self.maps.get(i).map(|m| (i, m)));
        let (i, map) = map.ok_or("a buffer outside the pool")?;
        let va = self
            .dom
            .load(map, &[frame], Prot::WRITE)
            .map_err(|e| e.to_string())?;
        Ok((i, va))
    }
    fn unmap(&self, i: usize, reusable: &Arc<AtomicBool>) -> Result<(), String> {
        self.dom.unload(&self.maps[i]).map_err(|e| e.to_string())?;
        reusable.store(true, Ordering::Release);
        Ok(())
    }
    fn wait(&self) -> Result<(), String> {
        Ok(())
    }
    fn dma(&self, queue: usize, va: VirtAddr, data: &[u8]) -> Result<(), DmaError> {
        self.dom.port().write(queue, va, data)
    }
}

/// What one queue did.
struct QueueRun {
    start: Instant,
    end: Instant,
    cpu: Duration,
    mismatches: u64,
    dma_errors: u64,
    /// The IOVA of the last packet (unmapped since: must fault after the run).
    last_va: VirtAddr,
    /// Time inside the packets' map and unmap calls, less the invalidations in them:
    /// the mapping layer alone.
    mapping: Duration,
}

/// Run `f` (a map or an unmap) and add its wall time less the time this thread spent
/// inside invalidations in it to `mapping`.
fn timed<T>(mapping: &mut Duration, f: impl FnOnce() -> T) -> T {
    let spun = gmem_iommu::invalidating_nanos_on_this_thread();
    let t = Instant::now();
    let r = f();
    let took = t.elapsed();
    let waited = gmem_iommu::invalidating_nanos_on_this_thread() - spun;
    *mapping += took.saturating_sub(Duration::from_nanos(waited));
    r
}

/// The packet `seq` of queue `queue`: its identity, then a seeded pseudo-random body.
fn fill(packet: &mut [u8], queue: usize, seq: u64) {
    let mut x = (queue as u64 + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ seq;
    for (i, chunk) in packet.chunks_mut(8).enumerate() {
        let v = if i == 0 {
            seq
        } else {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        chunk.copy_from_slice(&v.to_le_bytes()[..chunk.len()]);
    }
}

fn take<D: Driver>(d: &D, reusable: &[Arc<AtomicBool>], next: &mut usize) -> Result<usize, String> {
    for attempt in 0..100_000 {
        for k in 0..reusable.len() {
            let i = (*next + k) % reusable.len();
            if reusable[i].load(Ordering::Acquire) {
                reusable[i].store(false, Ordering::Relaxed);
                *next = i + 1;
                return Ok(i);
            }
        }
        d.wait()?;
        if attempt > 8 {
            std::thread::yield_now();
        }
    }
    Err("no DMA buffer came back from its unmap".into())
}

fn queue<D: Driver>(
    d: &D,
    q: usize,
    packets: u64,
    frames: &[PhysAddr],
    memory: &SimMemory,
    start: &Barrier,
) -> Result<QueueRun, String> {
    CPU.with(|c| c.set(q));
    let reusable: Vec<Arc<AtomicBool>> = frames
        .iter()
        .map(|_| Arc::new(AtomicBool::new(true)))
        .collect();
    let mut next = 0;
    let mut ring = VecDeque::with_capacity(RING);
    let mut posted = Ok(());
    for _ in 0..RING {
        match take(d, &reusable, &mut next).and_then(|b| d.map(frames[b]).map(|m| (m, b))) {
            Ok(((h, va), b)) => ring.push_back((h, va, b)),
            Err(e) => {
                posted = Err(e);
                break;
            }
        }
    }
    // Every queue reaches the barrier, even one whose ring failed (no deadlock).
    start.wait();
    posted?;
    let mut packet = vec![0u8; PACKET_BYTES];
    let mut landed = vec![0u8; PACKET_BYTES];
    let (mut mismatches, mut dma_errors) = (0, 0);
    let mut last_va = VirtAddr::new(0);
    let mut mapping = Duration::ZERO;
    let cpu0 = thread_cpu();
    let t0 = Instant::now();
    for seq in 0..packets {
        let (h, va, b) = ring.pop_front().ok_or("the ring ran empty")?;
        fill(&mut packet, q, seq);
        if d.dma(q, va, &packet).is_err() {
            dma_errors += 1;
        }
        memory
            .read(frames[b], &mut landed)
            .map_err(|e| e.to_string())?;
        if landed != packet {
            mismatches += 1;
        }
        timed(&mut mapping, || d.unmap(h, &reusable[b]))?;
        last_va = va;
        let nb = take(d, &reusable, &mut next)?;
        let (h, va) = timed(&mut mapping, || d.map(frames[nb]))?;
        ring.push_back((h, va, nb));
    }
    let end = Instant::now();
    let cpu = thread_cpu().saturating_sub(cpu0);
    for (h, _, b) in ring.drain(..) {
        d.unmap(h, &reusable[b])?;
    }
    Ok(QueueRun {
        start: t0,
        end,
        cpu,
        mismatches,
        dma_errors,
        last_va,
        mapping,
    })
}

/// The host side of a run: host memory (the core manages 1..32 MiB of it; buffers
/// live above, in memory the NIC driver owns) and a core on a platform with one CPU
/// per queue.
struct Host {
    cpu: HostCpu,
    gm: Gmem,
    buffers: u64,
}

fn host(threads: usize) -> Result<Host, String> {
    let cpu = HostCpu::new(HostCpuConfig {
        memory_bytes: 64 << 20,
        table_frames: 256,
        ..HostCpuConfig::default()
    })
    .map_err(|e| e.to_string())?;
    let gm =
        Gmem::new(Arc::new(ThreadCpus(threads)), cpu.device_desc()).map_err(|e| e.to_string())?;
    cpu.port()
        .bind(gm.host())
        .map_err(|d| format!("{d} bound"))?;
    cpu.memory_map()
        .add(gm.host(), cpu.memory().clone())
        .map_err(|e| e.to_string())?;
    let base = cpu.memory().base().as_u64();
    gm.dev_register_physmem(
        gm.host(),
        PhysAddr::new(base + (1 << 20)),
        PhysAddr::new(base + (32 << 20)),
    )
    .map_err(|e| e.to_string())?;
    Ok(Host {
        cpu,
        gm,
        buffers: base + (32 << 20),
    })
}

/// What a run measured, before ratios.
struct Measured {
    packets: u64,
    wall: Duration,
    cpu: Duration,
    /// The queues' time in map + unmap less the invalidation waits.
    mapping: Duration,
    invalidations: u64,
    walk_cache_flushes: u64,
    table_pages_peak: u64,
    table_pages_end: u64,
    verified: bool,
    problems: Vec<String>,
}

fn run_queues<D: Driver>(
    d: &D,
    h: &Host,
    threads: usize,
    packets: u64,
) -> Result<Vec<QueueRun>, String> {
    let start = Barrier::new(threads);
    let memory = h.cpu.memory();
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads)
            .map(|q| {
                let frames: Vec<PhysAddr> = (0..POOL)
                    .map(|i| PhysAddr::new(h.buffers + ((q * POOL + i) as u64) * PAGE_SIZE))
                    .collect();
                let start = &start;
                s.spawn(move || queue(d, q, packets, &frames, memory, start))
            })
            .collect();
        handles
            .into_iter()
            .map(|j| {
                j.join()
                    .map_err(|_| "a queue thread panicked".to_string())?
            })
            .collect()
    })
}

fn summarize(runs: &[QueueRun], packets: u64) -> (Duration, Duration, Vec<String>) {
    let first = runs.iter().map(|r| r.start).min();
    let last = runs.iter().map(|r| r.end).max();
    let wall = match (first, last) {
        (Some(a), Some(b)) => b - a,
        _ => Duration::ZERO,
    };
    let cpu = runs.iter().map(|r| r.cpu).sum();
    let mut problems = Vec::new();
    let bad: u64 = runs.iter().map(|r| r.mismatches).sum();
    if bad > 0 {
        problems.push(format!("{bad} of {packets} packets landed corrupted"));
    }
    let faults: u64 = runs.iter().map(|r| r.dma_errors).sum();
    if faults > 0 {
        problems.push(format!("{faults} DMAs failed"));
    }
    (wall, cpu, problems)
}

fn run_gmem(v: Variant, threads: usize, p: &Params) -> Result<Measured, String> {
    let h = host(threads)?;
    let config = IommuConfig {
        discipline: v.discipline(),
        latency: InvalidationLatency::spin(p.inval_ns),
        queues: threads,
        ..IommuConfig::default()
    };
    let iommu = Iommu::new(config, h.cpu.memory_map().clone()).map_err(|e| e.to_string())?;
    let nic = iommu
        .create_device(&h.gm, "nic")
        .map_err(|e| e.to_string())?;
    let space = nic
        .create_space(
            &h.gm,
            VirtAddr::new(IOVA_BEGIN),
            VirtAddr::new(IOVA_END),
            AllocPolicy::CACHED,
        )
        .map_err(|e| e.to_string())?;
    let d = GmemNic {
        gm: &h.gm,
        nic: &nic,
        space,
        host: h.gm.host(),
        asynchronous: v.asynchronous(),
    };
    let runs = run_queues(&d, &h, threads, p.packets)?;
    h.gm.as_synchronize(space).map_err(|e| e.to_string())?;
    let packets = p.packets * threads as u64;
    let (wall, cpu, mut problems) = summarize(&runs, packets);
    let left = h.gm.as_regions(space).map_err(|e| e.to_string())?.len()
        + h.gm.dma_mappings(space).map_err(|e| e.to_string())?;
    if left > 0 {
        problems.push(format!("{left} buffers still mapped after teardown"));
    }
    Ok(after_teardown(
        &runs,
        (packets, wall, cpu),
        problems,
        nic.port(),
        &iommu,
    ))
}

fn run_baseline(threads: usize, p: &Params) -> Result<Measured, String> {
    let h = host(threads)?;
    let config = IommuConfig {
        discipline: Discipline::Locked,
        latency: InvalidationLatency::spin(p.inval_ns),
        queues: threads,
        ..IommuConfig::default()
    };
    let iommu = Iommu::new(config, h.cpu.memory_map().clone()).map_err(|e| e.to_string())?;
    let dom = GiantLockDomain::new(
        &iommu,
        VirtAddr::new(IOVA_BEGIN),
        VirtAddr::new(IOVA_END),
        h.gm.host(),
    )
    .map_err(|e| e.to_string())?;
    let d = Legacy {
        dom: &dom,
        maps: (0..threads * POOL).map(|_| BusDmaMap::new()).collect(),
        base: h.buffers,
    };
    let runs = run_queues(&d, &h, threads, p.packets)?;
    let packets = p.packets * threads as u64;
    let (wall, cpu, mut problems) = summarize(&runs, packets);
    let st = dom.stats();
    if st.live != 0 || st.gas.allocs != st.gas.frees || st.loads != st.unloads {
        problems.push(format!(
            "{} IOVAs still allocated after teardown ({} loads, {} unloads)",
            st.live, st.loads, st.unloads
        ));
    }
    if let Err(e) = dom.check() {
        problems.push(format!("the GAS tree is broken: {e}"));
    }
    Ok(after_teardown(
        &runs,
        (packets, wall, cpu),
        problems,
        dom.port(),
        &iommu,
    ))
}

/// A run's figures once its queues are torn down, checking on the way that no queue's
/// last (now unmapped) IOVA still translates, in the IOTLB or through the tables.
fn after_teardown(
    runs: &[QueueRun],
    (packets, wall, cpu): (u64, Duration, Duration),
    mut problems: Vec<String>,
    port: &DmaPort,
    iommu: &Iommu,
) -> Measured {
    for (q, r) in runs.iter().enumerate() {
        if port.mmu().cached(q, r.last_va) || port.write(q, r.last_va, &[0]).is_ok() {
            problems.push(format!("queue {q}: an unmapped IOVA still translates"));
        }
    }
    let st = port.stats();
    let tables = iommu.table_stats();
    Measured {
        packets,
        wall,
        cpu,
        mapping: runs.iter().map(|r| r.mapping).sum(),
        invalidations: st.mmu.invalidations,
        walk_cache_flushes: st.mmu.walk_cache_flushes,
        table_pages_peak: tables.memory.peak,
        table_pages_end: tables.memory.in_use,
        verified: problems.is_empty(),
        problems,
    }
}

fn measure(v: Variant, threads: usize, p: &Params) -> Result<Measured, String> {
    match v {
        Variant::Baseline => run_baseline(threads, p),
        _ => run_gmem(v, threads, p),
    }
}

fn pps(m: &Measured) -> f64 {
    m.packets as f64 / m.wall.as_secs_f64().max(1e-9)
}

/// Run every variant on 1 and 2 threads; returns the rows and any verification
/// problems.
///
/// # Errors
/// A message when `packets` is zero or above [`MAX_PACKETS`], `reps` is zero or
/// `inval_ns` is above [`MAX_INVAL_NS`] (nothing runs then), or from the first run that failed:
/// building the host, the IOMMU or a device's space, a buffer map or unmap the driver
/// refused, no buffer coming back from its unmap, or a queue thread that panicked. A
/// DMA that faulted or a packet that landed wrong is not an error: it is counted and
/// returned among the verification problems.
pub fn table3(p: &Params) -> Result<(Vec<Row>, Vec<String>), String> {
    if p.packets == 0 || p.packets > MAX_PACKETS || p.reps == 0 {
        return Err(format!(
            "--packets must be in 1..={MAX_PACKETS} and the repetitions positive (got {} and {})",
            p.packets, p.reps
        ));
    }
    if p.inval_ns > MAX_INVAL_NS {
        return Err(format!(
            "--inval-ns must be in 0..={MAX_INVAL_NS} (got {})",
            p.inval_ns
        ));
    }
    let configs: Vec<(Variant, usize)> = THREADS
        .iter()
        .flat_map(|t| Variant::ALL.iter().map(move |v| (*v, *t)))
        .collect();
    let mut results: Vec<Vec<Measured>> = configs.iter().map(|_| Vec::new()).collect();
    let bar = indicatif::ProgressBar::new((configs.len() * p.reps) as u64);
    for _ in 0..p.reps {
        for (i, (v, t)) in configs.iter().enumerate() {
            bar.set_message(format!("{} x{t}", v.name()));
            results[i].push(measure(*v, *t, p)?);
            bar.inc(1);
        }
    }
    bar.finish_and_clear();
    let mut problems = Vec::new();
    let mut medians: Vec<Measured> = Vec::new();
    for ((v, t), mut runs) in configs.iter().zip(results) {
        for m in &runs {
            for pr in &m.problems {
                problems.push(format!("{} x{t}: {pr}", v.name()));
            }
        }
        let verified = runs.iter().all(|m| m.verified);
        runs.sort_by(|a, b| pps(a).total_cmp(&pps(b)));
        let mut m = runs.swap_remove(runs.len() / 2);
        m.verified = verified;
        medians.push(m);
    }
    let rows = configs
        .iter()
        .zip(&medians)
        .map(|((v, t), m)| {
            let base = configs
                .iter()
                .position(|(bv, bt)| *bv == Variant::Baseline && bt == t)
                .map(|i| &medians[i])
                .expect("every thread count has a baseline");
            let cpu_pp = m.cpu.as_secs_f64() / m.packets as f64;
            let base_cpu_pp = base.cpu.as_secs_f64() / base.packets as f64;
            let map_pp = m.mapping.as_secs_f64() / m.packets as f64;
            let base_map_pp = base.mapping.as_secs_f64() / base.packets as f64;
            Row {
                variant: v.name(),
                threads: *t,
                packets: m.packets,
                wall_s: m.wall.as_secs_f64(),
                kpps: pps(m) / 1e3,
                cpu_us_per_packet: cpu_pp * 1e6,
                cpu_percent: 100.0 * m.cpu.as_secs_f64()
                    / (m.wall.as_secs_f64() * *t as f64).max(1e-9),
                pps_vs_baseline: pps(m) / pps(base),
                cpu_vs_baseline: cpu_pp / base_cpu_pp.max(1e-15),
                map_unmap_ns_per_packet: map_pp * 1e9,
                map_unmap_vs_baseline: map_pp / base_map_pp.max(1e-15),
                invalidations: m.invalidations,
                invalidations_per_packet: m.invalidations as f64 / m.packets as f64,
                walk_cache_flushes: m.walk_cache_flushes,
                table_pages_peak: m.table_pages_peak,
                table_pages_end: m.table_pages_end,
                verified: m.verified,
            }
        })
        .collect();
    Ok((rows, problems))
}

#[cfg(test)]
mod tests {
    use super::report::write;
    use super::*;

    #[test]
    fn every_variant_verifies_and_async_unmaps_coalesce_invalidations() {
        let p = Params {
            inval_ns: 0,
            packets: 400,
            reps: 1,
        };
        let (rows, problems) = table3(&p).unwrap();
        assert!(problems.is_empty(), "{problems:?}");
        assert_eq!(rows.len(), 12);
        for r in &rows {
            assert!(r.verified, "{r:?}");
            assert_eq!(r.packets, 400 * r.threads as u64);
            // The mapping layer is a part of each packet's work, never all of it (the
            // DMA and the verification are outside it).
            let total_ns = r.wall_s * 1e9 * r.threads as f64 / r.packets as f64;
            assert!(
                r.map_unmap_ns_per_packet > 0.0 && r.map_unmap_ns_per_packet < total_ns,
                "{r:?}"
            );
            let strict = !r.variant.ends_with("-A");
            if strict {
                // One invalidation per unmap: the packets' and the teardown's ring.
                let unmaps = r.packets + (RING * r.threads) as u64;
                assert_eq!(r.invalidations - r.walk_cache_flushes, unmaps, "{r:?}");
            } else {
                assert!(r.invalidations_per_packet < 0.1, "{r:?}");
            }
        }
        let cas = rows.iter().find(|r| r.variant == "GM-V-CAS").unwrap();
        let rw = rows.iter().find(|r| r.variant == "GM-V-RW").unwrap();
        assert!(cas.table_pages_end > 1, "CAS keeps its tables");
        assert_eq!(rw.table_pages_end, 1, "RW reclaims down to the root");
        let dir = std::env::temp_dir().join(format!("gmem-iommu-{}", std::process::id()));
        let memory = host(1).unwrap().gm.host();
        let edits = edits_table(2000, 1, memory).unwrap();
        assert_eq!(edits.len(), 6);
        let rw = edits.iter().find(|e| e.discipline == "RW").unwrap();
        assert!(rw.mpairs_per_s > 0.0 && rw.cpu_ns_per_pair > 0.0);
        let files = write(&dir, &p, &rows, &edits).unwrap();
        assert_eq!(files.len(), 3);
        let csv = std::fs::read_to_string(dir.join("iommu.csv")).unwrap();
        assert_eq!(csv.lines().count(), 13);
        assert!(csv.starts_with("variant,") && csv.contains(",map_unmap_ns_per_packet,"));
        assert!(std::fs::read_to_string(dir.join("iommu.svg"))
            .unwrap()
            .contains("<svg"));
        let _ = std::fs::remove_dir_all(dir);
    }

    #[test]
    fn packets_carry_their_queue_and_sequence() {
        let (mut a, mut b) = (vec![0u8; PACKET_BYTES], vec![0u8; PACKET_BYTES]);
        fill(&mut a, 0, 7);
        fill(&mut b, 1, 7);
        assert_ne!(a, b);
        assert_eq!(u64::from_le_bytes(a[..8].try_into().unwrap()), 7);
        fill(&mut b, 0, 7);
        assert_eq!(a, b);
    }
}
