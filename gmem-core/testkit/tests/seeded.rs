//! Seeded pseudo-random operation sequences through both runners: what `cargo test`
//! runs on every build (the fuzz targets run the same runners on libFuzzer's inputs).

use gmem_testkit::{replay_kpi, replay_vmem, SeedBytes, Summary};

/// Each seed is decoded into a configuration and an operation list exactly as a fuzz
/// input is; a failure names the seed so it can be replayed alone.
fn run_seeds(seeds: std::ops::Range<u64>, bytes: usize, f: fn(&[u8]) -> Summary) -> Summary {
    let mut total = Summary::default();
    for seed in seeds {
        let data = SeedBytes::new(seed).bytes(bytes);
        let r = std::panic::catch_unwind(|| f(&data));
        match r {
            Ok(s) => total += s,
            Err(_) => panic!("seed {seed} failed: replay SeedBytes::new({seed}).bytes({bytes})"),
        }
    }
    eprintln!("{total:?}");
    total
}

#[test]
fn vmem_runner_agrees_with_the_interval_model_on_seeded_sequences() {
    let s = run_seeds(0..100, 2048, replay_vmem);
    assert!(s.ops >= 4000, "a few thousand operations ran: {s:?}");
    assert!(s.succeeded > s.ops / 4 && s.rejected > s.ops / 50, "{s:?}");
}

#[test]
fn kpi_runner_agrees_with_the_region_model_on_seeded_sequences() {
    let s = run_seeds(0..200, 4096, replay_kpi);
    assert!(s.ops >= 4000, "a few thousand operations ran: {s:?}");
    assert!(
        s.succeeded > s.ops / 10 && s.bytes_checked > 100_000,
        "{s:?}"
    );
    // The discrete GPU maps 64 KiB leaves: the sequences exercise them.
    assert!(
        s.large_maps > 0 && s.large_splits > 0 && s.promotions > 0,
        "{s:?}"
    );
    // DMA mappings are made and unmapped, their frames' bytes checked.
    assert!(s.dma_maps > 0 && s.dma_unmaps > 0, "{s:?}");
    // Batched faults, with prefetch on some of the time (`Op::FaultBatch`).
    assert!(s.fault_batches > 50 && s.pages_prefetched > 0, "{s:?}");
    // (Read-mostly advice rarely meets a later read from another memory in random
    // sequences: `tests/readdup.rs` opens its sequences with that.)
}

/// Replay one seed (`GMEM_SEED=n`) or input file (`GMEM_FILE=path`, e.g. a fuzz
/// artifact), with `GMEM_TESTKIT_TRACE=1` to print every operation (and
/// `GMEM_TESTKIT_TRACE_EVENTS=1` every MMU call of the KPI runner):
/// `cargo test -p gmem-testkit --test seeded replay_one -- --ignored --nocapture`.
#[test]
#[ignore = "a debugging aid, run on demand"]
fn replay_one() {
    let seed: u64 = std::env::var("GMEM_SEED").map_or(0, |s| s.parse().expect("a number"));
    let which = std::env::var("GMEM_RUNNER").unwrap_or_else(|_| "kpi".into());
    let data = match std::env::var_os("GMEM_FILE") {
        Some(f) => std::fs::read(f).expect("GMEM_FILE names a readable input"),
        None => SeedBytes::new(seed).bytes(4096),
    };
    let s = if which == "vmem" {
        replay_vmem(&data)
    } else {
        replay_kpi(&data)
    };
    eprintln!("{s:?}");
}
