//! Wall-clock and thread-CPU timing for the fault benches.
//!
//! The wall clock counts the time a thread waits for a core that another process
//! holds; on a loaded 2-core machine that is most of the noise. The thread's CPU time
//! (user + system, `CLOCK_THREAD_CPUTIME_ID`) does not, so the benches print both: a
//! Linux page fault's kernel time is system time of the faulting thread and counts too.

use std::time::{Duration, Instant};

/// This thread's CPU time so far.
pub fn thread_cpu() -> Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `clock_gettime` writes only the timespec we own; the clock id is valid
    // on Linux. A failure leaves zeros (then the CPU figures read 0, visibly wrong).
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

/// A measured span: wall-clock and thread-CPU time.
#[derive(Clone, Copy, Debug, Default)]
pub struct Timed {
    /// Wall-clock time.
    pub wall: Duration,
    /// This thread's CPU time.
    pub cpu: Duration,
}

/// A running measurement.
pub struct Stopwatch {
    wall: Instant,
    cpu: Duration,
}

impl Stopwatch {
    /// Start measuring.
    pub fn start() -> Stopwatch {
        Stopwatch {
            cpu: thread_cpu(),
            wall: Instant::now(),
        }
    }

    /// Stop and return what was measured.
    pub fn stop(self) -> Timed {
        let wall = self.wall.elapsed();
        Timed {
            wall,
            cpu: thread_cpu().saturating_sub(self.cpu),
        }
    }
}

/// Median of `v` (sorted in place).
pub fn median(v: &mut [f64]) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[v.len() / 2]
}

/// Medians of the wall and CPU parts of `samples`, each divided by `per`.
pub fn medians(samples: &[Timed], per: f64, unit: f64) -> (f64, f64) {
    let mut w: Vec<f64> = samples
        .iter()
        .map(|t| t.wall.as_secs_f64() * unit / per)
        .collect();
    let mut c: Vec<f64> = samples
        .iter()
        .map(|t| t.cpu.as_secs_f64() * unit / per)
        .collect();
    (median(&mut w), median(&mut c))
}
