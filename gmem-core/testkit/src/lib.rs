//! # gmem-testkit: one op-sequence runner for tests and fuzz targets
//!
//! A runner applies a sequence of operations to the real code and, after every
//! operation, compares the whole observable state with a reference model that is too
//! simple to be wrong (the idea of `fitzgen/associative-cache`'s test utilities). The
//! same runners serve three callers:
//! - `cargo test -p gmem-testkit` feeds them seeded pseudo-random sequences
//!   (`tests/seeded.rs`) and replays minimized fuzz findings (`tests/regressions.rs`);
//! - the fuzz targets in `fuzz/` feed them whatever libFuzzer produces, decoded with
//!   [`arbitrary`];
//! - a developer reproducing a failure replays a byte string with [`replay_kpi`] or
//!   [`replay_vmem`].
//!
//! Four runners (the two below, and [`page_table`] for the x86-64 driver tables
//! against a map model, [`trace`] for the trace parsers of `gmem-trace` on arbitrary text):
//! - [`vmem`]: one [`gmem_core::vmem::Arena`] (any quantum, quantum caches with or
//!   without magazines, checked or trusted frees, any fit policy) against a brute-force
//!   interval model: every allocation is checked for overlap, placement and
//!   constraints; every `NoSpace` is checked against an exhaustive search; every
//!   misuse must get its typed error and change nothing; counters must balance.
//! - [`kpi`]: a [`gmem_core::testing::TestSystem`] with a host, a discrete device with
//!   memory, an integrated device without memory and a device that cannot fault,
//!   driven through the whole KPI, against a model of spaces, regions and their bytes.
//!   After every operation it runs [`gmem_core::Gmem::check_invariants`] on every live
//!   space and checks that no TLB holds a translation its page table no longer has.
//!
//! - [`private`]: device-private frames (ADSM/GMAC's one pointer, two copies) on a
//!   host and a device that cannot fault, against a model of both copies of every
//!   page, with `check_invariants` and the device's frame counts after every operation.
//!
//! Beside the runners, [`frag`] holds a seeded fragmenter that brings a device's
//! memory to a chosen unusable-free-space index (for compaction tests and the
//! fragmentation sweeps of the harness).
//!
//! A runner reports a broken expectation by panicking with a message that names the
//! operation, what was expected and what happened: a fuzzer records the panic as a
//! crash, a test fails with the message.

pub mod frag;
pub mod kpi;
pub mod page_table;
pub mod private;
pub mod trace;
pub mod vmem;

use arbitrary::{Arbitrary, Unstructured};

/// A small deterministic generator (xorshift64*) for seeded sequences: the same seed
/// gives the same bytes on every machine.
#[derive(Clone, Debug)]
pub struct SeedBytes(u64);

impl SeedBytes {
    /// A generator for `seed` (any value, 0 included).
    pub fn new(seed: u64) -> SeedBytes {
        SeedBytes(seed ^ 0x9e37_79b9_7f4a_7c15)
    }

    /// The next 64 pseudo-random bits.
    pub fn next_u64(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// `n` pseudo-random bytes.
    pub fn bytes(&mut self, n: usize) -> Vec<u8> {
        let mut out = Vec::with_capacity(n + 8);
        while out.len() < n {
            out.extend_from_slice(&self.next_u64().to_le_bytes());
        }
        out.truncate(n);
        out
    }
}

/// Decode up to `max` values of `T` from what is left of `u`.
fn decode_ops<'a, T: Arbitrary<'a>>(u: &mut Unstructured<'a>, max: usize) -> Vec<T> {
    let mut ops = Vec::new();
    while ops.len() < max && !u.is_empty() {
        match T::arbitrary(u) {
            Ok(op) => ops.push(op),
            Err(_) => break,
        }
    }
    ops
}

/// Decode a vmem configuration and operation list from raw bytes and run them;
/// returns what the run did.
pub fn replay_vmem(data: &[u8]) -> Summary {
    let mut u = Unstructured::new(data);
    let Ok(config) = vmem::VmemConfig::arbitrary(&mut u) else {
        return Summary::default();
    };
    let ops: Vec<vmem::VmemOp> = decode_ops(&mut u, vmem::MAX_OPS);
    vmem::VmemRunner::new(config).run(&ops)
}

/// Decode a KPI setup and operation list from raw bytes and run them; returns what
/// the run did.
pub fn replay_kpi(data: &[u8]) -> Summary {
    let mut u = Unstructured::new(data);
    let Ok(setup) = kpi::Setup::arbitrary(&mut u) else {
        return Summary::default();
    };
    let ops: Vec<kpi::Op> = decode_ops(&mut u, kpi::MAX_OPS);
    kpi::KpiRunner::new(setup).run(&ops)
}

/// Run the KPI runner on the configuration seed `seed` decodes into (4096
/// [`SeedBytes`], changed by `tweak`) and the operations `opening`, then those the seed
/// decodes into (up to [`kpi::MAX_OPS`] in all): a seeded sequence that starts where a
/// test wants it to. A runner failure panics naming the seed.
pub fn replay_kpi_after(
    seed: u64,
    tweak: impl FnOnce(&mut kpi::Setup),
    opening: Vec<kpi::Op>,
) -> Summary {
    let data = SeedBytes::new(seed).bytes(4096);
    let mut u = Unstructured::new(&data);
    let mut setup = kpi::Setup::arbitrary(&mut u).expect("4096 bytes hold a setup");
    tweak(&mut setup);
    let mut ops = opening;
    let rest: Vec<kpi::Op> = decode_ops(&mut u, kpi::MAX_OPS.saturating_sub(ops.len()));
    ops.extend(rest);
    let r = std::panic::catch_unwind(move || kpi::KpiRunner::new(setup).run(&ops));
    r.unwrap_or_else(|_| panic!("seed {seed} failed"))
}

/// Decode a page-table configuration and operation list from raw bytes and run them
/// against the map model.
pub fn replay_page_table(data: &[u8]) -> Summary {
    let mut u = Unstructured::new(data);
    let Ok(config) = page_table::PtConfig::arbitrary(&mut u) else {
        return Summary::default();
    };
    let ops: Vec<page_table::PtOp> = decode_ops(&mut u, page_table::MAX_OPS);
    page_table::PtRunner::new(config).run(&ops)
}

/// Decode a private-frame setup and operation list from raw bytes and run them
/// against the two-copy model ([`private`]).
pub fn replay_private(data: &[u8]) -> Summary {
    let mut u = Unstructured::new(data);
    let Ok(setup) = private::PrivateSetup::arbitrary(&mut u) else {
        return Summary::default();
    };
    let ops: Vec<private::PrivateOp> = decode_ops(&mut u, private::MAX_OPS);
    private::PrivateRunner::new(setup).run(&ops)
}

/// Run the trace parsers over raw bytes.
pub fn replay_trace(data: &[u8]) -> Summary {
    trace::run(data)
}

/// What a run did, so that a test can tell a run that exercised something from one
/// that only bounced off errors.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Summary {
    /// Operations applied.
    pub ops: u64,
    /// Calls that succeeded (allocations, frees, accesses, ...).
    pub succeeded: u64,
    /// Calls that failed with the typed error the model predicted.
    pub rejected: u64,
    /// Bytes read back and compared with the model.
    pub bytes_checked: u64,
    /// Pages `dev_compact` moved (their bytes are checked by later reads).
    pub pages_compacted: u64,
    /// KPI runner: large leaves the core asked for.
    pub large_maps: u64,
    /// KPI runner: large leaves split.
    pub large_splits: u64,
    /// KPI runner: blocks promoted.
    pub promotions: u64,
    /// KPI runner: DMA mappings made (`dma_map`) and unmapped (`dma_unmap`).
    pub dma_maps: u64,
    /// KPI runner: DMA mappings unmapped, their frames' bytes checked in memory.
    pub dma_unmaps: u64,
    /// KPI runner: fault batches the core served (`Stats::fault_batches`).
    pub fault_batches: u64,
    /// KPI runner: pages the tree prefetcher brought (`Stats::pages_prefetched`).
    pub pages_prefetched: u64,
    /// KPI runner: read-only copies made (`Stats::read_duplications`).
    pub read_duplications: u64,
    /// KPI runner: read-only copies dropped (`Stats::read_copies_dropped`).
    pub read_copies_dropped: u64,
    /// KPI runner: pages the thrashing detectors pinned (`ThrashingStats::pins`).
    pub thrashing_pins: u64,
    /// KPI runner: throttle hints the thrashing detectors gave.
    pub thrashing_throttles: u64,
    /// KPI runner: faults answered `Throttled` (each checked to change nothing).
    pub throttled: u64,
    /// KPI runner: pins `as_expire_pins` ended.
    pub pins_expired: u64,
}

impl core::ops::AddAssign for Summary {
    fn add_assign(&mut self, o: Summary) {
        self.ops += o.ops;
        self.succeeded += o.succeeded;
        self.rejected += o.rejected;
        self.bytes_checked += o.bytes_checked;
        self.pages_compacted += o.pages_compacted;
        self.large_maps += o.large_maps;
        self.large_splits += o.large_splits;
        self.promotions += o.promotions;
        self.dma_maps += o.dma_maps;
        self.dma_unmaps += o.dma_unmaps;
        self.fault_batches += o.fault_batches;
        self.pages_prefetched += o.pages_prefetched;
        self.read_duplications += o.read_duplications;
        self.read_copies_dropped += o.read_copies_dropped;
        self.thrashing_pins += o.thrashing_pins;
        self.thrashing_throttles += o.thrashing_throttles;
        self.throttled += o.throttled;
        self.pins_expired += o.pins_expired;
    }
}
