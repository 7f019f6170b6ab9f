//! Replaying a trace over gmem-core, checked byte for byte against a reference model.
//!
//! The replayer owns a simulated machine ([`Machine`]): the host CPU and a discrete GPU
//! whose video memory size is a parameter (so a trace can oversubscribe it), one address
//! space `[0, 512 GiB)` both are attached to, and a reference model: a sparse map from page to bytes that
//! every store also updates. Every load is compared with the model; a mismatch is a
//! replay error, as is any event that the core rejects when the model says it should
//! have succeeded.
//!
//! Lackey traces name raw addresses of the traced program: the replayer allocates a
//! 2 MiB region at exactly the chunk holding an address the first time it is touched.

use crate::machine::{Accel, Machine, On};
use crate::trace::{Dev, Event, Location, Target};
use gmem_core::{
    AllocRequest, MapFlags, Placement, PlacementMode, PlacementTarget, Prot, Region, VirtAddr,
    PAGE_SIZE,
};
use std::collections::HashMap;

const CHUNK: u64 = 2 << 20;
/// The top of the replay address space (the discrete GPU translates 39-bit addresses).
const SPACE_END: u64 = 1 << 39;

/// Replay counters.
#[derive(Clone, Copy, Debug, Default, serde::Serialize)]
pub struct ReplayCounts {
    /// Events replayed.
    pub events: u64,
    /// Loads checked against the model.
    pub loads: u64,
    /// Stores.
    pub stores: u64,
    /// Bytes moved by loads and stores.
    pub bytes: u64,
}

/// The replay state.
pub struct Replayer {
    m: Machine,
    regions: HashMap<String, Region>,
    chunks: HashMap<u64, Region>,
    model: HashMap<u64, Box<[u8; PAGE_SIZE as usize]>>,
    stamp: u64,
    /// What was replayed.
    pub counts: ReplayCounts,
}

fn pattern_byte(addr: u64, stamp: u64) -> u8 {
    let x = addr.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ stamp.wrapping_mul(0xD6E8_FEB8_6659_FD93);
    (x >> 56) as u8
}

impl Replayer {
    /// A replayer whose accelerator has `gpu_pages` pages of local memory and whose host
    /// has `host_pages`.
    ///
    /// # Errors
    /// As [`Machine::with_space`] (a machine whose space is the replay's 39-bit one).
    pub fn new(gpu_pages: u64, host_pages: u64) -> Result<Replayer, String> {
        let m = Machine::with_space(
            host_pages,
            Accel::Discrete {
                pages: gpu_pages.max(1),
            },
            0,
            SPACE_END,
        )?;
        Ok(Replayer {
            m,
            regions: HashMap::new(),
            chunks: HashMap::new(),
            model: HashMap::new(),
            stamp: 0,
            counts: ReplayCounts::default(),
        })
    }

    /// The core's counters.
    pub fn stats(&self) -> gmem_core::Stats {
        self.m.gm().stats()
    }

    fn on(d: Dev) -> On {
        match d {
            Dev::Cpu => On::Cpu,
            Dev::Gpu => On::Gpu,
        }
    }

    fn dev_id(&self, d: Dev) -> gmem_core::DeviceId {
        match d {
            Dev::Cpu => self.m.gm().host(),
            Dev::Gpu => self.m.gpu_id(),
        }
    }

    fn region(&self, name: &str) -> Result<Region, String> {
        self.regions
            .get(name)
            .copied()
            .ok_or_else(|| format!("region `{name}` is not allocated"))
    }

    /// The address an access starts at, allocating lackey chunks on first touch.
    fn resolve(&mut self, at: &Location, len: u64) -> Result<u64, String> {
        match at {
            Location::Region { region, offset } => {
                let r = self.region(region)?;
                let info = self.m.gm().region_info(r).map_err(|e| e.to_string())?;
                if offset
                    .checked_add(len)
                    .map_or(true, |end| end > info.range.len)
                {
                    return Err(format!(
                        "access {region}+{offset:#x} ({len} bytes) runs past the region"
                    ));
                }
                Ok(r.start.as_u64() + offset)
            }
            Location::Addr(a) => {
                let first = a / CHUNK;
                let last = (a + (len - 1)) / CHUNK;
                for c in first..=last {
                    if c * CHUNK >= SPACE_END {
                        return Err(format!(
                            "address {a:#x} is outside the replay's 39-bit space"
                        ));
                    }
                    if !self.chunks.contains_key(&c) {
                        let req = AllocRequest {
                            hint: VirtAddr::new(c * CHUNK),
                            size: CHUNK,
                            align: CHUNK,
                            nocross: 0,
                            max: VirtAddr::new(c * CHUNK + CHUNK - 1),
                        };
                        let r = self
                            .m
                            .gm()
                            .as_alloc(self.m.space(), req)
                            .map_err(|e| e.to_string())?;
                        self.chunks.insert(c, r);
                    }
                }
                Ok(*a)
            }
        }
    }

    fn forget(&mut self, start: u64, len: u64) {
        for p in (start / PAGE_SIZE)..(start + len).div_ceil(PAGE_SIZE) {
            self.model.remove(&p);
        }
    }

    /// Replay one event.
    ///
    /// # Errors
    /// A message naming what went wrong: an `alloc` of a region already allocated, an
    /// event naming a region never allocated (or freed), an access past its region's
    /// end or (lackey) outside the 39-bit space, a KPI call the core refused (no free
    /// range, a bad alignment, a protection or policy it rejects), an access that
    /// failed ([`Machine::load`]), or a load that read a byte other than the CPU-only
    /// reference model holds. A store that failed part-way has written its earlier
    /// pages (the reference model is then not updated).
    pub fn step(&mut self, ev: &Event) -> Result<(), String> {
        self.counts.events += 1;
        let gm = self.m.gm();
        match ev {
            Event::Alloc {
                region,
                size,
                align,
            } => {
                if self.regions.contains_key(region) {
                    return Err(format!("region `{region}` is already allocated"));
                }
                let size = size.div_ceil(PAGE_SIZE) * PAGE_SIZE;
                let req = AllocRequest {
                    align: *align,
                    ..AllocRequest::new(size)
                };
                let r = gm
                    .as_alloc(self.m.space(), req)
                    .map_err(|e| format!("alloc {region}: {e}"))?;
                self.regions.insert(region.clone(), r);
            }
            Event::Free { region } => {
                let r = self.region(region)?;
                let len = gm.region_info(r).map_err(|e| e.to_string())?.range.len;
                gm.region_dealloc(r, MapFlags::empty(), None)
                    .map_err(|e| format!("free {region}: {e}"))?;
                self.regions.remove(region);
                self.forget(r.start.as_u64(), len);
            }
            Event::Map { region, dev } => {
                let r = self.region(region)?;
                let id = self.dev_id(*dev);
                gm.region_migrate(r, id, gmem_core::MigrateScope::Prefetch)
                    .map_err(|e| format!("map {region}: {e}"))?;
            }
            Event::Policy {
                region,
                remote,
                target,
            } => {
                let r = self.region(region)?;
                let target = match target {
                    Target::Faulting => PlacementTarget::Faulting,
                    Target::Host => PlacementTarget::Host,
                    Target::Dev(d) => PlacementTarget::Device(self.dev_id(*d)),
                };
                let mode = if *remote {
                    PlacementMode::RemoteAccess
                } else {
                    PlacementMode::Unique
                };
                gm.region_set_policy(r, Placement { target, mode })
                    .map_err(|e| format!("policy {region}: {e}"))?;
            }
            Event::Protect { region, write } => {
                let r = self.region(region)?;
                let prot = if *write { Prot::RW } else { Prot::READ };
                gm.region_protect(r, prot)
                    .map_err(|e| format!("protect {region}: {e}"))?;
            }
            Event::Sync => gm
                .as_synchronize(self.m.space())
                .map_err(|e| e.to_string())?,
            Event::Access {
                dev,
                write,
                at,
                len,
            } => {
                let start = self.resolve(at, *len)?;
                let on = Replayer::on(*dev);
                if *write {
                    self.stamp += 1;
                    let data: Vec<u8> = (0..*len)
                        .map(|i| pattern_byte(start + i, self.stamp))
                        .collect();
                    self.m.store(on, start, &data)?;
                    for (i, b) in data.iter().enumerate() {
                        let a = start + i as u64;
                        self.model
                            .entry(a / PAGE_SIZE)
                            .or_insert_with(|| Box::new([0; PAGE_SIZE as usize]))
                            [(a % PAGE_SIZE) as usize] = *b;
                    }
                    self.counts.stores += 1;
                } else {
                    let mut got = vec![0u8; *len as usize];
                    self.m.load(on, start, &mut got)?;
                    for (i, b) in got.iter().enumerate() {
                        let a = start + i as u64;
                        let want = self
                            .model
                            .get(&(a / PAGE_SIZE))
                            .map_or(0, |p| p[(a % PAGE_SIZE) as usize]);
                        if *b != want {
                            return Err(format!("load at {a:#x} read {b:#04x}, the reference model holds {want:#04x}"));
                        }
                    }
                    self.counts.loads += 1;
                }
                self.counts.bytes += len;
            }
        }
        Ok(())
    }

    /// Check the core's invariants.
    ///
    /// # Errors
    /// As [`Machine::check`].
    pub fn check(&self) -> Result<(), String> {
        self.m.check()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::trace::{Format, Reader};

    fn replay(text: &str, format: Format, gpu_pages: u64) -> Result<Replayer, String> {
        let mut r = Replayer::new(gpu_pages, 4096)?;
        for ev in Reader::new(text.as_bytes(), "t", format) {
            r.step(&ev.map_err(|e| e.to_string())?)?;
            r.check()?;
        }
        Ok(r)
    }

    #[test]
    fn gmem_trace_replays_with_migration_and_oversubscription_and_verifies() {
        let t = "alloc a 64K\nalloc b 64K\naccess cpu w a 64K\naccess gpu r a 64K\naccess gpu w b 64K\n\
                 access cpu r b 64K\npolicy a remote\naccess gpu r a+4K 100\nmap b gpu\nsync\nfree a\nfree b\n";
        let r = replay(t, Format::Gmem, 8).unwrap();
        assert_eq!(r.counts.loads, 3);
        let s = r.stats();
        assert!(
            s.evictions > 0,
            "8 GPU pages for 32 pages of data must evict"
        );
        assert!(s.bytes_host_to_dev > 0 && s.bytes_dev_to_host > 0);
    }

    #[test]
    fn lackey_trace_replays_on_the_gpu_with_chunks_allocated_on_first_touch() {
        let t = " S 7ff000b8,8\n L 7ff000b8,8\n M 04222cac,4\n L 04222cac,4\n L 041ffffe,4\n";
        let r = replay(t, Format::Lackey { on: Dev::Gpu }, 64).unwrap();
        assert_eq!((r.counts.loads, r.counts.stores), (3, 2));
        assert_eq!(
            r.chunks.len(),
            3,
            "one chunk per 2 MiB touched, the last access straddles two"
        );
    }

    fn replay_err(text: &str) -> String {
        match replay(text, Format::Gmem, 8) {
            Ok(_) => panic!("{text:?} replayed without error"),
            Err(e) => e,
        }
    }

    #[test]
    fn semantic_errors_are_reported_not_panicked() {
        assert!(replay_err("free nope\n").contains("not allocated"));
        assert!(replay_err("alloc a 4K\naccess cpu r a+4K 1\n").contains("past the region"));
        assert!(replay_err("alloc a 4K\nalloc a 4K\n").contains("already"));
        let prot = replay_err("alloc a 4K\nprotect a r\naccess gpu w a 1\n");
        assert!(prot.contains("ProtectionViolation"), "{prot}");
    }
}
