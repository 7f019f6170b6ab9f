//! Seeded runs of the `page_table` and `trace` runners (the fuzz targets of the same
//! names run them on libFuzzer's input).

use gmem_testkit::{replay_page_table, replay_trace, SeedBytes};

#[test]
fn seeded_page_table_sequences_agree_with_the_map_model() {
    let mut total = gmem_testkit::Summary::default();
    for seed in 0..60u64 {
        let mut g = SeedBytes::new(seed);
        total += replay_page_table(&g.bytes(1500));
    }
    assert!(total.ops > 3_000, "{total:?}");
    assert!(
        total.succeeded > 1_000,
        "the runs mapped something: {total:?}"
    );
}

#[test]
fn seeded_text_never_breaks_the_trace_parsers() {
    let mut total = gmem_testkit::Summary::default();
    for seed in 0..300u64 {
        let mut g = SeedBytes::new(seed);
        // Bias the bytes toward the formats' alphabet so that some lines parse.
        let alphabet = b"alloc free map access policy protect sync cpu gpu r w rw 0x1K+ LSMI,\n#=";
        let bytes: Vec<u8> = g
            .bytes(600)
            .iter()
            .map(|b| {
                if b % 8 == 0 {
                    *b
                } else {
                    alphabet[*b as usize % alphabet.len()]
                }
            })
            .collect();
        total += replay_trace(&bytes);
    }
    let valid = "alloc a 64K\naccess gpu w a+0x10 8\n L 04222cac,8\n";
    total += replay_trace(valid.as_bytes());
    assert!(total.succeeded > 0 && total.rejected > 0, "{total:?}");
}
