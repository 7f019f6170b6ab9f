//! The cost model that turns counted traffic and work into time (CODA §5, rebuilt: the
//! paper's Table 1 was an image; its prose gives 256 GB/s of internal bandwidth per
//! stack for the SMs in its logic layer, 128 GB/s aggregate for the host network and
//! 16 GB/s for the remote network, swept up to 256 GB/s aggregate; the SMs' clock,
//! warps and latencies come from a Fermi SM, [`crate::config::SmModel`]).
//!
//! It claims the *shape* of the paper's results, not a cycle-level timing (no queueing,
//! no DRAM timing). Traffic is what got past the SMs' data caches ([`crate::dcache`]):
//! line misses and write-backs.
//! - **near-data kernels, bandwidth bound:** each stack's SMs pull their local bytes
//!   at the local bandwidth; all remote bytes share the remote network:
//!   `max(max_s local_s / local, remote / remote_bw)`.
//! - **near-data kernels, SM bound:** each SM issues the warp instructions of the
//!   blocks it ran (`thread ops / warp threads / issue rate / clock`), and waits on its
//!   memory accesses with [`crate::config::SmModel::in_flight`] of them in flight
//!   (`min(L1 MSHRs, warps)`, Little's law:
//!   `(l1_hits · L1 + l2_hits · L2 + local_tx · L + remote_tx · (L + hop)) / in_flight`,
//!   a store counting as an L2 access: write-backs are posted, so they load the
//!   bandwidth bound, not an SM's wait); the SM takes the larger of the two. Thread operations are the executor's counts of what the kernel did: one
//!   per word loaded or stored, plus the arithmetic instructions the kernel reports at
//!   the point it computes them (a multiply-add is one, [`crate::exec::Ctx::alu`]) and
//!   its threads' reads of words the block holds on chip ([`crate::exec::Ctx::reads`]).
//! - a kernel takes the larger of the two bounds. A stack that got more thread blocks
//!   (affinity without work stealing) takes longer, which the per-stack and per-SM
//!   maxima keep.
//! - **host-side execution:** the host walks the work one thread block's footprint at
//!   a time; each stack's link carries `host / stacks`; a window takes
//!   `max_s host_s / (host / stacks)`, and the windows add up. A fine-grain page spreads
//!   over every link, a coarse one uses one: the reason fine grain suits the host.
//!   (Bandwidth only: the host's latency is the same under every placement.)
//!
//! The same [`HbmConfig`] prices every configuration of an experiment.

use crate::config::HbmConfig;
use crate::memory::{Traffic, CHUNK};
use alloc::vec::Vec;

/// What one SM did during a launch.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SmLoad {
    /// Thread-level operations (words loaded or stored, arithmetic reported).
    pub thread_ops: u64,
    /// Bytes of its transactions to its own stack.
    pub local: u64,
    /// Bytes of its transactions to other stacks.
    pub remote: u64,
    /// Its line loads served by its L1.
    pub l1_hits: u64,
    /// Its line loads served by its stack's L2, and its line stores.
    pub l2_hits: u64,
}

/// The time in ns one SM needs for `load`: the larger of its issue time and its
/// memory time with [`crate::config::SmModel::in_flight`] line requests in flight.
pub fn sm_bound_ns(cfg: &HbmConfig, load: &SmLoad) -> f64 {
    issue_ns(cfg, load).max(memory_ns(cfg, load))
}

/// An SM's issue time for `load`, ns.
fn issue_ns(cfg: &HbmConfig, load: &SmLoad) -> f64 {
    let m = &cfg.sm;
    load.thread_ops as f64 / f64::from(m.warp_threads.max(1)) / (m.issue_per_cycle * m.ghz)
}

/// An SM's memory time for `load` with its requests in flight, ns.
fn memory_ns(cfg: &HbmConfig, load: &SmLoad) -> f64 {
    let m = &cfg.sm;
    let chunk = CHUNK as f64;
    (load.local as f64 / chunk * m.local_latency_ns
        + load.remote as f64 / chunk * (m.local_latency_ns + m.remote_hop_ns)
        + load.l1_hits as f64 * cfg.cache.l1_hit_ns
        + load.l2_hits as f64 * cfg.cache.l2_hit_ns)
        / f64::from(m.in_flight())
}

/// The time in ns of a near-data launch: the larger of its bandwidth bound
/// ([`bandwidth_ns`]) and its slowest SM ([`sm_bound_ns`]).
pub fn sm_time_ns(cfg: &HbmConfig, by_stack: &[Traffic], sms: &[SmLoad]) -> f64 {
    sms.iter()
        .map(|l| sm_bound_ns(cfg, l))
        .fold(bandwidth_ns(cfg, by_stack), f64::max)
}

/// What set a near-data launch's time: the larger of its bounds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Bound {
    /// The busiest stack's local bandwidth.
    LocalNet,
    /// The remote network's bandwidth.
    RemoteNet,
    /// The slowest SM's instruction issue.
    SmIssue,
    /// The slowest SM's memory latency over its requests in flight (Little's law).
    SmMemory,
}

impl Bound {
    /// Every bound, in [`Bound::index`] order.
    pub const ALL: [Bound; 4] = [
        Bound::LocalNet,
        Bound::RemoteNet,
        Bound::SmIssue,
        Bound::SmMemory,
    ];

    /// Its index in [`Bound::ALL`].
    pub fn index(self) -> usize {
        self as usize
    }

    /// A short name.
    pub fn name(self) -> &'static str {
        match self {
            Bound::LocalNet => "local-net",
            Bound::RemoteNet => "remote-net",
            Bound::SmIssue => "sm-issue",
            Bound::SmMemory => "sm-memory",
        }
    }
}

/// The bound that sets a near-data launch's time and that time in ns (the same time
/// as [`sm_time_ns`]; ties go to the first of [`Bound::ALL`]).
pub fn binding(cfg: &HbmConfig, by_stack: &[Traffic], sms: &[SmLoad]) -> (Bound, f64) {
    let local = by_stack
        .iter()
        .map(|t| t.local as f64 / cfg.local_gbps)
        .fold(0.0, f64::max);
    let remote = by_stack.iter().map(|t| t.remote).sum::<u64>() as f64 / cfg.remote_gbps;
    let (mut issue, mut memory) = (0.0f64, 0.0f64);
    for l in sms {
        let i = issue_ns(cfg, l);
        issue = issue.max(i);
        memory = memory.max(memory_ns(cfg, l));
    }
    let candidates = [local, remote, issue, memory];
    let mut best = (Bound::LocalNet, local);
    for (b, t) in Bound::ALL.into_iter().zip(candidates) {
        if t > best.1 {
            best = (b, t);
        }
    }
    best
}

/// The bandwidth bound in ns of a near-data phase whose traffic by stack (SM traffic
/// at the requesting SM's stack) is `by_stack`.
pub fn bandwidth_ns(cfg: &HbmConfig, by_stack: &[Traffic]) -> f64 {
    let local = by_stack
        .iter()
        .map(|t| t.local as f64 / cfg.local_gbps)
        .fold(0.0, f64::max);
    let remote: u64 = by_stack.iter().map(|t| t.remote).sum();
    local.max(remote as f64 / cfg.remote_gbps)
}

/// The time in ns of one window of host traffic (by serving stack).
pub fn host_window_ns(cfg: &HbmConfig, by_stack: &[Traffic]) -> f64 {
    let link = cfg.host_gbps / f64::from(cfg.stacks.max(1));
    by_stack
        .iter()
        .map(|t| t.host as f64 / link)
        .fold(0.0, f64::max)
}

/// `after - before`, stack by stack.
pub fn delta(after: &[Traffic], before: &[Traffic]) -> Vec<Traffic> {
    after
        .iter()
        .zip(before)
        .map(|(a, b)| Traffic {
            local: a.local - b.local,
            remote: a.remote - b.remote,
            host: a.host - b.host,
        })
        .collect()
}

/// The sum of per-stack traffic.
pub fn total(by_stack: &[Traffic]) -> Traffic {
    by_stack.iter().fold(Traffic::default(), |a, t| Traffic {
        local: a.local + t.local,
        remote: a.remote + t.remote,
        host: a.host + t.host,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_slowest_path_bounds_a_kernel_and_a_host_window() {
        let cfg = HbmConfig::default();
        let t = |local, remote, host| Traffic {
            local,
            remote,
            host,
        };
        // 256 bytes local on stack 0 (1 ns) vs 32 remote bytes (2 ns).
        let by = [t(256, 16, 0), t(0, 16, 0), t(0, 0, 0), t(0, 0, 0)];
        assert!((bandwidth_ns(&cfg, &by) - 2.0).abs() < 1e-9);
        // One stack's link is 32 GB/s: 64 bytes there take 2 ns; spread, 0.5 ns.
        let one = [t(0, 0, 64), t(0, 0, 0), t(0, 0, 0), t(0, 0, 0)];
        let spread = [t(0, 0, 16), t(0, 0, 16), t(0, 0, 16), t(0, 0, 16)];
        assert!((host_window_ns(&cfg, &one) - 2.0).abs() < 1e-9);
        assert!((host_window_ns(&cfg, &spread) - 0.5).abs() < 1e-9);
        assert_eq!(total(&by).remote, 32);
        assert_eq!(delta(&by, &by)[0], Traffic::default());
    }

    #[test]
    fn an_sm_waits_on_its_slowest_of_issue_and_latency_and_remote_costs_a_hop() {
        let cfg = HbmConfig::default();
        let m = cfg.sm;
        let w = f64::from(m.in_flight());
        // 32 MSHRs bind before 48 warps do.
        assert_eq!(m.in_flight(), 32);
        let few_warps = HbmConfig {
            sm: crate::config::SmModel { warps: 8, ..m },
            ..cfg
        };
        assert_eq!(few_warps.sm.in_flight(), 8);
        // 48 local transactions: 48 / 32 round trips of the local latency.
        let local = SmLoad {
            local: 48 * CHUNK,
            ..SmLoad::default()
        };
        assert!((sm_bound_ns(&cfg, &local) - m.local_latency_ns * 48.0 / w).abs() < 1e-9);
        let remote = SmLoad {
            remote: 48 * CHUNK,
            ..local
        };
        assert!(sm_bound_ns(&cfg, &remote) > sm_bound_ns(&cfg, &local));
        // Pure arithmetic: 32 000 thread ops are 1000 warp instructions.
        let alu = SmLoad {
            thread_ops: 32_000,
            ..SmLoad::default()
        };
        assert!((sm_bound_ns(&cfg, &alu) - 1000.0 / m.ghz).abs() < 1e-9);
        // The kernel takes the slower of the bandwidth and the SM bound.
        let by = [Traffic::default(); 4];
        assert!((sm_time_ns(&cfg, &by, &[alu, local]) - sm_bound_ns(&cfg, &alu)).abs() < 1e-9);
        // ... and says which bound that was.
        let (b, t) = binding(&cfg, &by, &[alu, local]);
        assert_eq!(b, Bound::SmIssue);
        assert!((t - sm_time_ns(&cfg, &by, &[alu, local])).abs() < 1e-9);
        assert_eq!(binding(&cfg, &by, &[local]).0, Bound::SmMemory);
        let far = [Traffic {
            remote: 1 << 20,
            ..Traffic::default()
        }; 4];
        assert_eq!(binding(&cfg, &far, &[alu, local]).0, Bound::RemoteNet);
        // Fewer warps than MSHRs: the warps bind, four times longer here.
        let slow = sm_bound_ns(&few_warps, &local);
        assert!((slow - 4.0 * sm_bound_ns(&cfg, &local)).abs() < 1e-6);
        // 48 L1 hits wait 48 / 32 L1 latencies, 48 L2 hits as many L2 latencies: both
        // below memory.
        let l1 = SmLoad {
            l1_hits: 48,
            ..SmLoad::default()
        };
        let l2 = SmLoad {
            l2_hits: 48,
            ..SmLoad::default()
        };
        assert!((sm_bound_ns(&cfg, &l1) - cfg.cache.l1_hit_ns * 48.0 / w).abs() < 1e-9);
        assert!(sm_bound_ns(&cfg, &l1) < sm_bound_ns(&cfg, &l2));
        assert!(sm_bound_ns(&cfg, &l2) < sm_bound_ns(&cfg, &local));
    }
}
