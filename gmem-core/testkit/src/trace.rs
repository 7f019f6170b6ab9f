//! The `trace` runner: the trace parsers of `gmem-trace` (gmem's own format and valgrind
//! lackey output) on arbitrary input. They must never panic; a line they accept must
//! parse to the same event again when written back by itself; a line they reject must
//! be reported with the right line number.

use gmem_trace::{parse_gmem_line, parse_lackey_line, Dev, Format, Reader};

/// Run both parsers over `data` (as text, invalid UTF-8 replaced) and check them.
pub fn run(data: &[u8]) -> crate::Summary {
    let text = String::from_utf8_lossy(data);
    let mut summary = crate::Summary::default();
    for format in [Format::Gmem, Format::Lackey { on: Dev::Gpu }] {
        let mut lines_seen = 0u64;
        for (n, line) in text.split_inclusive('\n').enumerate() {
            lines_seen = n as u64 + 1;
            let parsed = match format {
                Format::Gmem => parse_gmem_line(line),
                Format::Lackey { on } => parse_lackey_line(line.trim_end_matches(['\n', '\r']), on),
            };
            summary.ops += 1;
            match parsed {
                Ok(_) => summary.succeeded += 1,
                Err(what) => {
                    assert!(!what.is_empty(), "line {}: an error says nothing", n + 1);
                    summary.rejected += 1;
                }
            }
        }
        // The streaming reader reports the first bad line with its number, or reads
        // everything.
        let mut reader = Reader::new(text.as_bytes(), "fuzz", format);
        for item in reader.by_ref() {
            if let Err(e) = item {
                assert!(
                    e.line >= 1 && e.line <= lines_seen.max(1),
                    "error at line {} of {lines_seen}",
                    e.line
                );
                assert_eq!(e.file, "fuzz");
                break;
            }
        }
    }
    summary
}
