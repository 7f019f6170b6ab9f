//! The cached arena driven by one and by two threads, and the same-run control (two
//! threads on an arena each), in pairs per second.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use criterion::Criterion;
use gmem_core::vmem::Arena;

use super::{
    arena, churn_trace, replay, CachePadded, Iova, Ours, ThreadState, Trace, Variant, CPU,
};

/// CPU records of the arena in [`threaded`]: the machine's CPU count, at least 2.
///
/// A kernel's arena has one CPU record per CPU of the machine whatever the load, so
/// the 1-thread and the 2-thread runs both use an arena of this many CPUs and take
/// the same code path (the `current_cpu` call, the per-CPU record indexing); they
/// differ only in how many threads drive it. Until alloc10 the 1-thread run built a
/// one-CPU arena, whose hit path skips `current_cpu`, and compared unlike things.
/// At least 2, so that the 2-thread run's threads each own a record on any machine.
pub(super) fn machine_cpus() -> usize {
    std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .max(2)
}

/// One run of [`threaded`]: threads, and whether they share one arena.
#[derive(Clone, Copy)]
pub(super) struct ThreadRun {
    threads: usize,
    shared: bool,
    /// Median pairs per second over all threads.
    pps: Option<f64>,
}

/// Pairs per second of the cached arena (with [`machine_cpus`] CPU records) driven by
/// threads each replaying its own churn trace (its own live set) with its own CPU
/// id: one thread, two threads on one arena, and, as the same-run control, two
/// threads on an arena each (nothing shared, so what the machine gives two threads;
/// the shared run can only lose to it by what the threads share in the arena).
/// Criterion's time per iteration is the wall time of one pair on every thread at
/// once.
pub(super) fn threaded(c: &mut Criterion, live: usize) -> Vec<ThreadRun> {
    let samples = 20;
    let mut group = c.benchmark_group("cached_threads");
    group
        .sample_size(samples)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(3));
    let mut out = Vec::new();
    for (threads, shared) in [(1usize, true), (2, false), (2, true)] {
        let traces: Vec<Trace> = (0..threads)
            .map(|i| churn_trace(live, 0x7417 + i as u64))
            .collect();
        let arenas: Vec<Arc<Arena>> = if shared {
            let space: u64 = traces.iter().map(|t| t.space).sum();
            let a = Arc::new(arena(space, Variant::Cached, machine_cpus()));
            vec![a; threads]
        } else {
            traces
                .iter()
                .map(|t| Arc::new(arena(t.space, Variant::Cached, machine_cpus())))
                .collect()
        };
        let states: Vec<CachePadded<Mutex<ThreadState>>> = traces
            .iter()
            .zip(&arenas)
            .enumerate()
            .map(|(i, (t, a))| {
                CPU.with(|c| c.set(i));
                let mut o = Ours(Arc::clone(a));
                let slots = t.initial.iter().map(|&p| o.alloc(p)).collect();
                CachePadded(Mutex::new((slots, 0usize)))
            })
            .collect();
        CPU.with(|c| c.set(0));
        let mut per_call = Vec::new();
        let name = match (threads, shared) {
            (1, _) => "threads_1".to_string(),
            (n, true) => format!("threads_{n}"),
            (n, false) => format!("threads_{n}_arena_each"),
        };
        group.bench_function(name, |b| {
            b.iter_custom(|iters| {
                let start = Instant::now();
                std::thread::scope(|s| {
                    for (i, ((st, t), a)) in states.iter().zip(&traces).zip(&arenas).enumerate() {
                        let a = Arc::clone(a);
                        s.spawn(move || {
                            CPU.with(|c| c.set(i));
                            let mut st = st.0.lock().expect("state");
                            let (slots, pos) = &mut *st;
                            let mut o = Ours(a);
                            // A local cursor: the threads' states are neighbours in
                            // memory, and a shared line written every step would be
                            // false sharing the arena is not responsible for.
                            let mut at = *pos;
                            let failed = replay(&mut o, slots, t, &mut at, iters);
                            *pos = at;
                            assert_eq!(failed, 0, "the churn space never fills");
                        });
                    }
                });
                let elapsed = start.elapsed();
                // Pairs per second over all threads.
                per_call.push((threads as u64 * iters) as f64 / elapsed.as_secs_f64());
                elapsed
            })
        });
        let n = per_call.len();
        let mut measured = per_call.split_off(n.saturating_sub(samples));
        measured.sort_by(f64::total_cmp);
        out.push(ThreadRun {
            threads,
            shared,
            pps: measured.get(measured.len() / 2).copied(),
        });
    }
    group.finish();
    out
}

/// Print [`threaded`]'s runs and the ratios.
pub(super) fn print_threads(threads: &[ThreadRun]) {
    println!(
        "=== cached arena (magazines), churn trace, 32k live per thread, \
         one arena of {} CPU records for both runs ===",
        machine_cpus()
    );
    let mpps = |r: &ThreadRun| {
        r.pps
            .map_or_else(|| "skipped".into(), |p| format!("{:.2}", p / 1e6))
    };
    for r in threads {
        println!(
            "{} thread(s), {}: {} Mpairs/s",
            r.threads,
            if r.shared || r.threads == 1 {
                "one arena"
            } else {
                "an arena each (control)"
            },
            mpps(r)
        );
    }
    let pps = |t: usize, sh: bool| {
        threads
            .iter()
            .find(|r| r.threads == t && r.shared == sh)
            .and_then(|r| r.pps)
    };
    if let (Some(one), Some(two)) = (pps(1, true), pps(2, true)) {
        println!(
            "2 threads / 1 thread: {:.2}x (target >= 1.7x: {}); cores available: {}, \
             arena CPU records: {}",
            two / one,
            if two / one >= 1.7 { "met" } else { "NOT met" },
            std::thread::available_parallelism().map_or(0, |n| n.get()),
            machine_cpus()
        );
        if let Some(each) = pps(2, false) {
            println!(
                "control, 2 threads on an arena each / 1 thread: {:.2}x (what this run's \
                 machine gave two threads); one arena / an arena each: {:.2}",
                each / one,
                two / each
            );
        }
    }
}
