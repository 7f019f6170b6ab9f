//! The machine's parameters (CODA §5): stacks, near-data SMs, memory, the fine-grain
//! chunk, the bandwidths of the three kinds of path and the near-data SM model
//! ([`SmModel`]). Experiments print them.
//!
//! CODA's Table 1 (the simulated system) was an image and is missing from the text;
//! the prose gives four stacks of four SMs, 128-byte / 4 KiB interleaving and the
//! 256 / 128 / 16 GB/s bandwidths. It says nothing of the SMs' clock, warps or memory
//! latency, so [`SmModel`] takes them from a published GPU (Fermi, GTX 480) and
//! calibrates one parameter, the remote hop, once (see [`SmModel::default`]).

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
    /// The remote hop is the one calibrated parameter: chosen once so that CODA's
    /// geomean speedup over fine-grain only at 256 GB/s of remote bandwidth comes
    /// near the paper's Fig. 10 (+8%) on the full-size experiment, then left alone
    /// for every configuration, workload and bandwidth (16 GB/s is not fitted).
    fn default() -> Self {
        SmModel {
            ghz: 1.4,
            issue_per_cycle: 1.0,
            warp_threads: 32,
            warps: 48,
            mshrs: 32,
            local_latency_ns: 314.0,
            remote_hop_ns: REMOTE_HOP_NS,
        }
    }
}

/// The calibrated remote hop, ns (see [`SmModel::default`]).
///
/// Calibration (once, all other parameters fixed), CODA's geomean over fine grain at
/// 256 GB/s remote: full size 80 ns → 1.08x, 100 ns → 1.09x, 150 ns → 1.14x; quick
/// size 0 ns → 0.99x, 600 ns → 1.43x. 80 ns (~112 cycles at 1.4 GHz) was taken.
/// That was with one request in flight per warp (48); with the MSHR bound (32 in
/// flight, [`SmModel::in_flight`]) the full run gives 1.07x at 256 GB/s with the same
/// 80 ns, close enough that it was not re-calibrated.
pub const REMOTE_HOP_NS: f64 = 80.0;

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
            "SM {} GHz, {} warp instr/cycle, {} threads/warp, {} warps, {} L1 MSHRs ({} line requests in flight), local latency {} ns, remote hop +{} ns (calibrated)",
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
    /// 128 / 16 GB/s (CODA §5), Fermi SMs ([`SmModel::default`]).
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
            "{} stacks x {} SMs, {} MiB/stack, fine-grain chunk {} B, local {} GB/s, host {} GB/s, remote {} GB/s; {}; {}",
            self.stacks,
            self.sms_per_stack,
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
