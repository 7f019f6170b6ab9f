//! The machine's parameters (CODA §5): stacks, near-data SMs, memory, the fine-grain
//! chunk, the bandwidths of the three kinds of path and the near-data SM model
//! ([`SmModel`]). Experiments print them.
//!
//! CODA's Table 1 (the simulated system) was an image and is missing from the text;
//! the prose gives four stacks of four SMs, 128-byte / 4 KiB interleaving and the
//! 256 / 128 / 16 GB/s bandwidths. It says nothing of the SMs' clock, warps or memory
//! latency, so [`SmModel`] takes them from a published GPU (Fermi, GTX 480). The
//! remote hop comes from the topology and a published link ([`RemoteHop`]); the
//! blocks an SM holds (Eq. 1's blocks per stack) from the occupancy calculator of
//! `gmem-regdem` on that Fermi SM ([`KernelShape`], [`HbmConfig::for_kernel`]).

use core::fmt;
use gmem_core::{PhysAddr, PAGE_SIZE};

/// One HBM-stack system.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct HbmConfig {
    /// Memory stacks (a power of two, at least 2).
    pub stacks: u32,
    /// Near-data SMs in each stack.
    pub sms_per_stack: u32,
    /// Bytes of each stack (a multiple of 4 KiB).
    pub stack_bytes: u64,
    /// The first physical address of the stacks' memory (4 KiB × `stacks` aligned).
    pub base: PhysAddr,
    /// Bytes a fine-grain page keeps in one stack before moving to the next (a power
    /// of two dividing 4 KiB / `stacks`).
    pub fine_chunk: u64,
    /// Bandwidth of an SM to its own stack, GB/s.
    pub local_gbps: f64,
    /// Bandwidth of the host to the stacks, GB/s.
    pub host_gbps: f64,
    /// Bandwidth between stacks, GB/s.
    pub remote_gbps: f64,
    /// The near-data SMs' issue and latency model.
    pub sm: SmModel,
    /// The SMs' data caches (per-SM L1, per-stack L2; [`crate::dcache`]).
    pub cache: CacheModel,
    /// Thread blocks one SM holds at once: the occupancy calculator's, for the
    /// kernel being run ([`HbmConfig::for_kernel`]; Eq. 1's blocks per stack is this ×
    /// `sms_per_stack`).
    pub resident_blocks: u32,
}

/// The near-data SMs' data caches: a per-SM L1 and, in each stack's logic layer, an
/// L2 shared by that stack's SMs, both of 128-byte lines, set-associative, LRU
/// ([`crate::dcache`] says why the L2 sits beside the SMs and not beside the memory).
///
/// Geometry quoted from memory of GPGPU-Sim's GTX 480 (Fermi) configuration, as
/// [`SmModel`] is, not re-checked: L1 data cache 32 sets × 4 ways × 128 B = 16 KiB per
/// SM (the 16 KiB L1 / 48 KiB shared-memory split), L2 768 KiB in all, here 192 KiB
/// per stack (192 sets × 8 ways × 128 B; four stacks of four SMs stand for the GTX
/// 480's 15 SMs). Hit latencies are the SIMT model's (`gmem_simt::cost::CostModel`:
/// L1 28 cycles, L2 193 cycles, recalled unverified) at the 1.4 GHz SM clock: 20 ns
/// and 138 ns. The same caches serve every configuration of an experiment.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct CacheModel {
    /// Model the caches (off: every access goes to memory, the model before caches).
    pub enabled: bool,
    /// Sets of each SM's L1.
    pub l1_sets: usize,
    /// Ways of each SM's L1.
    pub l1_ways: usize,
    /// Sets of each stack's L2.
    pub l2_sets: usize,
    /// Ways of each stack's L2.
    pub l2_ways: usize,
    /// Latency of an L1 hit, ns.
    pub l1_hit_ns: f64,
    /// Latency of an L2 hit (and of a store reaching the L2), ns.
    pub l2_hit_ns: f64,
}

impl Default for CacheModel {
    /// The GTX 480 geometry above.
    fn default() -> Self {
        CacheModel {
            enabled: true,
            l1_sets: 32,
            l1_ways: 4,
            l2_sets: 192,
            l2_ways: 8,
            l1_hit_ns: 20.0,
            l2_hit_ns: 138.0,
        }
    }
}

impl CacheModel {
    /// No caches: every access is a memory transaction.
    pub fn off() -> CacheModel {
        CacheModel {
            enabled: false,
            ..CacheModel::default()
        }
    }

    /// Bytes of one SM's L1.
    pub fn l1_bytes(&self) -> u64 {
        (self.l1_sets * self.l1_ways) as u64 * crate::memory::CHUNK
    }

    /// Bytes of one stack's L2.
    pub fn l2_bytes(&self) -> u64 {
        (self.l2_sets * self.l2_ways) as u64 * crate::memory::CHUNK
    }
}

impl fmt::Display for CacheModel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if !self.enabled {
            return write!(f, "no data caches");
        }
        write!(
            f,
            "L1 {} KiB/SM ({}x{} lines, {} ns), L2 {} KiB/stack ({}x{} lines, {} ns), 128-B lines, LRU, L1 write-through, L2 write-back",
            self.l1_bytes() >> 10,
            self.l1_sets,
            self.l1_ways,
            self.l1_hit_ns,
            self.l2_bytes() >> 10,
            self.l2_sets,
            self.l2_ways,
            self.l2_hit_ns
        )
    }
}

/// A near-data SM as the cost model sees it: it issues warp instructions at a fixed
/// rate, and its memory-level parallelism — the 128-byte line requests it can have in
/// flight at once — is bounded by what bounds it on real hardware:
/// - the L1's miss-status holding registers: a line request that leaves the L1 (to the
///   L2 or memory) holds one MSHR until its data returns, so at most `mshrs` are in
///   flight (later requests to a line already in flight merge into its MSHR; the data
///   cache model counts those as L1 hits);
/// - the warps' own dependence: a warp stops at the first use of a load it issued,
///   so it has at least one request in flight while it waits, and `warps` resident
///   warps hold at least `warps` requests (more if they issue several independent
///   loads before the first use, up to the MSHRs).
///
/// So the outstanding requests of an SM are [`SmModel::in_flight`] =
/// `min(mshrs, warps)`; every kernel of the experiment issues at least one load before
/// its first use, so that is a floor every kernel meets, and with Fermi's 48 warps and
/// 32 MSHRs the MSHRs bind for all of them. By Little's law an SM's memory throughput
/// is then at most `in_flight × 128 B / latency`, the latency being that of the path
/// the request takes (local, remote = local + hop, L2, L1). Queueing on a saturated
/// network is the other bound the cost model takes: when the demand exceeds a
/// network's bandwidth the queue grows until the latency makes Little's law meet that
/// bandwidth, which is the bandwidth bound `bytes / bandwidth` ([`crate::cost`]).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SmModel {
    /// SM clock, GHz.
    pub ghz: f64,
    /// Warp instructions issued per cycle.
    pub issue_per_cycle: f64,
    /// Threads of a warp (thread-level operations per warp instruction).
    pub warp_threads: u32,
    /// Resident warps (each waits at the first use of its load: at least one request
    /// in flight while it waits).
    pub warps: u32,
    /// Miss-status holding registers of the SM's L1: line requests in flight past it.
    pub mshrs: u32,
    /// Latency of a transaction to the SM's own stack, ns.
    pub local_latency_ns: f64,
    /// Latency a remote transaction adds (the network hop between stacks), ns.
    pub remote_hop_ns: f64,
}

impl Default for SmModel {
    /// A Fermi SM (GPGPU-Sim's GTX 480 configuration: 1536 resident threads = 48
    /// warps; 32 lanes at the 1401 MHz shader clock = one warp instruction per cycle;
    /// L1 data cache `-gpgpu_cache:dl1 32:128:4,L:L:m:N,A:32:8,16:0,32` — 32 MSHRs of
    /// up to 8 merged requests each. That option string is quoted from memory of the
    /// GPGPU-Sim distribution, not re-checked).
    /// Local latency 440 cycles at 1.4 GHz ≈ 314 ns, the global-memory latency Wong et
    /// al. measured on a GT200 (ISPASS 2010, "Demystifying GPU microarchitecture
    /// through microbenchmarking"); CODA's text gives no latency for its HBM stacks.
    ///
    /// The remote hop is derived, not fitted: [`RemoteHop::derived`] (the paper's
    /// processor-centric topology and the HMC link figures). Fig. 10 is an
    /// out-of-sample check of it. The 48 warps are what the occupancy calculator gives
    /// the experiment's 256-thread blocks ([`HbmConfig::for_kernel`] replaces them with
    /// a kernel's own).
    fn default() -> Self {
        SmModel {
            ghz: 1.4,
            issue_per_cycle: 1.0,
            warp_threads: 32,
            warps: 48,
            mshrs: 32,
            local_latency_ns: 314.0,
            remote_hop_ns: RemoteHop::derived().total_ns(),
        }
    }
}

/// The remote hop before issue 33: fitted once to Fig. 10's +8% at 256 GB/s (full
/// size). Kept only so the report can print the before / after; no run uses it.
pub const FITTED_REMOTE_HOP_NS: f64 = 80.0;

/// What a remote access adds to a local one, from the topology and a published link,
/// not fitted to any result of the paper.
///
/// Topology (CODA §2: the stacks are connected by "the processor-centric topology
/// proposed by Kim et al. \[20\]"): stacks link only to the host processor, so a
/// stack-to-stack access goes SM stack → host → target stack and its response comes
/// back the same way: four link traversals and two passes through the host's switch
/// per remote access.
///
/// Per traversal (the published part: HMC 1.0 links, 16 lanes × 10 Gbit/s = 20 GB/s
/// per direction, 16-byte FLITs; the SerDes and controller figures as gem5's HMC model
/// `configs/common/HMC.py` takes them from the HMC specification and Kim et al. \[20\]):
/// - SerDes 1.6 ns + board trace 3 ns + link controller 4 cycles at 625 MHz (6.4 ns)
///   = 11 ns (gem5's `--total-ctrl-latency`);
/// - serialization: a request is one FLIT (16 B, 0.8 ns at 20 GB/s); a 128-byte
///   response is 8 data FLITs plus one of header and tail (144 B, 7.2 ns), and the
///   deserializer waits for the whole packet (store and forward at the host).
///
/// The host's switch: 3 ns per pass, the HMC crossbar's 1-cycle arbitration + 2-cycle
/// forward at 1 GHz in the same gem5 model — an **assumption** (the host's switch is
/// not the cube's).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RemoteHop {
    /// Link traversals per remote access (request and response, two links each).
    pub traversals: u32,
    /// Fixed latency of one traversal (SerDes, trace, link controller), ns.
    pub per_traversal_ns: f64,
    /// Serialization of the request and of the response over all traversals, ns.
    pub serialization_ns: f64,
    /// Passes through the host's switch.
    pub switch_passes: u32,
    /// One pass through the host's switch, ns (an assumption).
    pub switch_ns: f64,
}

impl RemoteHop {
    /// The derivation above: 4 × 11 + (2 × 0.8 + 2 × 7.2) + 2 × 3 = 66 ns.
    pub fn derived() -> RemoteHop {
        let link_gbps = 16.0 * 10.0 / 8.0; // 16 lanes × 10 Gbit/s, GB/s
        let request = 16.0 / link_gbps; // one FLIT, ns
        let response = (128.0 + 16.0) / link_gbps; // 8 data FLITs + header/tail
        RemoteHop {
            traversals: 4,
            per_traversal_ns: 1.6 + 3.0 + 4.0 / 0.625,
            serialization_ns: 2.0 * request + 2.0 * response,
            switch_passes: 2,
            switch_ns: 3.0,
        }
    }

    /// The hop, ns.
    pub fn total_ns(&self) -> f64 {
        f64::from(self.traversals) * self.per_traversal_ns
            + self.serialization_ns
            + f64::from(self.switch_passes) * self.switch_ns
    }
}

/// The near-data SM's resources as the occupancy calculator sees them
/// (`gmem_regdem::occupancy`): a Fermi SM, compute capability 2.0 (GTX 480), from
/// NVIDIA's CUDA C Programming Guide (technical specifications by compute capability)
/// and its CUDA Occupancy Calculator: 32 K registers, 1536 threads and 8 blocks per SM,
/// 48 KiB shared memory, at most 63 registers per thread and 1024 threads per block,
/// registers allocated per warp in units of 64, shared memory in units of 128 bytes.
/// One register partition (the 2.x calculator does not split the file per scheduler;
/// an assumption about the calculator, exact for the kernels here, which the thread
/// or block slots bound).
pub fn fermi_sm() -> gmem_regdem::SmConfig {
    gmem_regdem::SmConfig {
        registers: 32_768,
        max_threads: 1536,
        max_blocks: 8,
        shared_bytes: 48 * 1024,
        max_shared_per_block: 48 * 1024,
        register_alloc_unit: 64,
        max_registers_per_thread: 63,
        warp_size: 32,
        max_threads_per_block: 1024,
        max_registers_per_block: 32_768,
        shared_alloc_unit: 128,
        register_sub_partitions: 1,
        schedulers: 2,
        shared_banks: 32,
        register_banks: 4,
        scoreboard_barriers: 6,
        fp32_lanes: 32,
        fp64_lanes: 16,
    }
}

/// Registers per thread of the experiment's kernels: an **assumption** (we do not
/// compile them). 20 is the most a 1536-thread Fermi SM can give every thread
/// (32768 / 1536 = 21.3, and the allocation rounds a warp's 21 × 32 up to 704), so the
/// thread slots, not the registers, bound the blocks — as in the paper's own example
/// of Eq. 1 (four SMs of six blocks, 24).
pub const ASSUMED_REGISTERS_PER_THREAD: u32 = 20;

/// What one thread block of a kernel asks of an SM (the occupancy calculator's input).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KernelShape {
    /// Threads per block.
    pub threads: u32,
    /// Registers per thread ([`ASSUMED_REGISTERS_PER_THREAD`] unless a kernel says).
    pub registers: u32,
    /// Shared memory per block, bytes.
    pub shared_bytes: u32,
}

impl KernelShape {
    /// A block of `threads` threads with the assumed registers and no shared memory.
    pub fn threads(threads: u32) -> KernelShape {
        KernelShape {
            threads,
            registers: ASSUMED_REGISTERS_PER_THREAD,
            shared_bytes: 0,
        }
    }

    /// The occupancy this kernel reaches on [`fermi_sm`].
    ///
    /// # Errors
    /// The calculator's, for a block no SM can hold.
    pub fn occupancy(&self) -> Result<gmem_regdem::Occupancy, gmem_regdem::OccupancyError> {
        gmem_regdem::occupancy(
            &fermi_sm(),
            &gmem_regdem::KernelResources {
                threads_per_block: self.threads,
                registers_per_thread: self.registers,
                shared_bytes_per_block: self.shared_bytes,
            },
        )
    }
}

impl SmModel {
    /// Line requests one SM keeps in flight: `min(mshrs, warps)`, at least 1.
    pub fn in_flight(&self) -> u32 {
        self.mshrs.min(self.warps).max(1)
    }
}

impl fmt::Display for SmModel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "SM {} GHz, {} warp instr/cycle, {} threads/warp, {} warps, {} L1 MSHRs ({} line requests in flight), local latency {} ns, remote hop +{} ns (derived: topology + HMC links)",
            self.ghz,
            self.issue_per_cycle,
            self.warp_threads,
            self.warps,
            self.mshrs,
            self.in_flight(),
            self.local_latency_ns,
            self.remote_hop_ns
        )
    }
}

impl Default for HbmConfig {
    /// Four stacks of four SMs, 16 MiB each at 1 GiB, 128-byte fine-grain chunks, 256 /
    /// 128 / 16 GB/s (CODA §5), Fermi SMs ([`SmModel::default`]) holding 6 blocks each
    /// (what [`HbmConfig::for_kernel`] gives the experiment's 256-thread blocks; a test
    /// checks the two agree).
    fn default() -> Self {
        HbmConfig {
            stacks: 4,
            sms_per_stack: 4,
            stack_bytes: 16 << 20,
            base: PhysAddr::new(1 << 30),
            fine_chunk: 128,
            local_gbps: 256.0,
            host_gbps: 128.0,
            remote_gbps: 16.0,
            sm: SmModel::default(),
            cache: CacheModel::default(),
            resident_blocks: 6,
        }
    }
}

/// Why a configuration is unusable.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ConfigError {
    /// Stacks not a power of two of at least 2.
    Stacks(u32),
    /// The fine-grain chunk is not a power of two that divides a page among the stacks.
    Chunk(u64),
    /// Stack size or base not aligned (4 KiB per stack, a page group at the base).
    Alignment,
    /// A data cache with no set or way, or more than 2^20 lines.
    Cache,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ConfigError::Stacks(n) => write!(f, "{n} stacks: need a power of two >= 2"),
            ConfigError::Chunk(c) => write!(f, "fine-grain chunk {c} does not divide a page"),
            ConfigError::Alignment => write!(f, "stack size or base not aligned"),
            ConfigError::Cache => write!(f, "data cache geometry out of range"),
        }
    }
}

impl core::error::Error for ConfigError {}

impl HbmConfig {
    /// Check the parameters.
    ///
    /// # Errors
    /// [`ConfigError`] naming the first bad one.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.stacks < 2 || !self.stacks.is_power_of_two() {
            return Err(ConfigError::Stacks(self.stacks));
        }
        let per_stack = PAGE_SIZE / u64::from(self.stacks);
        if !self.fine_chunk.is_power_of_two() || self.fine_chunk > per_stack {
            return Err(ConfigError::Chunk(self.fine_chunk));
        }
        if self.stack_bytes == 0
            || self.stack_bytes % PAGE_SIZE != 0
            || self.base.as_u64() % self.group_bytes() != 0
        {
            return Err(ConfigError::Alignment);
        }
        let c = &self.cache;
        let fits = |sets: usize, ways: usize| {
            sets > 0 && ways > 0 && sets.checked_mul(ways).is_some_and(|n| n <= 1 << 20)
        };
        if c.enabled && !(fits(c.l1_sets, c.l1_ways) && fits(c.l2_sets, c.l2_ways)) {
            return Err(ConfigError::Cache);
        }
        Ok(())
    }

    /// The machine running kernel `k`: its SMs hold the blocks and warps the occupancy
    /// calculator gives `k` on a Fermi SM ([`KernelShape::occupancy`]), which sets
    /// Eq. 1's blocks per stack and the warps in the SM's memory model.
    ///
    /// # Errors
    /// The calculator's, for a block no SM can hold.
    pub fn for_kernel(&self, k: &KernelShape) -> Result<HbmConfig, gmem_regdem::OccupancyError> {
        let o = k.occupancy()?;
        Ok(HbmConfig {
            resident_blocks: o.blocks_per_sm,
            sm: SmModel {
                warps: o.warps_per_sm,
                ..self.sm
            },
            ..*self
        })
    }

    /// Consecutive thread blocks one stack runs under affinity scheduling (Eq. 1's
    /// denominator): its SMs × the blocks each holds.
    pub fn blocks_per_stack(&self) -> u64 {
        u64::from(self.sms_per_stack) * u64::from(self.resident_blocks.max(1))
    }

    /// Frames of a page group: one per stack.
    pub fn group_frames(&self) -> u64 {
        u64::from(self.stacks)
    }

    /// `log2` of [`HbmConfig::group_frames`] (the core's page-group order).
    pub fn group_order(&self) -> u32 {
        self.stacks.trailing_zeros()
    }

    /// Bytes of a page group.
    pub fn group_bytes(&self) -> u64 {
        self.group_frames() * PAGE_SIZE
    }

    /// Bytes of the whole memory.
    pub fn total_bytes(&self) -> u64 {
        self.stack_bytes * u64::from(self.stacks)
    }

    /// One past the last physical address.
    pub fn end(&self) -> PhysAddr {
        PhysAddr::new(self.base.as_u64() + self.total_bytes())
    }

    /// SMs of the machine.
    pub fn sms(&self) -> u32 {
        self.stacks * self.sms_per_stack
    }

    /// The stack SM `sm` sits in.
    pub fn stack_of_sm(&self, sm: u32) -> u32 {
        sm / self.sms_per_stack
    }
}

impl fmt::Display for HbmConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} stacks x {} SMs ({} resident blocks each), {} MiB/stack, fine-grain chunk {} B, local {} GB/s, host {} GB/s, remote {} GB/s; {}; {}",
            self.stacks,
            self.sms_per_stack,
            self.resident_blocks,
            self.stack_bytes >> 20,
            self.fine_chunk,
            self.local_gbps,
            self.host_gbps,
            self.remote_gbps,
            self.sm,
            self.cache
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The default's 6 resident blocks and 48 warps are what the occupancy calculator
    /// gives a 256-thread block on the Fermi SM (thread slots bind: 1536 / 256), and a
    /// Rodinia-style 4 × 4 block is held 8 at a time (block slots bind).
    #[test]
    fn default_residency_is_the_occupancy_calculators() {
        let d = HbmConfig::default();
        let k = d.for_kernel(&KernelShape::threads(256)).unwrap();
        assert_eq!((k.resident_blocks, k.sm.warps), (6, 48));
        assert_eq!(k, d);
        assert_eq!(d.blocks_per_stack(), 24);
        let small = d.for_kernel(&KernelShape::threads(16)).unwrap();
        assert_eq!((small.resident_blocks, small.sm.warps), (8, 8));
        let fat = KernelShape {
            registers: 40,
            ..KernelShape::threads(256)
        };
        assert!(d.for_kernel(&fat).unwrap().resident_blocks < 6);
        assert!(d.for_kernel(&KernelShape::threads(0)).is_err());
    }

    /// The derived hop: 4 × 11 ns + 16 ns of serialization + 2 × 3 ns.
    #[test]
    fn the_remote_hop_is_the_topologys_sum() {
        let h = RemoteHop::derived();
        assert!((h.per_traversal_ns - 11.0).abs() < 1e-9);
        assert!((h.serialization_ns - 16.0).abs() < 1e-9);
        assert!((h.total_ns() - 66.0).abs() < 1e-9);
        assert_eq!(SmModel::default().remote_hop_ns, h.total_ns());
    }
}
