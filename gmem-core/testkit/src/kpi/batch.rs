//! Batched faults in the KPI runner (`dev_fault_batch`, `dev_set_prefetch`): the
//! model's answer for each record is what a lone `dev_fault` of its page (with the
//! accesses of the page's records merged) would get (or `Throttled`, while a
//! thrashing detector throttles); a batch refused whole (an unknown, unfaultable or
//! inactive device, an empty batch) changes nothing.

use super::*;
use gmem_core::policy::batch::BatchError;
use gmem_core::policy::prefetch::PrefetchConfig;
use gmem_core::BatchFault;

impl KpiRunner {
    /// `dev_set_prefetch` as the op's `prefetch` byte says (0: no call).
    pub(super) fn set_prefetch(&mut self, ctx: &str, dev: usize, p: u8) {
        let config = match p {
            0 => return,
            1 => None,
            p => {
                Some(PrefetchConfig::new(1 + p % 100, 1 << (p % 5)).expect("a valid configuration"))
            }
        };
        let id = self.devices[dev];
        let r = self.sys.gm.dev_set_prefetch(id, config);
        if !self.alive[dev] {
            return self.misuse(ctx, r, DeviceError::UnknownDevice(id));
        }
        assert_eq!(r, Ok(()), "{ctx}");
        assert_eq!(self.sys.gm.dev_prefetch(id), Ok(config), "{ctx}");
        self.prefetch[dev] = config.is_some();
        self.summary.succeeded += 1;
    }

    /// `dev_fault_batch` of `records` (address, store) by `dev`.
    pub(super) fn fault_batch(&mut self, ctx: &str, dev: usize, records: &[(u64, bool)]) {
        let id = self.devices[dev];
        let batch: Vec<BatchFault> = records
            .iter()
            .map(|&(va, write)| BatchFault {
                va: VirtAddr::new(va),
                access: prot_access(write),
            })
            .collect();
        // The whole batch is refused for what refuses any fault of the device, and
        // for an empty batch, before anything else: nothing may change.
        let whole = if !self.alive[dev] {
            Some(FaultError::UnknownDevice(id))
        } else if dev == IO {
            Some(FaultError::NotFaultable(id))
        } else if records.is_empty() {
            Some(FaultError::Batch(BatchError::Empty))
        } else if self.active[dev].is_none() {
            Some(FaultError::NotActive(id))
        } else {
            None
        };
        self.checkpoint();
        let got = self.sys.gm.dev_fault_batch(id, &batch);
        if let Some(e) = whole {
            assert_eq!(got.as_ref().err(), Some(&e), "{ctx}: fault batch");
            self.summary.rejected += 1;
            self.unchanged(ctx);
            return;
        }
        let report = got.unwrap_or_else(|e| panic!("{ctx}: fault batch refused: {e:?}"));
        assert_eq!(report.outcomes.len(), records.len(), "{ctx}");
        // Each page's expectation with its records' accesses merged (a read and a
        // write of one page are one write fault), computed before anything moved.
        // The core names the page's address (not a record's) and the merged access.
        let mut pages: BTreeMap<u64, Prot> = BTreeMap::new();
        for &(va, write) in records {
            *pages.entry(va / PAGE_SIZE).or_default() |= prot_access(write);
        }
        let expect: BTreeMap<u64, Expect> = pages
            .iter()
            .map(|(&page, &access)| {
                let write = access.contains(Prot::WRITE);
                let e = match self.expect_access(dev, page * PAGE_SIZE, write, true) {
                    Expect::Err(AccessError::Fault(FaultError::ProtectionViolation {
                        va,
                        allowed,
                        ..
                    })) => Expect::Err(AccessError::Fault(FaultError::ProtectionViolation {
                        va,
                        access,
                        allowed,
                    })),
                    e => e,
                };
                (page, e)
            })
            .collect();
        assert_eq!(report.pages, pages.len() as u64, "{ctx}");
        assert_eq!(
            report.duplicates,
            (records.len() - pages.len()) as u64,
            "{ctx}"
        );
        for (&(va, _), outcome) in records.iter().zip(&report.outcomes) {
            let page = va / PAGE_SIZE;
            let ok = match (&expect[&page], outcome) {
                (Expect::Ok | Expect::Either(_), Ok(_)) => true,
                // Thrashing, and another device has the page for this period.
                (e, Err(FaultError::Throttled(at)))
                    if self.throttle_allowed(dev, page * PAGE_SIZE, e) =>
                {
                    assert_eq!(at.vpn().0, page, "{ctx}: throttled at another page");
                    self.summary.throttled += 1;
                    false
                }
                (Expect::Err(AccessError::Fault(e)), Err(got)) if e == got => false,
                (Expect::Either(set), Err(got)) if set.contains(&AccessError::Fault(*got)) => false,
                (e, got) => panic!("{ctx}: batched fault at {va:#x}: expected {e:?}, got {got:?}"),
            };
            if ok {
                self.populated(dev, va);
            }
        }
        if report.failed() == 0 {
            self.summary.succeeded += 1;
        }
        // Prefetch may zero-fill pages of the faulted regions the model did not touch.
        if self.prefetch[dev] || report.prefetched > 0 {
            if let Some(slot) = self.active[dev] {
                for &(va, _) in records {
                    let start = self.space(slot).region_at(va).map(RegionModel::start);
                    if let Some(start) = start {
                        let r = self.region_mut(slot, start);
                        if r.kind == Kind::Anonymous {
                            r.maybe_populated = true;
                        }
                    }
                }
            }
        }
    }
}
