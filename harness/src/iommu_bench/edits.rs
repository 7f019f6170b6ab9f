//! Table 3's page-table disciplines measured alone: threads edit one IOMMU table
//! directly, with no core, DMA or invalidation above them.

use super::{thread_cpu, IOVA_BEGIN, RING, THREADS};
use gmem_core::{DeviceId, MapRun, PageSize, PhysAddr, Prot, VirtAddr, PAGE_SIZE};
use gmem_iommu::{Discipline, IoTableStats, IoTables};
use gmem_sim::TableFormat;
use std::sync::Barrier;
use std::time::{Duration, Instant};

/// One page-table discipline measured alone (driver level).
#[derive(Clone, Debug, serde::Serialize)]
pub struct EditRow {
    /// The discipline.
    pub discipline: &'static str,
    /// Threads editing the same tables.
    pub threads: usize,
    /// Unmap + map pairs (all threads).
    pub pairs: u64,
    /// Millions of pairs per second.
    pub mpairs_per_s: f64,
    /// CPU nanoseconds per pair.
    pub cpu_ns_per_pair: f64,
    /// Pairs/s over the locked discipline's (same threads).
    pub vs_locked: f64,
    /// Writer-side lock acquisitions to reclaim (reader-writer discipline).
    pub writer_reclaims: u64,
    /// Intermediate-table installs that lost a CAS race.
    pub cas_lost: u64,
}

const DISCIPLINES: [(Discipline, &str); 3] = [
    (Discipline::Locked, "locked"),
    (Discipline::Cas, "CAS"),
    (Discipline::Rw, "RW"),
];

/// `threads` threads edit one IOMMU table directly, as the driver's MMU functions would
/// if nothing above serialised them: each keeps [`RING`] pages of its own mapped,
/// interleaved with the other threads' pages in the same leaf tables, and per step
/// unmaps its oldest page and maps the next one. No core, no DMA, no invalidation.
fn edits_alone(
    d: Discipline,
    threads: usize,
    pairs: u64,
    memory: DeviceId,
) -> Result<(Duration, Duration, IoTableStats), String> {
    let tables =
        IoTables::new(d, PhysAddr::new(0xf0_0000_0000), 1024).map_err(|e| e.to_string())?;
    let root = tables.create().map_err(|e| e.to_string())?;
    let window = 2 * RING as u64;
    let va = |q: usize, k: u64| IOVA_BEGIN + ((k % window) * threads as u64 + q as u64) * PAGE_SIZE;
    let run = |q: usize, k: u64| MapRun {
        va: VirtAddr::new(va(q, k)),
        pa: PhysAddr::new((1 << 32) + (k % window) * PAGE_SIZE),
        len: PAGE_SIZE,
        prot: Prot::WRITE,
        page_size: PageSize::Size4K,
        memory,
        attrs: Default::default(),
    };
    let start = Barrier::new(threads);
    let per_thread = pairs / threads as u64;
    let spans: Vec<Result<(Instant, Instant, Duration), String>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads)
            .map(|q| {
                let (tables, start, run) = (&tables, &start, &run);
                s.spawn(move || {
                    let mut posted = Ok(());
                    for k in 0..RING as u64 {
                        if let Err(e) = tables.map(root, &run(q, k)) {
                            posted = Err(e.to_string());
                        }
                    }
                    start.wait();
                    posted?;
                    let cpu0 = thread_cpu();
                    let t0 = Instant::now();
                    for k in 0..per_thread {
                        tables.unmap(root, run(q, k).range());
                        tables
                            .map(root, &run(q, k + RING as u64))
                            .map_err(|e| e.to_string())?;
                    }
                    Ok((t0, Instant::now(), thread_cpu().saturating_sub(cpu0)))
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|j| {
                j.join()
                    .unwrap_or_else(|_| Err("an editor panicked".into()))
            })
            .collect()
    });
    let spans: Vec<(Instant, Instant, Duration)> = spans.into_iter().collect::<Result<_, _>>()?;
    let first = spans.iter().map(|x| x.0).min().ok_or("no editor")?;
    let last = spans.iter().map(|x| x.1).max().ok_or("no editor")?;
    let cpu = spans.iter().map(|x| x.2).sum();
    Ok((last - first, cpu, tables.stats()))
}

/// Every discipline alone on 1 and 2 threads, median of `reps`.
///
/// # Errors
/// The first failure as text: the table memory or its root could not be made, a map
/// or unmap was refused (e.g. out of table memory), or an editor thread panicked.
pub fn edits_table(pairs: u64, reps: usize, memory: DeviceId) -> Result<Vec<EditRow>, String> {
    let mut rows: Vec<EditRow> = Vec::new();
    for t in THREADS {
        let pairs = pairs / t as u64 * t as u64;
        for (d, name) in DISCIPLINES {
            let mut runs = (0..reps.max(1))
                .map(|_| edits_alone(d, t, pairs, memory))
                .collect::<Result<Vec<_>, _>>()?;
            runs.sort_by_key(|r| r.0);
            let (wall, cpu, st) = runs.swap_remove(runs.len() / 2);
            rows.push(EditRow {
                discipline: name,
                threads: t,
                pairs,
                mpairs_per_s: pairs as f64 / wall.as_secs_f64().max(1e-9) / 1e6,
                cpu_ns_per_pair: cpu.as_secs_f64() * 1e9 / pairs as f64,
                vs_locked: 0.0,
                writer_reclaims: st.edits.writer_reclaims,
                cas_lost: st.edits.cas_lost,
            });
        }
    }
    let locked: Vec<(usize, f64)> = rows
        .iter()
        .filter(|r| r.discipline == "locked")
        .map(|r| (r.threads, r.mpairs_per_s))
        .collect();
    for r in rows.iter_mut() {
        if let Some((_, l)) = locked.iter().find(|(t, _)| *t == r.threads) {
            r.vs_locked = r.mpairs_per_s / l.max(1e-12);
        }
    }
    Ok(rows)
}
