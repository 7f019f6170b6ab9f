//! Batched faults and tree prefetch (issue 35, items 1 and 2):
//! [`Gmem::dev_fault_batch`], [`Gmem::dev_set_prefetch`], [`Gmem::dev_prefetch`].
//!
//! A GPU does not stop at its first translation miss: its fault buffer collects the
//! misses of many warps and the driver fetches them in batches (UVM's
//! `uvm_gpu_replayable_faults.c`). `dev_fault_batch` takes such a batch from one
//! device, deduplicates it by page and groups it by 2 MiB block
//! ([`crate::policy::batch::FaultBatcher`]), and serves each block under one hold of
//! the space lock (`space::batch`): every faulted page as [`Gmem::dev_fault`] would,
//! the stale-TLB invalidations of the block's spurious faults as one call, then —
//! for a device with a [`PrefetchConfig`] — the pages UVM's tree prefetcher
//! ([`crate::policy::prefetch::plan`]) adds. The driver replays once per batch.
//!
//! A record that cannot be served (no region, a page of no access, ...) is an
//! outcome of the batch, not its failure; a malformed batch or a bad device handle is
//! a typed error that serves nothing.

use crate::addr::{VirtAddr, Vpn};
use crate::error::{DeviceError, FaultError};
use crate::fault::FaultResolution;
use crate::flags::Prot;
use crate::gmem::Gmem;
use crate::handle::DeviceId;
use crate::policy::batch::{BatchConfig, FaultBatcher, FaultRecord};
use crate::policy::prefetch::PrefetchConfig;
use crate::stats::Counters;
use crate::sync::{Arc, Ordering};
use alloc::vec::Vec;

/// One fault of a batch: the faulting address (any offset in its page) and the access.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BatchFault {
    /// The faulting address.
    pub va: VirtAddr,
    /// The access that faulted (non-empty).
    pub access: Prot,
}

/// What [`Gmem::dev_fault_batch`] did.
#[derive(Clone, Debug, PartialEq, Eq)]
#[must_use = "the driver must replay the faulting accesses"]
pub struct BatchReport {
    /// One outcome per record, in the batch's order (a duplicate shares its page's).
    pub outcomes: Vec<Result<FaultResolution, FaultError>>,
    /// Distinct pages serviced.
    pub pages: u64,
    /// Records that repeated a page earlier in the batch.
    pub duplicates: u64,
    /// 2 MiB blocks serviced (one space-lock hold each).
    pub blocks: u64,
    /// Pages the tree prefetcher brought besides the faulted ones.
    pub prefetched: u64,
}

impl BatchReport {
    /// Records whose fault failed.
    pub fn failed(&self) -> usize {
        self.outcomes.iter().filter(|r| r.is_err()).count()
    }
}

/// A prefetch configuration as the device's atomic word: 0 is "off".
fn encode(c: Option<PrefetchConfig>) -> u64 {
    c.map_or(0, |c| {
        1 << 32 | u64::from(c.big_page_pages()) << 8 | u64::from(c.threshold_percent())
    })
}

fn decode(w: u64) -> Option<PrefetchConfig> {
    if w == 0 {
        return None;
    }
    PrefetchConfig::new((w & 0xff) as u8, ((w >> 8) & 0xffff) as u16).ok()
}

impl Gmem {
    /// Turn tree prefetch on (`Some`) or off (`None`) for the batched faults of device
    /// `id` (off by default). UVM's prefetcher is on by default with a 51% threshold
    /// ([`PrefetchConfig::default`], `uvm_perf_prefetch_threshold` in
    /// `uvm_perf_prefetch.c`); here a driver chooses per device, since the device is
    /// where the core keeps a driver's per-device knobs (as the eviction policy).
    ///
    /// # Errors
    /// [`DeviceError::UnknownDevice`] for a stale handle (nothing changes).
    ///
    /// # Examples
    /// ```
    /// # use gmem_core::testing::TestSystem;
    /// # use gmem_core::policy::prefetch::PrefetchConfig;
    /// let sys = TestSystem::new(16);
    /// let cpu = sys.gm.host();
    /// assert_eq!(sys.gm.dev_prefetch(cpu)?, None);
    /// sys.gm.dev_set_prefetch(cpu, Some(PrefetchConfig::new(60, 1)?))?;
    /// assert_eq!(sys.gm.dev_prefetch(cpu)?.map(|c| c.threshold_percent()), Some(60));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn dev_set_prefetch(
        &self,
        id: DeviceId,
        config: Option<PrefetchConfig>,
    ) -> Result<(), DeviceError> {
        let _critical = self.critical();
        let dev = self
            .batch_device(id)
            .ok_or(DeviceError::UnknownDevice(id))?;
        dev.prefetch.store(encode(config), Ordering::Relaxed);
        Ok(())
    }

    /// The tree-prefetch configuration of device `id` (`None`: off).
    ///
    /// # Errors
    /// [`DeviceError::UnknownDevice`] for a stale handle.
    pub fn dev_prefetch(&self, id: DeviceId) -> Result<Option<PrefetchConfig>, DeviceError> {
        let _critical = self.critical();
        let dev = self
            .batch_device(id)
            .ok_or(DeviceError::UnknownDevice(id))?;
        Ok(decode(dev.prefetch.load(Ordering::Relaxed)))
    }

    /// Serve a batch of faults of device `id` in the space it is active in: the batch
    /// deduplicated by page and grouped by 2 MiB block, each block under one hold of
    /// the space lock, each page as [`Gmem::dev_fault`] serves it, the block's
    /// stale-TLB invalidations as one call, and, with prefetch on
    /// ([`Gmem::dev_set_prefetch`]), the pages of the block UVM's tree prefetcher adds
    /// brought to the fault's target memory and mapped (module header). At most 256
    /// records (`UVM_PERF_FAULT_BATCH_COUNT_DEFAULT`). Counted in
    /// [`crate::Stats::fault_batches`], `fault_batch_records`, `fault_batch_duplicates`
    /// and `pages_prefetched`; a failed page in `faults_failed`.
    ///
    /// # Errors
    /// [`FaultError::UnknownDevice`], [`FaultError::NotFaultable`],
    /// [`FaultError::Batch`] (empty, too large, a record without access) and
    /// [`FaultError::NotActive`]: nothing was served. A record that fails is reported
    /// in [`BatchReport::outcomes`].
    ///
    /// # Examples
    /// Three records, two on one page: two pages served, one duplicate, one block.
    /// ```
    /// # use gmem_core::testing::TestSystem;
    /// # use gmem_core::*;
    /// let sys = TestSystem::new(64);
    /// let gm = &sys.gm;
    /// let cpu = gm.host();
    /// let s = gm.as_create(VirtAddr::new(1 << 30), VirtAddr::new(2 << 30), AllocPolicy::empty())?;
    /// gm.as_attach(s, cpu, MmuMode::Coherent, Activation::Switch)?;
    /// let r = gm.as_alloc(s, AllocRequest::new(4 * PAGE_SIZE))?;
    /// let at = |k: u64| BatchFault { va: VirtAddr::new(r.start.as_u64() + k), access: Prot::WRITE };
    /// let rep = gm.dev_fault_batch(cpu, &[at(0), at(8), at(2 * PAGE_SIZE)])?;
    /// assert_eq!((rep.pages, rep.duplicates, rep.blocks, rep.failed()), (2, 1, 1, 0));
    /// assert_eq!(gm.stats().fault_batches, 1);
    /// sys.write(0, r.start, &[5; 8]).unwrap(); // mapped: no further fault
    /// assert_eq!(gm.stats().faults_zero_fill, 2);
    /// assert_eq!(gm.dev_fault_batch(cpu, &[]), Err(FaultError::Batch(policy::batch::BatchError::Empty)));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn dev_fault_batch(
        &self,
        id: DeviceId,
        faults: &[BatchFault],
    ) -> Result<BatchReport, FaultError> {
        let _critical = self.critical();
        let dev = self.batch_device(id).ok_or(FaultError::UnknownDevice(id))?;
        if !dev.faultable() {
            return Err(FaultError::NotFaultable(id));
        }
        let records: Vec<FaultRecord> = faults
            .iter()
            .map(|f| FaultRecord {
                device: id,
                va: f.va,
                access: f.access,
            })
            .collect();
        let mut batcher = FaultBatcher::new(BatchConfig::default());
        let batch = batcher.batch(&records).map_err(FaultError::Batch)?;
        let space = dev
            .binding
            .lock()
            .active_space()
            .ok_or(FaultError::NotActive(id))?;
        let cx = self.context();
        let prefetch = decode(dev.prefetch.load(Ordering::Relaxed));
        // (page, outcome), ascending by page: the groups are ascending by block and
        // their pages ascending.
        let mut served: Vec<(u64, Result<FaultResolution, FaultError>)> = Vec::new();
        let mut prefetched = 0;
        for group in &batch.blocks {
            let mut st = space.lock();
            let faulter = st.attachment_of(id).filter(|_| st.is_alive());
            let Some(faulter) = faulter else {
                for &(p, _) in &group.pages {
                    served.push((group.block.0 + p as u64, Err(FaultError::NotActive(id))));
                }
                continue;
            };
            let done = st.serve_block(&cx, &space, &dev, faulter, group, prefetch);
            drop(st);
            prefetched += done.prefetched;
            for (&(p, _), r) in group.pages.iter().zip(done.outcomes) {
                served.push((group.block.0 + p as u64, r));
            }
        }
        let failed = served.iter().filter(|(_, r)| r.is_err()).count() as u64;
        let c = &self.counters;
        Counters::add(&c.fault_batches, 1);
        Counters::add(&c.fault_batch_records, records.len() as u64);
        Counters::add(&c.fault_batch_duplicates, batch.duplicates);
        Counters::add(&c.faults_failed, failed);
        let outcomes = faults
            .iter()
            .map(|f| {
                let vpn: Vpn = f.va.vpn();
                match served.binary_search_by_key(&vpn.0, |(p, _)| *p) {
                    Ok(i) => served[i].1,
                    Err(_) => Err(FaultError::NotActive(id)),
                }
            })
            .collect();
        Ok(BatchReport {
            outcomes,
            pages: served.len() as u64,
            duplicates: batch.duplicates,
            blocks: batch.blocks.len() as u64,
            prefetched,
        })
    }

    /// The live device `id` (the host included) for the batch KPIs.
    fn batch_device(&self, id: DeviceId) -> Option<Arc<crate::device::DeviceInner>> {
        if id == self.host.id {
            Some(self.host.clone())
        } else {
            self.device(id)
        }
    }
}
