//! `aging` — FIFO against CLOCK (second chance on accessed bits) eviction of the discrete
//! GPU's memory, on the same workloads in one run: GMEM Table 4's back-propagation
//! traffic (device memory at the paper's 72.7% and 145.5% of the working set) and a
//! skewed hot/cold workload (90% of accesses to 10% of the pages, device memory half
//! of the working set). For each it prints the bytes moved each way, the evictions by
//! policy, the pages the CLOCK scan examined and the second chances it gave; every run
//! verifies its bytes against a CPU-only reference.
//!
//! Nothing here is a cost model: the figures are the core's counters after the run.

use crate::machine::{self, Accel, Machine, On};
use crate::reproduce::PAPER;
use crate::workloads;
use gmem_core::{AllocRequest, EvictionPolicy, Stats, PAGE_SIZE};

const MIB: f64 = (1 << 20) as f64;

/// One workload under one policy.
#[derive(Clone, Debug)]
pub struct AgingRow {
    /// The workload and its device-memory size.
    pub workload: String,
    /// The policy.
    pub policy: EvictionPolicy,
    /// The core's counters at the end.
    pub stats: Stats,
    /// Whether every byte matched the CPU-only reference.
    pub verified: bool,
}

/// Run every workload under FIFO and CLOCK: back-propagation with `inputs` input units
/// and `steps` steps, the hot/cold workload on `pages` pages with `accesses` accesses.
///
/// # Errors
/// A machine that cannot be built or an access the core refused.
pub fn run(inputs: u64, steps: u32, pages: u64, accesses: u64) -> Result<Vec<AgingRow>, String> {
    let mut rows = Vec::new();
    for policy in [EvictionPolicy::Fifo, EvictionPolicy::Clock] {
        let old = machine::set_gpu_eviction_policy(policy);
        let r = run_policy(policy, inputs, steps, pages, accesses, &mut rows);
        machine::set_gpu_eviction_policy(old);
        r?;
    }
    rows.sort_by(|a, b| a.workload.cmp(&b.workload));
    Ok(rows)
}

fn run_policy(
    policy: EvictionPolicy,
    inputs: u64,
    steps: u32,
    pages: u64,
    accesses: u64,
    rows: &mut Vec<AgingRow>,
) -> Result<(), String> {
    for (paper_dev, ..) in PAPER {
        // The same device sizes as `reproduce gmem-table4`.
        let percent_x10 = (paper_dev / 137.5 * 1000.0).round() as u64;
        let dev = |w: u64| (w.div_ceil(PAGE_SIZE) * percent_x10 / 1000).max(1);
        let o = workloads::backprop(inputs, steps, |w| Accel::Discrete { pages: dev(w) })?;
        rows.push(AgingRow {
            workload: format!(
                "table4 backprop, device {:.1}% of {:.1} MiB",
                percent_x10 as f64 / 10.0,
                o.working_set as f64 / MIB
            ),
            policy,
            stats: o.stats,
            verified: o.mismatches == 0,
        });
    }
    let (stats, verified) = hot_cold(pages, accesses)?;
    rows.push(AgingRow {
        workload: format!("hot/cold 90/10, {pages} pages, device 50%"),
        policy,
        stats,
        verified,
    });
    Ok(())
}

/// Words of a page.
const WORDS: u64 = PAGE_SIZE / 4;

/// The skewed workload: `pages` pages of u32 counters; each access picks a hot page
/// (every tenth page) with probability 0.9, else any page, and the GPU increments one
/// counter of it. The device holds half the pages. At the end the CPU reads every
/// counter back and compares with the reference.
fn hot_cold(pages: u64, accesses: u64) -> Result<(Stats, bool), String> {
    let bytes = pages * PAGE_SIZE;
    let m = Machine::new(2 * pages + 1024, Accel::Discrete { pages: pages / 2 })?;
    let r = m
        .gm()
        .as_alloc(m.space(), AllocRequest::new(bytes))
        .map_err(|e| e.to_string())?;
    let mut reference = vec![0u32; (pages * WORDS) as usize];
    let mut rng = 0x9E37_79B9_7F4A_7C15u64;
    let mut next = || {
        rng ^= rng >> 12;
        rng ^= rng << 25;
        rng ^= rng >> 27;
        rng.wrapping_mul(0x2545_F491_4F6C_DD1D)
    };
    let hot = pages.div_ceil(10);
    for _ in 0..accesses {
        let x = next();
        let page = if x % 10 != 0 {
            (next() % hot) * 10
        } else {
            next() % pages
        };
        let word = page * WORDS + next() % WORDS;
        let v = m.load_u32(On::Gpu, r, word, 1)?[0].wrapping_add(1);
        m.store_u32(On::Gpu, r, word, &[v])?;
        reference[word as usize] = reference[word as usize].wrapping_add(1);
    }
    let mut ok = true;
    for p in 0..pages {
        let got = m.load_u32(On::Cpu, r, p * WORDS, WORDS as usize)?;
        ok &= got[..] == reference[(p * WORDS) as usize..((p + 1) * WORDS) as usize];
    }
    m.check()?;
    Ok((m.gm().stats(), ok))
}

/// The rows as a text table.
pub fn render(rows: &[AgingRow]) -> String {
    let mut out = format!(
        "{:<48} {:<6} {:>10} {:>10} {:>9} {:>9} {:>9} {:>9} {:>9} {}\n",
        "workload",
        "policy",
        "h2d MiB",
        "d2h MiB",
        "evict",
        "by clock",
        "by fifo",
        "scanned",
        "2nd chc",
        "verified"
    );
    for r in rows {
        let s = &r.stats;
        out += &format!(
            "{:<48} {:<6} {:>10.1} {:>10.1} {:>9} {:>9} {:>9} {:>9} {:>9} {}\n",
            r.workload,
            format!("{:?}", r.policy),
            s.bytes_host_to_dev as f64 / MIB,
            s.bytes_dev_to_host as f64 / MIB,
            s.evictions,
            s.evictions_clock,
            s.evictions_fifo,
            s.pages_scanned,
            s.second_chances,
            r.verified
        );
    }
    out
}
