//! The bandwidth model that turns counted traffic into time (CODA §5, rebuilt: the
//! paper's Table 1 was an image; its prose gives 256 GB/s of internal bandwidth per
//! stack for the SMs in its logic layer, 128 GB/s aggregate for the host network and
//! 16 GB/s for the remote network, swept up to 256 GB/s aggregate).
//!
//! A bandwidth-only model — no latency, no caches, no compute — so it claims the
//! *shape* of the paper's results, not their magnitude:
//! - **near-data kernels:** each stack's SMs pull their local bytes at the local
//!   bandwidth; all remote bytes share the remote network; the paths work in parallel
//!   and the slowest bounds the kernel: `max(max_s local_s / local, remote / remote)`.
//!   A stack that got more thread blocks (affinity without work stealing) takes
//!   longer, which the per-stack maximum keeps.
//! - **host-side execution:** the host walks the work one thread block's footprint at
//!   a time; each stack's link carries `host / stacks`; a window takes
//!   `max_s host_s / (host / stacks)`, and the windows add up. A fine-grain page spreads
//!   over every link, a coarse one uses one: the reason fine grain suits the host.
//!
//! The same [`HbmConfig`] prices every configuration of an experiment.

use crate::config::HbmConfig;
use crate::memory::Traffic;
use alloc::vec::Vec;

/// The time in ns of a near-data phase whose traffic by stack (SM traffic at the
/// requesting SM's stack) is `by_stack`.
pub fn sm_time_ns(cfg: &HbmConfig, by_stack: &[Traffic]) -> f64 {
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
        assert!((sm_time_ns(&cfg, &by) - 2.0).abs() < 1e-9);
        // One stack's link is 32 GB/s: 64 bytes there take 2 ns; spread, 0.5 ns.
        let one = [t(0, 0, 64), t(0, 0, 0), t(0, 0, 0), t(0, 0, 0)];
        let spread = [t(0, 0, 16), t(0, 0, 16), t(0, 0, 16), t(0, 0, 16)];
        assert!((host_window_ns(&cfg, &one) - 2.0).abs() < 1e-9);
        assert!((host_window_ns(&cfg, &spread) - 0.5).abs() < 1e-9);
        assert_eq!(total(&by).remote, 32);
        assert_eq!(delta(&by, &by)[0], Traffic::default());
    }
}
