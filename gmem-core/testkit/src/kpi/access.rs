//! Device accesses in the KPI runner: what the model expects of a read, write or
//! `dev_fault`, and the bytes it holds.

use super::*;

impl KpiRunner {
    /// What an access (or, with `direct`, a `dev_fault`) of `dev` at `va` may end with.
    pub(super) fn expect_access(&self, dev: usize, va: u64, write: bool, direct: bool) -> Expect {
        let id = self.devices[dev];
        let v = VirtAddr::new(va);
        let faultable = dev != IO;
        let unmapped = AccessError::Unmapped(v);
        let fault = AccessError::Fault;
        if !self.alive[dev] {
            return Expect::Err(if direct {
                fault(FaultError::UnknownDevice(id))
            } else {
                unmapped
            });
        }
        if direct && !faultable {
            return Expect::Err(fault(FaultError::NotFaultable(id)));
        }
        let Some(slot) = self.active[dev] else {
            return Expect::Err(if faultable {
                fault(FaultError::NotActive(id))
            } else {
                unmapped
            });
        };
        let sp = self.space(slot);
        if !direct && sp.unmap_pending(va) {
            return Expect::Unknown;
        }
        if let Some(d) = sp.dma_at(va) {
            // Every table of the space holds it: a translation, or a refusal by
            // protection (a fault finds no region).
            return if !direct && d.prot.contains(prot_access(write)) {
                Expect::Ok
            } else if faultable {
                Expect::Err(fault(FaultError::NotAllocated(v)))
            } else {
                Expect::Err(unmapped)
            };
        }
        let Some(r) = sp.region_at(va) else {
            return Expect::Err(if faultable {
                fault(FaultError::NotAllocated(v))
            } else {
                unmapped
            });
        };
        let access = prot_access(write);
        let page = (va - r.start()) / PAGE_SIZE;
        let allowed = r.prot_of(page);
        if !allowed.contains(access) {
            return Expect::Err(if faultable {
                fault(FaultError::ProtectionViolation {
                    va: v,
                    access,
                    allowed,
                })
            } else {
                unmapped
            });
        }
        let queue_empty = sp.queue.is_empty();
        match r.kind {
            Kind::Explicit { mapped: false } => Expect::Err(if faultable {
                fault(FaultError::NotMapped(v))
            } else {
                unmapped
            }),
            Kind::Explicit { mapped: true } if r.holes.contains(&page) => {
                Expect::Err(if faultable {
                    fault(FaultError::NotMapped(v))
                } else {
                    unmapped
                })
            }
            Kind::Explicit { mapped: true } => {
                if faultable || (queue_empty && !sp.map_pending(r.start())) {
                    Expect::Ok
                } else {
                    Expect::Either(vec![unmapped])
                }
            }
            Kind::Anonymous if faultable => Expect::Either(vec![
                fault(FaultError::Move(gmem_core::MoveError::OutOfMemory(
                    self.devices[HOST],
                ))),
                fault(FaultError::Move(gmem_core::MoveError::OutOfMemory(
                    self.devices[DGPU],
                ))),
            ]),
            Kind::Anonymous => {
                let replicate = sp.attached.get(&dev) == Some(&MmuMode::Replicate);
                let wired = r.wired.contains(&page);
                if wired && queue_empty {
                    Expect::Ok
                } else if wired || (replicate && (r.populated.contains(&page) || r.maybe_populated))
                {
                    Expect::Either(vec![unmapped])
                } else {
                    Expect::Err(unmapped)
                }
            }
        }
    }

    /// Record that a faultable access populated the page at `va` in `dev`'s space.
    pub(super) fn populated(&mut self, dev: usize, va: u64) {
        let Some(slot) = self.active[dev] else {
            return;
        };
        let Some(start) = self.space(slot).region_at(va).map(RegionModel::start) else {
            return;
        };
        let r = self.region_mut(slot, start);
        if r.kind == Kind::Anonymous {
            r.populated.insert((va - start) / PAGE_SIZE);
            // Block 0 is the faulter's largest page size: 64 KiB for the host and the
            // discrete GPU, whose MMUs map 64 KiB leaves.
            if r.zero_fill_block > PAGE_SIZE
                || (r.zero_fill_block == 0 && matches!(dev, HOST | DGPU))
            {
                r.maybe_populated = true;
            }
        }
    }

    pub(super) fn model_bytes(&self, dev: usize, va: u64, len: usize) -> Vec<u8> {
        let slot = self.active[dev].expect("checked active");
        if let Some(d) = self.space(slot).dma_at(va) {
            return d.bytes_at(va, len);
        }
        let r = self.space(slot).region_at(va).expect("checked region");
        let page = (va - r.start()) / PAGE_SIZE;
        let off = (va % PAGE_SIZE) as usize;
        match r.bytes.get(&page) {
            Some(b) => b[off..off + len].to_vec(),
            None => vec![0; len],
        }
    }

    /// Whether the access succeeded and must be checked against the model; an exact
    /// expected error must also have left the state unchanged.
    pub(super) fn check_outcome<T>(
        &mut self,
        ctx: &str,
        what: &str,
        expect: &Expect,
        r: &Result<T, AccessError>,
    ) -> bool
    where
        T: std::fmt::Debug,
    {
        match (expect, r) {
            (Expect::Unknown, _) => false,
            (Expect::Ok | Expect::Either(_), Ok(_)) => {
                self.summary.succeeded += 1;
                true
            }
            (Expect::Err(e), Err(got)) if e == got => {
                self.summary.rejected += 1;
                self.unchanged(ctx);
                false
            }
            (Expect::Either(set), Err(got)) if set.contains(got) => false,
            (e, got) => panic!("{ctx}: {what}: expected {e:?}, got {got:?}"),
        }
    }

    pub(super) fn write(&mut self, ctx: &str, dev: usize, va: u64, len: usize, seed: u8) {
        let data = pattern(seed, len, va);
        let expect = self.expect_access(dev, va, true, false);
        self.checkpoint();
        if matches!(expect, Expect::Unknown) {
            // A stale translation could take the store: the model could not follow.
            return;
        }
        let r = self.sys.write(dev, VirtAddr::new(va), &data);
        if !self.check_outcome(ctx, "write", &expect, &r) {
            return;
        }
        self.populated(dev, va);
        let slot = self.active[dev].expect("succeeded: active");
        if let Some(d) = self.space_mut(slot).dmas.values_mut().find(|d| d.holds(va)) {
            d.store(va, &data);
        } else {
            let start = self.space(slot).region_at(va).expect("region").start();
            let page = (va - start) / PAGE_SIZE;
            let off = (va % PAGE_SIZE) as usize;
            let m = self.region_mut(slot, start);
            let buf = m
                .bytes
                .entry(page)
                .or_insert_with(|| vec![0; PAGE_SIZE as usize]);
            buf[off..off + len].copy_from_slice(&data);
        }
        // Read back what was written, through the same device.
        let back = self.sys.read(dev, VirtAddr::new(va), len);
        assert_eq!(
            back.as_deref(),
            Ok(&data[..]),
            "{ctx}: read back after write"
        );
        self.summary.succeeded += 1;
        self.summary.bytes_checked += len as u64;
    }

    pub(super) fn read(&mut self, ctx: &str, dev: usize, va: u64, len: usize) {
        let expect = self.expect_access(dev, va, false, false);
        self.checkpoint();
        if matches!(expect, Expect::Unknown) {
            return;
        }
        let r = self.sys.read(dev, VirtAddr::new(va), len);
        if !self.check_outcome(ctx, "read", &expect, &r) {
            return;
        }
        let got = r.expect("checked ok");
        let want = self.model_bytes(dev, va, len);
        self.summary.bytes_checked += len as u64;
        assert!(
            got == want,
            "{ctx}: read {va:#x}+{len} through device {dev}: got {got:?}, model {want:?}"
        );
        if dev != IO {
            self.populated(dev, va);
        }
    }

    pub(super) fn fault(&mut self, ctx: &str, dev: usize, va: u64, write: bool) {
        let expect = self.expect_access(dev, va, write, true);
        self.checkpoint();
        let r = self
            .sys
            .gm
            .dev_fault(self.devices[dev], VirtAddr::new(va), prot_access(write))
            .map_err(AccessError::Fault);
        if let Err(AccessError::Fault(FaultError::Throttled(at))) = r {
            if self.throttle_allowed(dev, va, &expect) {
                // The page thrashes and another device has it for this period: the
                // device retries later, nothing changed.
                assert_eq!(at.as_u64(), va, "{ctx}: throttled at another address");
                self.summary.throttled += 1;
                self.unchanged(ctx);
                return;
            }
        }
        if self.check_outcome(ctx, "fault", &expect, &r) {
            self.populated(dev, va);
        }
    }
}
