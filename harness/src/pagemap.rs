//! `reproduce mesc --pagemap [PID]`: the VA→PA contiguity of a real process's memory,
//! read from Linux's `/proc/PID/pagemap` (the paper's §III method), as the same
//! histogram the simulated runs print, so the simulated fragmentation levels can be
//! set beside a real machine's.
//!
//! Which memory: the heap and every private anonymous writable mapping (for this
//! process, after touching a 64 MiB buffer) (where a GPU
//! program's buffers live), as `/proc/PID/maps` lists them. Each 8-byte pagemap entry
//! holds bit 63 "present" and the frame number in bits 0–54; since Linux 4.2 the frame
//! numbers read as zero without `CAP_SYS_ADMIN`, in which case the run says so and
//! stops without a histogram (exit status success: nothing failed, the kernel refused).

use std::fs::File;
use std::io::{Read, Seek, SeekFrom};

/// What a pagemap read found.
#[derive(Clone, Debug, PartialEq)]
pub enum Pagemap {
    /// Frame numbers were readable.
    Histogram {
        /// Present pages examined.
        pages: u64,
        /// Contiguous runs found.
        runs: u64,
        /// Share of runs per bucket (1–256, 257–512, 513–768, 769–1024, >1024 pages).
        run_share: [f64; 5],
        /// Share of the pages per bucket.
        coverage: [f64; 5],
        /// Share of the pages inside 64-page virtual subregions that are wholly one run.
        subregion_coverage: f64,
    },
    /// The kernel hid the frame numbers (or refused the file): why.
    Denied(String),
}

const BUCKETS: [u64; 4] = [256, 512, 768, 1024];

/// Read `pid`'s (`"self"` for this process) mappings and pagemap.
///
/// # Errors
/// `/proc/PID/maps` could not be read for another reason than a permission (no such
/// process).
pub fn read(pid: &str) -> Result<Pagemap, String> {
    // For this process, first touch a 64 MiB buffer, as a program's data would be.
    let buffer: Vec<u8> = if pid == "self" {
        let mut b = vec![0u8; 64 << 20];
        for i in (0..b.len()).step_by(4096) {
            b[i] = 1;
        }
        b
    } else {
        Vec::new()
    };
    let maps = match std::fs::read_to_string(format!("/proc/{pid}/maps")) {
        Ok(m) => m,
        Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => {
            return Ok(Pagemap::Denied(format!("/proc/{pid}/maps: {e}")))
        }
        Err(e) => return Err(format!("/proc/{pid}/maps: {e}")),
    };
    let mut pm = match File::open(format!("/proc/{pid}/pagemap")) {
        Ok(f) => f,
        Err(e) => return Ok(Pagemap::Denied(format!("/proc/{pid}/pagemap: {e}"))),
    };
    let mut present: Vec<(u64, u64)> = Vec::new();
    for line in maps.lines() {
        let mut f = line.split_whitespace();
        let (Some(range), Some(perms)) = (f.next(), f.next()) else {
            continue;
        };
        let name = line.split_whitespace().nth(5).unwrap_or("");
        let anon_rw = perms.starts_with("rw") && perms.ends_with('p') && name.is_empty();
        if !(anon_rw || name == "[heap]") {
            continue;
        }
        let Some((a, b)) = range.split_once('-') else {
            continue;
        };
        let (Ok(a), Ok(b)) = (u64::from_str_radix(a, 16), u64::from_str_radix(b, 16)) else {
            continue;
        };
        let pages = (b - a) / 4096;
        let mut buf = vec![0u8; (pages * 8) as usize];
        if pm.seek(SeekFrom::Start(a / 4096 * 8)).is_err() || pm.read_exact(&mut buf).is_err() {
            continue;
        }
        for (i, c) in buf.chunks_exact(8).enumerate() {
            let e = u64::from_le_bytes([c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]]);
            if e >> 63 & 1 == 1 {
                present.push((a / 4096 + i as u64, e & ((1 << 55) - 1)));
            }
        }
    }
    drop(std::hint::black_box(buffer));
    if present.is_empty() {
        return Ok(Pagemap::Denied(
            "no present page in the heap or anonymous mappings".into(),
        ));
    }
    if present.iter().all(|&(_, pfn)| pfn == 0) {
        return Ok(Pagemap::Denied(
            "the kernel hides frame numbers from this user (CAP_SYS_ADMIN needed since Linux 4.2)"
                .into(),
        ));
    }
    Ok(histogram(&present))
}

/// The histogram of `(vpn, pfn)` pairs (sorted by vpn).
pub fn histogram(present: &[(u64, u64)]) -> Pagemap {
    let mut runs: Vec<(u64, u64)> = Vec::new(); // (first vpn, length)
    for &(v, p) in present {
        match runs.last_mut() {
            Some((first, len))
                if *first + *len == v
                    && present_pfn(present, *first).is_some_and(|f| f + *len == p) =>
            {
                *len += 1
            }
            _ => runs.push((v, 1)),
        }
    }
    let total: u64 = runs.iter().map(|r| r.1).sum();
    let (mut count, mut pages) = ([0u64; 5], [0u64; 5]);
    let mut in_subregions = 0;
    for &(first, len) in &runs {
        let b = BUCKETS.iter().position(|&x| len <= x).unwrap_or(4);
        count[b] += 1;
        pages[b] += len;
        // Whole aligned 64-page subregions inside the run.
        let lo = first.next_multiple_of(64);
        let hi = (first + len) / 64 * 64;
        if hi > lo {
            in_subregions += hi - lo;
        }
    }
    let frac = |a: u64, b: u64| if b == 0 { 0.0 } else { a as f64 / b as f64 };
    Pagemap::Histogram {
        pages: total,
        runs: runs.len() as u64,
        run_share: count.map(|c| frac(c, runs.len() as u64)),
        coverage: pages.map(|p| frac(p, total)),
        subregion_coverage: frac(in_subregions, total),
    }
}

fn present_pfn(present: &[(u64, u64)], vpn: u64) -> Option<u64> {
    present
        .binary_search_by_key(&vpn, |&(v, _)| v)
        .ok()
        .map(|i| present[i].1)
}

/// Print what [`read`] found.
pub fn print(pid: &str, p: &Pagemap) {
    match p {
        Pagemap::Histogram {
            pages,
            runs,
            run_share,
            coverage,
            subregion_coverage,
        } => {
            println!("pagemap of {pid}: {pages} present pages (heap and anonymous rw), {runs} VA->PA contiguous runs");
            println!("runs of 1-256 / 257-512 / 513-768 / 769-1024 / >1024 pages: share of runs {run_share:.3?} | share of pages {coverage:.3?}");
            println!("pages in whole contiguous 64-page subregions: {subregion_coverage:.3}");
        }
        Pagemap::Denied(why) => println!("pagemap of {pid}: not readable here: {why}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runs_and_subregions_are_counted_from_frame_numbers() {
        // 128 contiguous pages from vpn 64, then 3 scattered pages.
        let mut v: Vec<(u64, u64)> = (0..128).map(|i| (64 + i, 1000 + i)).collect();
        v.extend([(200, 5), (201, 9), (202, 10)]);
        let Pagemap::Histogram {
            pages,
            runs,
            subregion_coverage,
            ..
        } = histogram(&v)
        else {
            panic!("histogram expected");
        };
        assert_eq!((pages, runs), (131, 3));
        assert!((subregion_coverage - 128.0 / 131.0).abs() < 1e-12);
    }
}
