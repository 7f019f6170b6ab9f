//! The machine and the workloads of `reproduce uvm`: a host CPU and one or two discrete
//! SIMT GPUs sharing one gmem address space, and four kernels verified bit for bit
//! against CPU-only references.
//!
//! The GPUs are the discrete GPU of `gmem-harness simt` (MESC Table I's 16 CUs and
//! TLBs over the `gmem-dgpu` tables in video memory), each with video memory sized to
//! a share of the workload's data. Data is written by the host CPU, then touched by
//! the GPU kernels (faults: migration on first touch under the core's default
//! placement, eviction to host memory when video memory is full), then read back by
//! the host CPU (faults: migration back).
//!
//! | workload | kernel | what it stresses |
//! |---|---|---|
//! | `stream` | `c[i] = a[i] + 3·b[i]`, one pass | first-touch migration, page by page |
//! | `stencil` | 3-point Jacobi, ping-pong arrays, several sweeps; after each, the host reads one word of every 8th page of the output | pages bouncing GPU -> host -> GPU every sweep (thrashing in UVM's sense, at any memory size); re-migration when oversubscribed |
//! | `shared-table` | two GPUs, in turn, gather from one read-only table | a table both GPUs read |
//! | `graph` | pull gather over a random fixed-degree graph, two sweeps | random access |

use gmem_core::policy::advice::AdviceOp;
use gmem_core::policy::counters::AccessReport;
use gmem_core::{
    Activation, AllocPolicy, AllocRequest, Gmem, MmuMode, Placement, PlacementMode,
    PlacementTarget, Region, SpaceId, VirtAddr, PAGE_SIZE,
};
use gmem_dgpu::{Dgpu, DgpuConfig};
use gmem_host_cpu::{HostCpu, HostCpuConfig};
use gmem_sim::Served;
use gmem_simt::cost::CostModel;
use gmem_simt::dispatch::{LooseRoundRobin, RoundRobin, WarpScheduler};
use gmem_simt::engine::{run, AccessObserver, Device, Launch, SpareWakes};
use gmem_simt::machine::{mesc_tlbs, MESC_UNITS};
use gmem_simt::occupancy::SmConfig;
use gmem_simt::workloads::spec::{Affine, Spec, SpecKernel, MAX_OPS};
use std::collections::BTreeMap;

/// The stencil's host check reads one word of every this many pages of each sweep's
/// output (assumption: a sampled convergence check, the host-side step of an
/// iterative solver that makes its pages move GPU -> host -> GPU every sweep).
pub const CHECK_STRIDE: usize = 8;

/// The workloads, in report order.
pub const WORKLOADS: [&str; 4] = ["stream", "stencil", "shared-table", "graph"];

/// Counts the transactions of a launch whose frame lies outside the launching GPU's
/// video memory: remote accesses over the bus; with `per_page`, also each virtual
/// page's count (the GPU's access counters, see [`Machine::count_accesses`]).
struct RemoteCounter {
    lo: u64,
    hi: u64,
    remote: u64,
    /// Remote transactions per virtual page number (in page order), if counted.
    per_page: Option<BTreeMap<u64, u64>>,
}

impl AccessObserver for RemoteCounter {
    fn transaction(&mut self, _unit: usize, pa: u64, _store: bool, _served: Served) {
        if pa < self.lo || pa >= self.hi {
            self.remote += 1;
        }
    }

    fn transaction_at(&mut self, unit: usize, va: u64, pa: u64, store: bool, served: Served) {
        let before = self.remote;
        self.transaction(unit, pa, store, served);
        if self.remote != before {
            if let Some(pages) = self.per_page.as_mut() {
                *pages.entry(va / PAGE_SIZE).or_default() += 1;
            }
        }
    }
}

/// What the access counters of a run reported and what the core did with it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct AccessTally {
    /// `Gmem::dev_report_accesses` calls (one per launch that made remote accesses).
    pub calls: u64,
    /// Remote accesses reported (128-byte transactions).
    pub accesses: u64,
    /// Regions the core found hot.
    pub hot_regions: u64,
    /// Pages the core migrated for them.
    pub pages_migrated: u64,
    /// Hot regions whose migration failed part-way (the core's `AccessOutcome::failed`).
    pub failed: u64,
}

/// A host CPU and `n` discrete GPUs in one address space.
pub struct Machine {
    gm: Gmem,
    cpu: HostCpu,
    gpus: Vec<Dgpu>,
    space: SpaceId,
    cost: CostModel,
    occupancy: SmConfig,
    /// GPU cycles of every launch so far.
    pub cycles: u64,
    /// Transactions to memory outside the launching GPU's.
    pub remote: u64,
    /// Whether each launch's remote accesses are counted per page and reported to
    /// the core when the launch ends (`Gmem::dev_report_accesses`; the space's
    /// access counters must be on). Off by default.
    pub count_accesses: bool,
    /// What those reports did.
    pub access: AccessTally,
}

impl Machine {
    /// `gpus` discrete GPUs of `vram_pages` pages of data memory each, and host memory
    /// for `host_pages`.
    ///
    /// # Errors
    /// What the core or a driver refused, described.
    pub fn new(host_pages: u64, gpus: u32, vram_pages: u64) -> Result<Machine, String> {
        let defaults = HostCpuConfig::default();
        let table_frames = (host_pages.div_ceil(512) + 256).next_multiple_of(512);
        let (gm, cpu) = HostCpu::boot(HostCpuConfig {
            memory_bytes: (host_pages + table_frames) * PAGE_SIZE,
            table_frames,
            ..defaults
        })
        .map_err(|e| format!("{e:?}"))?;
        let space = gm
            .as_create(
                VirtAddr::new(1 << 32),
                VirtAddr::new(1 << 39),
                AllocPolicy::empty(),
            )
            .map_err(|e| e.to_string())?;
        gm.as_attach(space, gm.host(), MmuMode::Coherent, Activation::Switch)
            .map_err(|e| e.to_string())?;
        let mut list = Vec::new();
        for i in 0..gpus {
            let mut c = DgpuConfig::new(i, 0, MESC_UNITS);
            c.tlbs = mesc_tlbs(MESC_UNITS);
            c.table_frames = (host_pages + vram_pages).div_ceil(512) + 64;
            c.vram_bytes = (c.table_frames + vram_pages.max(1)) * PAGE_SIZE;
            let g = Dgpu::new(cpu.memory_map().clone(), c).map_err(|e| format!("{e:?}"))?;
            let id = g
                .create(&gm, &format!("dgpu{i}"))
                .map_err(|e| format!("{e:?}"))?;
            gm.as_attach(space, id, MmuMode::Coherent, Activation::Switch)
                .map_err(|e| e.to_string())?;
            list.push(g);
        }
        Ok(Machine {
            gm,
            cpu,
            gpus: list,
            space,
            cost: CostModel::calibrated(),
            occupancy: SmConfig::maxwell(),
            cycles: 0,
            remote: 0,
            count_accesses: false,
            access: AccessTally::default(),
        })
    }

    /// The GMEM instance.
    pub fn gm(&self) -> &Gmem {
        &self.gm
    }

    /// The address space every GPU and the host share.
    pub fn space(&self) -> SpaceId {
        self.space
    }

    /// The GPUs.
    pub fn gpus(&self) -> &[Dgpu] {
        &self.gpus
    }

    /// The cost model of the launches.
    pub fn cost(&self) -> &CostModel {
        &self.cost
    }

    /// Allocate an array holding `values` (as `u32` bit patterns), written by the
    /// host CPU.
    fn upload(&self, values: &[u32]) -> Result<Region, String> {
        let size = (values.len() as u64 * 4).max(1).next_multiple_of(PAGE_SIZE);
        let r = self
            .gm
            .as_alloc(self.space, AllocRequest::new(size))
            .map_err(|e| e.to_string())?;
        let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        for (i, c) in bytes.chunks(PAGE_SIZE as usize).enumerate() {
            let va = VirtAddr::new(r.start.as_u64() + i as u64 * PAGE_SIZE);
            self.cpu
                .store(&self.gm, va, c)
                .map_err(|e| format!("host store: {e}"))?;
        }
        Ok(r)
    }

    fn upload_f32(&self, values: &[f32]) -> Result<Region, String> {
        let v: Vec<u32> = values.iter().map(|x| x.to_bits()).collect();
        self.upload(&v)
    }

    /// Read `n` words of `r` back through the host CPU.
    fn download(&self, r: Region, n: usize) -> Result<Vec<u32>, String> {
        let mut bytes = vec![0u8; n * 4];
        for (i, c) in bytes.chunks_mut(PAGE_SIZE as usize).enumerate() {
            let va = VirtAddr::new(r.start.as_u64() + i as u64 * PAGE_SIZE);
            self.cpu
                .load(&self.gm, va, c)
                .map_err(|e| format!("host load: {e}"))?;
        }
        Ok(bytes
            .chunks_exact(4)
            .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect())
    }

    /// Make `r`'s pages live in host memory and be mapped remotely by the GPUs (the
    /// core's remote-access placement; a repeated fault of a device that already maps a
    /// page remotely migrates it).
    fn remote(&self, r: Region) -> Result<(), String> {
        self.gm
            .region_set_policy(
                r,
                Placement {
                    target: PlacementTarget::Host,
                    mode: PlacementMode::RemoteAccess,
                },
            )
            .map_err(|e| e.to_string())
    }

    /// Advise `r` read-mostly (`cudaMemAdviseSetReadMostly`): a GPU reading it may
    /// get a read-only copy in its own memory, and a write collapses the copies.
    fn read_mostly(&self, r: Region) -> Result<(), String> {
        self.gm
            .region_advise(r, AdviceOp::SetReadMostly)
            .map_err(|e| e.to_string())
    }

    /// Run `spec` on GPU `gpu`; adds its cycles and remote transactions.
    fn launch<S: Spec>(&mut self, gpu: usize, spec: S) -> Result<(), String> {
        let g = &self.gpus[gpu];
        let mut counter = RemoteCounter {
            lo: g.vram().base().as_u64(),
            hi: g.vram().end().as_u64(),
            remote: 0,
            per_page: self.count_accesses.then(BTreeMap::new),
        };
        let mut spare = Vec::new();
        let mut wakes = SpareWakes::default();
        let scheduler = || Box::new(LooseRoundRobin::default()) as Box<dyn WarpScheduler>;
        let st = run(
            Device {
                gm: &self.gm,
                port: g.port(),
            },
            &SpecKernel::new(spec),
            Launch {
                occupancy: &self.occupancy,
                dispatch: &mut RoundRobin::default(),
                scheduler: &scheduler,
                cost: &self.cost,
                page_shift: 12,
                observer: Some(&mut counter),
                spare_io: &mut spare,
                spare_wakes: &mut wakes,
            },
        )
        .map_err(|e| format!("launch on dgpu{gpu}: {e}"))?;
        self.cycles += st.cycles;
        self.remote += counter.remote;
        if let Some(pages) = counter.per_page {
            self.report_accesses(gpu, pages)?;
        }
        Ok(())
    }

    /// Reports GPU `gpu`'s remote accesses of one launch, per page, to the core, which
    /// sums them per region and migrates the regions that reach its threshold.
    ///
    /// When: at the end of the launch. A GPU raises an access-counter notification
    /// while the kernel runs and UVM services it concurrently
    /// (`uvm_gpu_access_counters.c`); the SIMT engine runs a launch to its end in one
    /// call, inside the port's translation gate for every transaction, so no
    /// migration can happen within it. Ours are therefore later than the hardware's:
    /// a hot region benefits from the next launch on, never within the launch that
    /// made it hot (an assumption that favours no policy over `access`).
    fn report_accesses(&mut self, gpu: usize, pages: BTreeMap<u64, u64>) -> Result<(), String> {
        if pages.is_empty() {
            return Ok(());
        }
        let device = self.gpus[gpu]
            .port()
            .id()
            .ok_or_else(|| format!("dgpu{gpu} not created in the core"))?;
        // In page order: the same reports, in the same order, every run.
        let reports: Vec<AccessReport> = pages
            .iter()
            .map(|(&vpn, &n)| AccessReport {
                device,
                va: VirtAddr::new(vpn * PAGE_SIZE),
                count: u32::try_from(n).unwrap_or(u32::MAX),
            })
            .collect();
        let done = self
            .gm
            .dev_report_accesses(self.space, &reports)
            .map_err(|e| format!("access report of dgpu{gpu}: {e}"))?;
        self.access.calls += 1;
        self.access.accesses += reports.iter().map(|r| u64::from(r.count)).sum::<u64>();
        self.access.hot_regions += done.hot_regions;
        self.access.pages_migrated += done.pages_migrated;
        self.access.failed += done.failed;
        Ok(())
    }
}

/// Problem sizes of one workload.
#[derive(Clone, Copy, Debug)]
pub struct Sizes {
    /// Elements of the streaming arrays.
    pub stream_n: u64,
    /// Elements of the stencil arrays, and sweeps.
    pub stencil_n: u64,
    /// Stencil sweeps.
    pub stencil_sweeps: u64,
    /// Table entries, outputs per GPU, gathers per output, rounds.
    pub table: (u64, u64, u64, u64),
    /// Vertices, degree, sweeps.
    pub graph: (u64, u64, u64),
}

impl Sizes {
    /// The CI size (`--quick`) or the report size.
    pub fn new(quick: bool) -> Sizes {
        let k = if quick { 1 } else { 4 };
        Sizes {
            stream_n: k * (1 << 18),
            stencil_n: k * (1 << 18),
            stencil_sweeps: 8,
            table: (k * (1 << 18), k * (1 << 15), 8, 2),
            graph: (k * (1 << 16), 8, 2),
        }
    }

    /// Bytes of data `workload` allocates: its working set.
    pub fn working_set(&self, workload: &str) -> u64 {
        let pages = |n: u64| (n * 4).next_multiple_of(PAGE_SIZE);
        match workload {
            "stream" => 3 * pages(self.stream_n),
            "stencil" => 2 * pages(self.stencil_n),
            "shared-table" => pages(self.table.0) + 2 * pages(self.table.1),
            _ => pages(self.graph.0 * self.graph.1) + 2 * pages(self.graph.0),
        }
    }
}

/// A deterministic generator (xorshift64*), seeded per array: `n` draws of 24 bits.
fn draws(seed: u64, n: u64) -> impl Iterator<Item = u64> {
    let mut x = seed | 1;
    (0..n).map(move |_| {
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        x.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 40
    })
}

/// `n` values `f(draw)` of the generator seeded with `seed`.
fn values(seed: u64, n: u64, f: impl Fn(u64) -> f32) -> Vec<f32> {
    draws(seed, n).map(f).collect()
}

/// Small integers as f32: every sum the kernels form stays exact.
fn small(v: u64) -> f32 {
    (v % 64) as f32
}

struct Triad {
    a: u64,
    b: u64,
    c: u64,
    n: u64,
}

impl Spec for Triad {
    fn threads(&self) -> u64 {
        self.n
    }
    fn steps(&self) -> u64 {
        1
    }
    fn operands(&self) -> usize {
        2
    }
    fn addr(&self, t: u64, _k: u64, op: usize) -> Option<u64> {
        Some([self.a, self.b][op] + 4 * t)
    }
    fn affine(&self, _k: u64, op: usize) -> Option<Affine> {
        Some(Affine {
            base: [self.a, self.b][op],
            stride: 4,
        })
    }
    fn fold(&self, _t: u64, _k: u64, acc: &mut [f32; 4], v: &[f32; MAX_OPS]) {
        acc[0] += v[0] + 3.0 * v[1];
    }
    fn out(&self, t: u64) -> Option<u64> {
        Some(self.c + 4 * t)
    }
    fn out_affine(&self) -> Option<Affine> {
        Some(Affine {
            base: self.c,
            stride: 4,
        })
    }
}

struct Jacobi {
    src: u64,
    dst: u64,
    n: u64,
}

impl Spec for Jacobi {
    fn threads(&self) -> u64 {
        self.n
    }
    fn steps(&self) -> u64 {
        1
    }
    fn operands(&self) -> usize {
        3
    }
    fn addr(&self, t: u64, _k: u64, op: usize) -> Option<u64> {
        let i = (t + op as u64).checked_sub(1)?;
        (i < self.n).then_some(self.src + 4 * i)
    }
    fn fold(&self, _t: u64, _k: u64, acc: &mut [f32; 4], v: &[f32; MAX_OPS]) {
        acc[0] += v[0] + v[1] + v[2];
    }
    fn result(&self, _t: u64, acc: &[f32; 4]) -> f32 {
        acc[0] * 0.25
    }
    fn out(&self, t: u64) -> Option<u64> {
        Some(self.dst + 4 * t)
    }
    fn out_affine(&self) -> Option<Affine> {
        Some(Affine {
            base: self.dst,
            stride: 4,
        })
    }
}

/// The table entry GPU `g`'s thread `t` reads at step `k`.
fn table_index(g: u64, t: u64, k: u64, m: u64) -> u64 {
    let mut x = (g << 48) ^ (t << 8) ^ k ^ 0x9e37_79b9_7f4a_7c15;
    x ^= x >> 33;
    x = x.wrapping_mul(0xff51_afd7_ed55_8ccd);
    x ^= x >> 33;
    x % m
}

struct Gather {
    table: u64,
    out: u64,
    gpu: u64,
    m: u64,
    q: u64,
    k: u64,
}

impl Spec for Gather {
    fn threads(&self) -> u64 {
        self.q
    }
    fn steps(&self) -> u64 {
        self.k
    }
    fn operands(&self) -> usize {
        1
    }
    fn addr(&self, t: u64, k: u64, _op: usize) -> Option<u64> {
        Some(self.table + 4 * table_index(self.gpu, t, k, self.m))
    }
    fn fold(&self, _t: u64, _k: u64, acc: &mut [f32; 4], v: &[f32; MAX_OPS]) {
        acc[0] += v[0];
    }
    fn out(&self, t: u64) -> Option<u64> {
        Some(self.out + 4 * t)
    }
}

/// One pull sweep: `y[v] = Σ_k x[idx[v·d + k]]`; the index load is an operand too.
struct Pull {
    idx: std::sync::Arc<Vec<u32>>,
    idx_va: u64,
    x: u64,
    y: u64,
    v: u64,
    d: u64,
}

impl Spec for Pull {
    fn threads(&self) -> u64 {
        self.v
    }
    fn steps(&self) -> u64 {
        self.d
    }
    fn operands(&self) -> usize {
        2
    }
    fn addr(&self, t: u64, k: u64, op: usize) -> Option<u64> {
        let e = t * self.d + k;
        Some(match op {
            0 => self.idx_va + 4 * e,
            _ => self.x + 4 * u64::from(self.idx[e as usize]),
        })
    }
    fn fold(&self, _t: u64, _k: u64, acc: &mut [f32; 4], v: &[f32; MAX_OPS]) {
        acc[0] += v[1];
    }
    fn out(&self, t: u64) -> Option<u64> {
        Some(self.y + 4 * t)
    }
}

/// What a run does to a workload's data before the launches (the data-placement
/// part of a policy).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DataPolicy {
    /// Every data region in host memory, mapped remotely by the GPUs
    /// ([`PlacementMode::RemoteAccess`]).
    pub remote: bool,
    /// The arrays the GPUs only read (the workload's read-only inputs) advised
    /// read-mostly (`Gmem::region_advise` with [`AdviceOp::SetReadMostly`],
    /// `cudaMemAdviseSetReadMostly`): each reading GPU may get a read-only copy.
    pub read_mostly: bool,
}

/// Runs `workload` at `sizes` on `m`, its data prepared as `data` says; returns
/// whether every output matched the CPU reference bit for bit. The read-only inputs
/// (advised read-mostly under `data.read_mostly`): `stream`'s `a` and `b`,
/// `shared-table`'s table, `graph`'s edge array; the stencil's two arrays are each
/// written every other sweep, so it has none.
///
/// # Errors
/// A refused allocation, advice, host access or launch, described.
pub fn run_workload(
    m: &mut Machine,
    workload: &str,
    sizes: &Sizes,
    data: DataPolicy,
    before_kernels: &mut dyn FnMut(&Machine),
) -> Result<bool, String> {
    // `read_only`: the GPUs only read the region.
    let place = |m: &Machine, r: Region, read_only: bool| {
        if data.remote {
            m.remote(r)?;
        }
        if data.read_mostly && read_only {
            m.read_mostly(r)?;
        }
        Ok::<(), String>(())
    };
    match workload {
        "stream" => {
            let n = sizes.stream_n;
            let (a, b) = (values(1, n, small), values(2, n, small));
            let (ra, rb) = (m.upload_f32(&a)?, m.upload_f32(&b)?);
            let rc = m.upload_f32(&vec![0.0; n as usize])?;
            for (r, read_only) in [(ra, true), (rb, true), (rc, false)] {
                place(m, r, read_only)?;
            }
            before_kernels(m);
            let (va, vb, vc) = (ra.start.as_u64(), rb.start.as_u64(), rc.start.as_u64());
            m.launch(
                0,
                Triad {
                    a: va,
                    b: vb,
                    c: vc,
                    n,
                },
            )?;
            let got = m.download(rc, n as usize)?;
            let want = (0..n as usize).map(|i| (0.0f32 + (a[i] + 3.0 * b[i])).to_bits());
            Ok(got.into_iter().eq(want))
        }
        "stencil" => {
            let n = sizes.stencil_n;
            let mut cur = values(3, n, small);
            let r0 = m.upload_f32(&cur)?;
            let r1 = m.upload_f32(&vec![0.0; n as usize])?;
            for r in [r0, r1] {
                place(m, r, false)?;
            }
            before_kernels(m);
            let regions = [r0, r1];
            let mut checked_ok = true;
            for s in 0..sizes.stencil_sweeps as usize {
                let (src, dst) = (regions[s % 2], regions[(s + 1) % 2]);
                m.launch(
                    0,
                    Jacobi {
                        src: src.start.as_u64(),
                        dst: dst.start.as_u64(),
                        n,
                    },
                )?;
                let at = |i: Option<usize>| i.and_then(|i| cur.get(i)).copied().unwrap_or(0.0);
                cur = (0..n as usize)
                    .map(|i| {
                        (0.0f32 + (at(i.checked_sub(1)) + at(Some(i)) + at(Some(i + 1)))) * 0.25
                    })
                    .collect();
                // The host's sampled convergence check: the first word of every
                // CHECK_STRIDE-th page of the sweep's output.
                let words = (PAGE_SIZE / 4) as usize;
                for i in (0..n as usize).step_by(CHECK_STRIDE * words) {
                    let va = VirtAddr::new(dst.start.as_u64() + 4 * i as u64);
                    let v = m
                        .cpu
                        .load_u32(&m.gm, va)
                        .map_err(|e| format!("host load: {e}"))?;
                    checked_ok &= v == cur[i].to_bits();
                }
            }
            let last = regions[sizes.stencil_sweeps as usize % 2];
            let got = m.download(last, n as usize)?;
            Ok(checked_ok && got.into_iter().eq(cur.iter().map(|v| v.to_bits())))
        }
        "shared-table" => {
            let (tm, q, k, rounds) = sizes.table;
            let table = values(4, tm, small);
            let rt = m.upload_f32(&table)?;
            let outs = [
                m.upload_f32(&vec![0.0; q as usize])?,
                m.upload_f32(&vec![0.0; q as usize])?,
            ];
            for (r, read_only) in [(rt, true), (outs[0], false), (outs[1], false)] {
                place(m, r, read_only)?;
            }
            before_kernels(m);
            for _ in 0..rounds {
                for g in 0..2u64 {
                    m.launch(
                        g as usize,
                        Gather {
                            table: rt.start.as_u64(),
                            out: outs[g as usize].start.as_u64(),
                            gpu: g,
                            m: tm,
                            q,
                            k,
                        },
                    )?;
                }
            }
            let mut ok = true;
            for g in 0..2u64 {
                let got = m.download(outs[g as usize], q as usize)?;
                let want = (0..q).map(|t| {
                    (0..k)
                        .fold(0.0f32, |acc, s| {
                            acc + table[table_index(g, t, s, tm) as usize]
                        })
                        .to_bits()
                });
                ok &= got.into_iter().eq(want);
            }
            Ok(ok)
        }
        "graph" => {
            let (v, d, sweeps) = sizes.graph;
            let idx: Vec<u32> = draws(5, v * d).map(|x| (x % v) as u32).collect();
            let idx = std::sync::Arc::new(idx);
            let ri = m.upload(&idx)?;
            let mut x = values(6, v, small);
            let rx = m.upload_f32(&x)?;
            let ry = m.upload_f32(&vec![0.0; v as usize])?;
            for (r, read_only) in [(ri, true), (rx, false), (ry, false)] {
                place(m, r, read_only)?;
            }
            before_kernels(m);
            let regions = [rx, ry];
            for s in 0..sweeps as usize {
                let (src, dst) = (regions[s % 2], regions[(s + 1) % 2]);
                m.launch(
                    0,
                    Pull {
                        idx: idx.clone(),
                        idx_va: ri.start.as_u64(),
                        x: src.start.as_u64(),
                        y: dst.start.as_u64(),
                        v,
                        d,
                    },
                )?;
                x = (0..v as usize)
                    .map(|t| {
                        (0..d as usize)
                            .fold(0.0f32, |acc, k| acc + x[idx[t * d as usize + k] as usize])
                    })
                    .collect();
            }
            let last = regions[sweeps as usize % 2];
            let got = m.download(last, v as usize)?;
            Ok(got.into_iter().eq(x.iter().map(|v| v.to_bits())))
        }
        other => Err(format!(
            "unknown workload {other}; known: {}",
            WORKLOADS.join(", ")
        )),
    }
}
