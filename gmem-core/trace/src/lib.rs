//! Trace formats: gmem's own text format and valgrind lackey output, parsed as streams.
//!
//! ## The gmem trace format (`.gmt`)
//! One event per line; `#` starts a comment; blank lines are ignored. Sizes and offsets
//! are decimal or `0x` hex, with an optional `K`, `M` or `G` suffix (powers of 1024).
//! Regions are named by the trace; devices are `cpu` or `gpu`.
//!
//! ```text
//! alloc  <region> <size> [align=<bytes>]     allocate a region
//! free   <region>                            deallocate it (strict unmap first)
//! map    <region> <device>                   migrate (prefetch) the region into the device's memory
//! access <device> <r|w> <region>[+<off>] <len>   load or store `len` bytes
//! policy <region> <unique|remote> [<device>|host|faulting]   placement policy
//! protect <region> <r|rw>                    change protection
//! sync                                       drain asynchronous MMU requests
//! ```
//! Stores write a deterministic pattern derived from the address, so a replay can check
//! every load against a CPU-only reference model of the bytes.
//!
//! ## valgrind lackey (`valgrind --tool=lackey --trace-mem=yes`)
//! Lines ` L addr,size`, ` S addr,size`, ` M addr,size` (load, store, modify) and
//! `I  addr,size` (instruction fetch, skipped); valgrind's `==pid==` banner lines are
//! skipped. Accesses are replayed on one chosen device.
//!
//! Both parsers read line by line from any `BufRead` (a multi-gigabyte trace never sits
//! in memory) and report malformed input as a [`ParseError`] naming the file and line.

use std::fmt;
use std::io::BufRead;

/// A device named by a trace.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Dev {
    /// The host CPU.
    Cpu,
    /// The accelerator.
    Gpu,
}

/// Where a policy places pages.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Target {
    /// The faulting device.
    Faulting,
    /// Host memory.
    Host,
    /// A named device.
    Dev(Dev),
}

/// One event of a trace.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Event {
    /// Allocate a region.
    Alloc {
        region: String,
        size: u64,
        align: u64,
    },
    /// Free a region.
    Free { region: String },
    /// Migrate a region into a device's memory.
    Map { region: String, dev: Dev },
    /// Load or store through a device, at a region offset (gmem format) or a raw
    /// virtual address (lackey).
    Access {
        dev: Dev,
        write: bool,
        at: Location,
        len: u64,
    },
    /// Placement policy of a region.
    Policy {
        region: String,
        remote: bool,
        target: Target,
    },
    /// Protection of a region.
    Protect { region: String, write: bool },
    /// Drain asynchronous requests.
    Sync,
}

/// Where an access lands.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Location {
    /// Offset into a named region.
    Region { region: String, offset: u64 },
    /// A raw virtual address of the traced program.
    Addr(u64),
}

/// A malformed line.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ParseError {
    /// The file (as given on the command line).
    pub file: String,
    /// 1-based line number.
    pub line: u64,
    /// What is wrong.
    pub what: String,
}

impl fmt::Display for ParseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}: {}", self.file, self.line, self.what)
    }
}

impl std::error::Error for ParseError {}

/// Which format a trace is in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    /// gmem's own format.
    Gmem,
    /// valgrind lackey output, replayed on `on`.
    Lackey { on: Dev },
}

/// Parse a number: decimal or `0x` hex, optional K/M/G suffix.
///
/// # Errors
/// A message quoting `s` when its digits (after the suffix is removed) are not a
/// decimal or `0x` hex `u64` (an empty string, `0x` alone, a sign or a stray
/// character), or when the suffix's multiple overflows 64 bits.
pub fn number(s: &str) -> Result<u64, String> {
    let (digits, mult) = match s.as_bytes().last() {
        Some(b'K' | b'k') => (&s[..s.len() - 1], 1u64 << 10),
        Some(b'M' | b'm') => (&s[..s.len() - 1], 1 << 20),
        Some(b'G' | b'g') => (&s[..s.len() - 1], 1 << 30),
        _ => (s, 1),
    };
    let v = match digits
        .strip_prefix("0x")
        .or_else(|| digits.strip_prefix("0X"))
    {
        Some(hex) => u64::from_str_radix(hex, 16),
        None => digits.parse::<u64>(),
    }
    .map_err(|_| format!("`{s}` is not a number"))?;
    v.checked_mul(mult)
        .ok_or_else(|| format!("`{s}` overflows 64 bits"))
}

fn dev(s: &str) -> Result<Dev, String> {
    match s {
        "cpu" => Ok(Dev::Cpu),
        "gpu" => Ok(Dev::Gpu),
        _ => Err(format!("unknown device `{s}` (cpu or gpu)")),
    }
}

fn region_name(s: &str) -> Result<String, String> {
    if !s.is_empty()
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-' || c == '.')
    {
        Ok(s.to_string())
    } else {
        Err(format!(
            "`{s}` is not a region name (letters, digits, _ - .)"
        ))
    }
}

fn arity(words: &[&str], min: usize, max: usize, usage: &str) -> Result<(), String> {
    if words.len() < min || words.len() > max {
        Err(format!("expected `{usage}`"))
    } else {
        Ok(())
    }
}

/// Parse one line of the gmem format (`None` for blank and comment lines).
///
/// # Errors
/// A message saying what is wrong with the line: an unknown event word, too few or
/// too many words (quoting the event's usage), a size, offset, length or alignment
/// that [`number`] rejects, a zero-byte region or access, a region name with
/// characters other than letters, digits, `_`, `-` and `.`, a device other than `cpu`
/// or `gpu`, or an access kind, policy mode or protection not among those listed in
/// the [module documentation](self).
pub fn parse_gmem_line(line: &str) -> Result<Option<Event>, String> {
    let line = line.split('#').next().unwrap_or("").trim();
    if line.is_empty() {
        return Ok(None);
    }
    let w: Vec<&str> = line.split_whitespace().collect();
    let ev = match w[0] {
        "alloc" => {
            arity(&w, 3, 4, "alloc <region> <size> [align=<bytes>]")?;
            let size = number(w[2])?;
            if size == 0 {
                return Err("a region cannot be empty".into());
            }
            let align = match w.get(3) {
                Some(a) => number(
                    a.strip_prefix("align=")
                        .ok_or_else(|| format!("`{a}`: expected align=<bytes>"))?,
                )?,
                None => 0,
            };
            Event::Alloc {
                region: region_name(w[1])?,
                size,
                align,
            }
        }
        "free" => {
            arity(&w, 2, 2, "free <region>")?;
            Event::Free {
                region: region_name(w[1])?,
            }
        }
        "map" => {
            arity(&w, 3, 3, "map <region> <device>")?;
            Event::Map {
                region: region_name(w[1])?,
                dev: dev(w[2])?,
            }
        }
        "access" => {
            arity(&w, 5, 5, "access <device> <r|w> <region>[+<offset>] <len>")?;
            let write = match w[2] {
                "r" => false,
                "w" => true,
                o => return Err(format!("`{o}`: expected r or w")),
            };
            let (name, offset) = match w[3].split_once('+') {
                Some((n, o)) => (n, number(o)?),
                None => (w[3], 0),
            };
            let len = number(w[4])?;
            if len == 0 {
                return Err("an access needs at least one byte".into());
            }
            Event::Access {
                dev: dev(w[1])?,
                write,
                at: Location::Region {
                    region: region_name(name)?,
                    offset,
                },
                len,
            }
        }
        "policy" => {
            arity(
                &w,
                3,
                4,
                "policy <region> <unique|remote> [<device>|host|faulting]",
            )?;
            let remote = match w[2] {
                "unique" => false,
                "remote" => true,
                o => return Err(format!("`{o}`: expected unique or remote")),
            };
            let target = match w.get(3).copied() {
                None | Some("faulting") => Target::Faulting,
                Some("host") => Target::Host,
                Some(d) => Target::Dev(dev(d)?),
            };
            Event::Policy {
                region: region_name(w[1])?,
                remote,
                target,
            }
        }
        "protect" => {
            arity(&w, 3, 3, "protect <region> <r|rw>")?;
            let write = match w[2] {
                "r" => false,
                "rw" => true,
                o => return Err(format!("`{o}`: expected r or rw")),
            };
            Event::Protect {
                region: region_name(w[1])?,
                write,
            }
        }
        "sync" => {
            arity(&w, 1, 1, "sync")?;
            Event::Sync
        }
        other => return Err(format!("unknown event `{other}`")),
    };
    Ok(Some(ev))
}

/// Parse one line of lackey output (`None` for lines that carry no data access).
///
/// # Errors
/// A message quoting the line when it does not start with a space or `I` (and is no
/// `==` banner or blank line), its access kind is not `L`, `S` or `M`, it has no
/// `addr,size` pair, the address is not hex or the size not decimal, or the access is
/// empty or runs past the end of the address space.
pub fn parse_lackey_line(line: &str, on: Dev) -> Result<Option<Event>, String> {
    if line.starts_with("==") || line.trim().is_empty() {
        return Ok(None);
    }
    let bytes = line.as_bytes();
    if bytes.first() == Some(&b'I') {
        return Ok(None);
    }
    if bytes.first() != Some(&b' ') || bytes.len() < 3 {
        return Err(format!("`{}`: not a lackey line", line.trim()));
    }
    // Checked before slicing: byte 1 is ASCII, so byte 2 starts a character.
    let write = match bytes[1] {
        b'L' => false,
        b'S' | b'M' => true,
        _ => return Err(format!("`{}`: unknown access kind", line.trim())),
    };
    let rest = line[2..].trim();
    let (addr, size) = rest
        .split_once(',')
        .ok_or_else(|| format!("`{rest}`: expected addr,size"))?;
    let addr = u64::from_str_radix(addr.trim(), 16)
        .map_err(|_| format!("`{addr}` is not a hex address"))?;
    let len: u64 = size
        .trim()
        .parse()
        .map_err(|_| format!("`{size}` is not a size"))?;
    if len == 0 || addr.checked_add(len - 1).is_none() {
        return Err(format!("access {addr:#x}+{len} is empty or overflows"));
    }
    Ok(Some(Event::Access {
        dev: on,
        write,
        at: Location::Addr(addr),
        len,
    }))
}

/// A streaming reader of trace events.
pub struct Reader<R> {
    input: R,
    file: String,
    line: u64,
    format: Format,
    buf: String,
}

impl<R: BufRead> Reader<R> {
    /// Read `input` (named `file` in errors) in `format`.
    pub fn new(input: R, file: &str, format: Format) -> Self {
        Reader {
            input,
            file: file.to_string(),
            line: 0,
            format,
            buf: String::new(),
        }
    }

    fn error(&self, what: String) -> ParseError {
        ParseError {
            file: self.file.clone(),
            line: self.line,
            what,
        }
    }
}

impl<R: BufRead> Iterator for Reader<R> {
    type Item = Result<Event, ParseError>;

    fn next(&mut self) -> Option<Self::Item> {
        loop {
            self.buf.clear();
            self.line += 1;
            match self.input.read_line(&mut self.buf) {
                Ok(0) => return None,
                Ok(_) => {}
                Err(e) => return Some(Err(self.error(format!("read error: {e}")))),
            }
            let parsed = match self.format {
                Format::Gmem => parse_gmem_line(&self.buf),
                Format::Lackey { on } => {
                    parse_lackey_line(self.buf.trim_end_matches(['\n', '\r']), on)
                }
            };
            match parsed {
                Ok(Some(ev)) => return Some(Ok(ev)),
                Ok(None) => continue,
                Err(what) => return Some(Err(self.error(what))),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn events(text: &str, format: Format) -> Result<Vec<Event>, ParseError> {
        Reader::new(text.as_bytes(), "t.gmt", format).collect()
    }

    #[test]
    fn gmem_format_parses_every_event_kind() {
        let t = "# a trace\nalloc a 64K align=0x10000\npolicy a remote gpu\n\
                 access gpu w a+0x100 8   # store\naccess cpu r a 4\nmap a gpu\nprotect a r\nsync\nfree a\n";
        let ev = events(t, Format::Gmem).unwrap();
        assert_eq!(ev.len(), 8);
        assert_eq!(
            ev[0],
            Event::Alloc {
                region: "a".into(),
                size: 65536,
                align: 65536
            }
        );
        assert_eq!(
            ev[1],
            Event::Policy {
                region: "a".into(),
                remote: true,
                target: Target::Dev(Dev::Gpu)
            }
        );
        assert_eq!(
            ev[2],
            Event::Access {
                dev: Dev::Gpu,
                write: true,
                at: Location::Region {
                    region: "a".into(),
                    offset: 0x100
                },
                len: 8
            }
        );
    }

    #[test]
    fn malformed_gmem_lines_name_file_and_line() {
        for (text, line) in [
            ("alloc a\n", 1),
            ("\n\nalloc a 0\n", 3),
            ("alloc a 1Q\n", 1),
            ("access tpu r a 4\n", 1),
            ("access cpu x a 4\n", 1),
            ("access cpu r a+zz 4\n", 1),
            ("alloc a 18446744073709551615K\n", 1),
            ("frobnicate\n", 1),
            ("free a b\n", 1),
            ("policy a sideways\n", 1),
            ("alloc a/b 4K\n", 1),
        ] {
            let err = events(text, Format::Gmem).unwrap_err();
            assert_eq!(
                (err.file.as_str(), err.line),
                ("t.gmt", line),
                "{text:?}: {err}"
            );
        }
    }

    #[test]
    fn lackey_lines_parse_and_skip_instructions_and_banners() {
        let t = "==123== Lackey\nI  04000b50,3\n L 04222cac,8\n S 7ff000b8,8\n M 0421f5d4,4\n";
        let ev = events(t, Format::Lackey { on: Dev::Cpu }).unwrap();
        assert_eq!(ev.len(), 3);
        assert_eq!(
            ev[0],
            Event::Access {
                dev: Dev::Cpu,
                write: false,
                at: Location::Addr(0x0422_2cac),
                len: 8
            }
        );
        assert!(matches!(ev[2], Event::Access { write: true, .. }));
        let err = events(" L 0422,\n", Format::Lackey { on: Dev::Cpu }).unwrap_err();
        assert_eq!(err.line, 1);
        assert!(events(" X 0422,4\n", Format::Lackey { on: Dev::Cpu }).is_err());
        assert!(events(" L ffffffffffffffff,8\n", Format::Lackey { on: Dev::Cpu }).is_err());
    }

    #[test]
    fn arbitrary_bytes_never_panic() {
        let mut s = 0x1234_5678_9abc_def0u64;
        for _ in 0..20_000 {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            let len = (s % 40) as usize;
            let alphabet = " LSMIaclfrx0123456789,+#=\n\u{e9}".as_bytes();
            let bytes: Vec<u8> = (0..len)
                .map(|i| alphabet[((s >> (i % 50)) % alphabet.len() as u64) as usize])
                .collect();
            let text = String::from_utf8_lossy(&bytes).into_owned();
            let _ = events(&text, Format::Gmem);
            let _ = events(&text, Format::Lackey { on: Dev::Gpu });
        }
    }
}
