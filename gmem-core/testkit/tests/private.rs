//! Seeded pseudo-random sequences through the private-frame runner (the `private` fuzz
//! target runs the same runner on libFuzzer's inputs).

use gmem_testkit::{replay_private, SeedBytes, Summary};

#[test]
fn private_runner_agrees_with_the_two_copy_model_on_seeded_sequences() {
    let mut total = Summary::default();
    for seed in 0..300u64 {
        let data = SeedBytes::new(seed).bytes(1024);
        match std::panic::catch_unwind(|| replay_private(&data)) {
            Ok(s) => total += s,
            Err(_) => panic!("seed {seed} failed: replay SeedBytes::new({seed}).bytes(1024)"),
        }
    }
    eprintln!("{total:?}");
    assert!(total.ops >= 10_000, "{total:?}");
    assert!(
        total.succeeded > total.ops / 4 && total.rejected > total.ops / 50,
        "{total:?}"
    );
    assert!(total.bytes_checked > 10_000, "{total:?}");
}
