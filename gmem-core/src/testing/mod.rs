//! A test MMU and test memory that record everything (feature `test-util`).
//!
//! [`TestMmu`] keeps its page tables in a [`TableStore`] (which two MMUs of the same
//! format may share, as shared mode needs) and a TLB of its own that caches translations
//! until the core invalidates them — so a missing invalidation shows up as a stale
//! translation in a test. Every call is recorded as an [`MmuEvent`], in order, in a log
//! that may be shared by several MMUs, so tests can assert which mappings and
//! invalidations happened and in which order relative to frame and range reuse.
//!
//! [`TestMemory`] stores real bytes, sparse and page-granular.
//!
//! [`TestSystem`] puts a [`Gmem`] together with a host and any number of test devices
//! and performs device loads and stores the way hardware would: translate through the
//! device's TLB and page table, on a miss call `dev_fault` and retry, then move bytes in
//! the memory the translation points to.

mod memory;
mod mmu;
mod table;

pub use memory::{MemCounts, TestMemory};
/// How many [`FaultError::Busy`] answers one access waits out before it reports the
/// fault (an unlocked map takes microseconds; this bounds a stuck one).
const BUSY_WAITS: u32 = 1 << 24;

pub use mmu::{EventLog, Gate, GateCall, MmuEvent, Pte, TableStore, TestMmu};

use crate::addr::{PhysAddr, VirtAddr, PAGE_SHIFT, PAGE_SIZE};
use crate::device::DeviceDesc;
use crate::error::FaultError;
use crate::flags::AllocPolicy;
use crate::flags::{DevCaps, PageSizes, Prot};
use crate::gmem::Gmem;
use crate::handle::{DeviceId, SpaceId};
use crate::mmu::DeviceMemory;
use crate::platform::{Platform, SingleCpu};
use crate::space::{Activation, MmuMode};
use crate::sync::{Arc, Mutex};
use alloc::string::String;
use alloc::vec::Vec;

/// One device of a [`TestSystem`].
pub struct TestDevice {
    /// Its handle.
    pub id: DeviceId,
    /// Its MMU.
    pub mmu: Arc<TestMmu>,
    /// Its memory, if it has any.
    pub memory: Option<Arc<TestMemory>>,
}

/// Why a test access failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum AccessError {
    /// The fault could not be served.
    Fault(FaultError),
    /// The device cannot fault and nothing translates the address.
    Unmapped(VirtAddr),
    /// The translation points at memory no device of the system has.
    NoMemory(DeviceId),
    /// A fault was answered with a retry, but the retry faulted again too often.
    Livelock(VirtAddr),
}

/// A GMEM instance with a host and test devices, and hardware-like accesses.
pub struct TestSystem {
    /// The instance.
    pub gm: Gmem,
    /// The host CPU (index 0) and the devices added, in order.
    pub devices: Vec<TestDevice>,
    /// The shared event log.
    pub log: EventLog,
    /// Table store of format 1 (the host's format, shared-mode capable).
    pub host_store: Arc<TableStore>,
    /// Whether devices added from now on declare [`crate::mmu::Mmu::concurrent_edits`].
    pub concurrent_edits: bool,
}

/// Base of the host memory of a [`TestSystem`].
pub const HOST_BASE: u64 = 0x1000_0000;

impl TestSystem {
    /// A system whose host has `host_pages` pages of memory, recording events.
    pub fn new(host_pages: u64) -> TestSystem {
        TestSystem::build(host_pages, true, PageSizes::S4K)
    }

    /// The same without an event log nor frame-request logs (benchmarks).
    pub fn without_log(host_pages: u64) -> TestSystem {
        TestSystem::build(host_pages, false, PageSizes::S4K)
    }

    /// [`TestSystem::new`] with a host MMU that maps the page sizes `sizes`.
    pub fn with_host_sizes(host_pages: u64, sizes: PageSizes) -> TestSystem {
        TestSystem::build(host_pages, true, sizes)
    }

    /// [`TestSystem::new`] on `platform` instead of [`SingleCpu`] (its clock, its
    /// critical sections).
    pub fn with_platform(host_pages: u64, platform: Arc<dyn Platform>) -> TestSystem {
        TestSystem::build_on(platform, host_pages, true, PageSizes::S4K)
    }

    fn build(host_pages: u64, record: bool, sizes: PageSizes) -> TestSystem {
        TestSystem::build_on(Arc::new(SingleCpu), host_pages, record, sizes)
    }

    fn build_on(
        platform: Arc<dyn Platform>,
        host_pages: u64,
        record: bool,
        sizes: PageSizes,
    ) -> TestSystem {
        let log: EventLog = Arc::new(Mutex::new(Vec::new()));
        let host_store = TableStore::new();
        let mut mmu = TestMmu::new(0, 1, host_store.clone(), log.clone()).with_page_sizes(sizes);
        if !record {
            mmu = mmu.without_log();
        }
        let mmu = Arc::new(mmu);
        let memory = if record {
            TestMemory::default()
        } else {
            TestMemory::default().without_request_log()
        };
        let memory = Arc::new(memory);
        let gm = Gmem::new(
            platform,
            DeviceDesc {
                name: String::from("cpu"),
                mmu: mmu.clone(),
                memory: Some(memory.clone()),
                caps: DevCaps::FAULTABLE,
                data: None,
            },
        )
        .expect("the test MMU supports 4 KiB pages");
        let host = gm.host();
        gm.dev_register_physmem(
            host,
            PhysAddr::new(HOST_BASE),
            PhysAddr::new(HOST_BASE + host_pages * PAGE_SIZE),
        )
        .expect("fresh host memory registers");
        TestSystem {
            gm,
            devices: alloc::vec![TestDevice {
                id: host,
                mmu,
                memory: Some(memory)
            }],
            log,
            host_store,
            concurrent_edits: false,
        }
    }

    /// An address space over [1 GiB, 2 GiB) with no policy flags, the host attached
    /// to it (coherent) and active in it: where most tests start.
    pub fn space(&self) -> SpaceId {
        let space = self
            .gm
            .as_create(
                VirtAddr::new(1 << 30),
                VirtAddr::new(2 << 30),
                AllocPolicy::empty(),
            )
            .expect("a fresh test space");
        self.gm
            .as_attach(space, self.host().id, MmuMode::Coherent, Activation::Switch)
            .expect("the host attaches to a fresh space");
        space
    }

    /// Attach device `d` (an index of [`TestSystem::devices`]) to `space` with a
    /// coherent table of its own, and make the space its active one.
    pub fn attach(&self, space: SpaceId, d: usize) {
        self.gm
            .as_attach(
                space,
                self.devices[d].id,
                MmuMode::Coherent,
                Activation::Switch,
            )
            .expect("the device attaches");
    }

    /// The host device.
    pub fn host(&self) -> &TestDevice {
        &self.devices[0]
    }

    /// Add a device with MMU `format` (1 = the host's, so it can share tables),
    /// capabilities, and `mem_pages` pages of local memory at `mem_base` (0 pages = none).
    /// Returns its index in [`TestSystem::devices`].
    pub fn add_device(
        &mut self,
        format: u32,
        caps: DevCaps,
        mem_base: u64,
        mem_pages: u64,
    ) -> usize {
        self.add_device_with_sizes(format, caps, mem_base, mem_pages, PageSizes::S4K)
    }

    /// [`TestSystem::add_device`] with an MMU that maps the page sizes `sizes` (large
    /// leaves are recorded in its table store, see [`TableStore::large_leaves`]).
    pub fn add_device_with_sizes(
        &mut self,
        format: u32,
        caps: DevCaps,
        mem_base: u64,
        mem_pages: u64,
        sizes: PageSizes,
    ) -> usize {
        let n = self.devices.len() as u32;
        let store = if format == 1 {
            self.host_store.clone()
        } else {
            TableStore::new()
        };
        let mut mmu = TestMmu::new(n, format, store, self.log.clone()).with_page_sizes(sizes);
        if self.concurrent_edits {
            mmu = mmu.with_concurrent_edits();
        }
        let record = !self.log.lock().is_empty() || self.devices[0].mmu.record;
        if !record {
            mmu = mmu.without_log();
        }
        let mmu = Arc::new(mmu);
        let memory = (mem_pages > 0).then(|| {
            let m = TestMemory::with_bounds(mem_base, mem_base + mem_pages * PAGE_SIZE);
            Arc::new(if record { m } else { m.without_request_log() })
        });
        let id = self
            .gm
            .dev_create(DeviceDesc {
                name: alloc::format!("dev{n}"),
                mmu: mmu.clone(),
                memory: memory.clone().map(|m| m as Arc<dyn DeviceMemory>),
                caps,
                data: None,
            })
            .expect("the test MMU supports 4 KiB pages");
        if memory.is_some() {
            self.gm
                .dev_register_physmem(
                    id,
                    PhysAddr::new(mem_base),
                    PhysAddr::new(mem_base + mem_pages * PAGE_SIZE),
                )
                .expect("fresh device memory registers");
        }
        self.devices.push(TestDevice { id, mmu, memory });
        self.devices.len() - 1
    }

    fn memory_of(&self, id: DeviceId) -> Option<&Arc<TestMemory>> {
        self.devices
            .iter()
            .find(|d| d.id == id)
            .and_then(|d| d.memory.as_ref())
    }

    /// Perform one access of `dev` (an index) to the page holding `va`, as hardware
    /// would: translate (TLB, then table walk); on a miss or a protection fault drop the
    /// translation, report the fault to the core and retry. `f` runs with the
    /// translation while the access is in flight (an invalidation waits for it).
    ///
    /// # Errors
    /// [`AccessError`]: the fault the core refused (with its typed [`FaultError`]), a
    /// device that cannot fault touching an unmapped address, a translation to memory
    /// no device has, or a retry that kept faulting.
    pub fn access<R>(
        &self,
        dev: usize,
        va: VirtAddr,
        access: Prot,
        f: impl FnOnce(Pte) -> R,
    ) -> Result<R, AccessError> {
        let d = &self.devices[dev];
        let mut f = Some(f);
        // Faults served (the access must succeed within 4), and answers of `Busy`
        // waited out (another thread's unlocked map of the region, bounded too).
        let (mut served, mut waited) = (0, 0u32);
        while served < 4 {
            {
                let _inflight = d.mmu.inflight.read();
                if let Some(p) = d.mmu.translate(va) {
                    if p.prot.contains(access) {
                        let f = f.take().expect("called once");
                        return Ok(f(p));
                    }
                }
            }
            if !self
                .gm
                .dev_caps(d.id)
                .map(|c| c.contains(DevCaps::FAULTABLE))
                .unwrap_or(false)
            {
                return Err(AccessError::Unmapped(va));
            }
            // A real MMU reports the fault and drops its cached translation.
            d.mmu.forget(va);
            match self.gm.dev_fault(d.id, va, access) {
                Ok(_) => served += 1,
                Err(FaultError::Busy(_) | FaultError::Throttled(_)) if waited < BUSY_WAITS => {
                    waited += 1;
                    crate::sync::spin_wait();
                }
                Err(e) => return Err(AccessError::Fault(e)),
            }
        }
        Err(AccessError::Livelock(va))
    }

    /// Translate `va` for device `dev` (an index), faulting as hardware would.
    ///
    /// # Errors
    /// [`AccessError`]: the fault the core refused (with its typed [`FaultError`]), a
    /// device that cannot fault touching an unmapped address, a translation to memory
    /// no device has, or a retry that kept faulting.
    pub fn translate(&self, dev: usize, va: VirtAddr, access: Prot) -> Result<Pte, AccessError> {
        self.access(dev, va, access, |p| p)
    }

    /// Store `data` at `va` through device `dev`.
    ///
    /// # Errors
    /// [`AccessError`]: the fault the core refused (with its typed [`FaultError`]), a
    /// device that cannot fault touching an unmapped address, a translation to memory
    /// no device has, or a retry that kept faulting.
    pub fn write(&self, dev: usize, va: VirtAddr, data: &[u8]) -> Result<(), AccessError> {
        let mut done = 0usize;
        while done < data.len() {
            let a = VirtAddr::new(va.as_u64() + done as u64);
            let n = ((PAGE_SIZE - a.page_offset()) as usize).min(data.len() - done);
            let chunk = &data[done..done + n];
            self.access(dev, a, Prot::WRITE, |p| {
                let mem = self
                    .memory_of(p.memory)
                    .ok_or(AccessError::NoMemory(p.memory))?;
                mem.write(
                    PhysAddr::new((p.pfn << PAGE_SHIFT) + a.page_offset()),
                    chunk,
                )
                .map_err(|e| AccessError::Fault(FaultError::from(e)))
            })??;
            done += n;
        }
        Ok(())
    }

    /// Load `len` bytes at `va` through device `dev`.
    ///
    /// # Errors
    /// [`AccessError`]: the fault the core refused (with its typed [`FaultError`]), a
    /// device that cannot fault touching an unmapped address, a translation to memory
    /// no device has, or a retry that kept faulting.
    pub fn read(&self, dev: usize, va: VirtAddr, len: usize) -> Result<Vec<u8>, AccessError> {
        let mut out = alloc::vec![0u8; len];
        let mut done = 0usize;
        while done < len {
            let a = VirtAddr::new(va.as_u64() + done as u64);
            let n = ((PAGE_SIZE - a.page_offset()) as usize).min(len - done);
            let chunk = &mut out[done..done + n];
            self.access(dev, a, Prot::READ, |p| {
                let mem = self
                    .memory_of(p.memory)
                    .ok_or(AccessError::NoMemory(p.memory))?;
                mem.read(
                    PhysAddr::new((p.pfn << PAGE_SHIFT) + a.page_offset()),
                    chunk,
                )
                .map_err(|e| AccessError::Fault(FaultError::from(e)))
            })??;
            done += n;
        }
        Ok(out)
    }

    /// Take and clear the event log.
    pub fn take_events(&self) -> Vec<MmuEvent> {
        core::mem::take(&mut *self.log.lock())
    }
}
