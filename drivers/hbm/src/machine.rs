//! [`HbmMachine`]: the whole CODA system of §5 as one gmem instance — the stacks'
//! memory ([`HbmMemory`]), one shared table ([`HbmTables`]) walked by one MMU whose
//! units are the near-data SMs and, last, the host CPU, and one address space.
//!
//! The host CPU and the SMs share the table (the paper's shared mode): they are units
//! of one translator, so a page the host first touched is already mapped for the SMs,
//! with the granularity bit its frame's page group has. Every access is translated by
//! the requester's unit (its TLBs), faults go to the core (`dev_fault`), and the bytes
//! move through [`HbmMemory::load`] / [`HbmMemory::store`] under the bit of the
//! translation that served them — so a wrong bit reads wrong bytes, and traffic is
//! counted by path.

use crate::attrs::CodaAttrs;
use crate::config::{ConfigError, HbmConfig};
use crate::decode::{decode, Granularity};
use crate::memory::{HbmMemory, Requester, Traffic};
use crate::mmu::{granularity_of, HbmTables};
use core::fmt;
use gmem_core::{
    Activation, AllocPolicy, AllocRequest, DevCaps, DeviceDesc, DeviceId, Gmem, MapFlags, MemError,
    MmuMode, PhysAddr, Prot, Region, SingleCpu, SpaceId, Stats, VaRange, VirtAddr, PAGE_SIZE,
};
use gmem_sim::{HierarchyConfig, Replacement, SimMemory, SimMmu, TlbConfig, Translator};
use std::string::{String, ToString};
use std::sync::Arc;
use std::vec;
use std::vec::Vec;

/// Why the machine refused or failed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum MachineError {
    /// A bad configuration.
    Config(ConfigError),
    /// The core or a simulated driver refused an operation (which, and why).
    Core(String),
    /// An access left the stacks' memory.
    Memory(MemError),
    /// An access kept faulting at this address (no mapping the core could make).
    Unresolved(u64),
}

impl fmt::Display for MachineError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            MachineError::Config(e) => write!(f, "configuration: {e}"),
            MachineError::Core(e) => write!(f, "core: {e}"),
            MachineError::Memory(e) => write!(f, "memory: {e:?}"),
            MachineError::Unresolved(va) => write!(f, "access at {va:#x} keeps faulting"),
        }
    }
}

impl std::error::Error for MachineError {}

fn core<E: fmt::Debug>(what: &str) -> impl FnOnce(E) -> MachineError + '_ {
    move |e| MachineError::Core(std::format!("{what}: {e:?}"))
}

/// The CODA system: stacks, SMs, host, one shared table, one address space.
pub struct HbmMachine {
    cfg: HbmConfig,
    gm: Gmem,
    space: SpaceId,
    dev: DeviceId,
    mem: Arc<HbmMemory>,
    tables: Arc<HbmTables>,
    mmu: Arc<SimMmu<HbmTables>>,
}

impl HbmMachine {
    /// A machine for `cfg`: per SM (and for the host) a 32-entry L1 TLB, a shared
    /// 512-entry TLB.
    ///
    /// # Errors
    /// [`MachineError::Config`] for a bad configuration, [`MachineError::Core`] if the
    /// core refuses the device or the space.
    pub fn new(cfg: HbmConfig) -> Result<HbmMachine, MachineError> {
        let mem = Arc::new(HbmMemory::new(cfg).map_err(MachineError::Config)?);
        let table_frames = cfg.total_bytes() / PAGE_SIZE / 256 + 64;
        let table_mem = Arc::new(
            SimMemory::new("hbm-tables", PhysAddr::new(0), table_frames * PAGE_SIZE)
                .map_err(core("table memory"))?,
        );
        let tables = Arc::new(
            HbmTables::new(table_mem, PhysAddr::new(0), table_frames, mem.clone())
                .map_err(core("tables"))?,
        );
        let tlbs = HierarchyConfig {
            units: cfg.sms() as usize + 1,
            l1: TlbConfig::new(1, 32, Replacement::Lru),
            l2: Some(TlbConfig::new(32, 16, Replacement::Lru)),
            walk_cache: None,
        };
        let mmu = Arc::new(SimMmu::new(tables.clone(), tlbs).map_err(core("tlbs"))?);
        let gm = Gmem::new(
            Arc::new(SingleCpu),
            DeviceDesc {
                name: "coda".to_string(),
                mmu: mmu.clone(),
                memory: Some(mem.clone()),
                caps: DevCaps::FAULTABLE,
                data: None,
            },
        )
        .map_err(core("host device"))?;
        let dev = gm.host();
        gm.dev_register_physmem(dev, cfg.base, cfg.end())
            .map_err(core("physmem"))?;
        gm.dev_set_page_groups(dev, Some(cfg.group_order()))
            .map_err(core("page groups"))?;
        let space = gm
            .as_create(
                VirtAddr::new(1 << 32),
                VirtAddr::new(1 << 40),
                AllocPolicy::empty(),
            )
            .map_err(core("space"))?;
        gm.as_attach(space, dev, MmuMode::Shared, Activation::Switch)
            .map_err(core("attach"))?;
        Ok(HbmMachine {
            cfg,
            gm,
            space,
            dev,
            mem,
            tables,
            mmu,
        })
    }

    /// The configuration.
    pub fn config(&self) -> &HbmConfig {
        &self.cfg
    }

    /// The stacks' memory.
    pub fn memory(&self) -> &Arc<HbmMemory> {
        &self.mem
    }

    /// The core instance.
    pub fn gmem(&self) -> &Gmem {
        &self.gm
    }

    /// The core's counters.
    pub fn stats(&self) -> Stats {
        self.gm.stats()
    }

    /// Traffic counted so far.
    pub fn traffic(&self) -> Traffic {
        self.mem.traffic()
    }

    /// An object of `bytes` (rounded up to pages), aligned to a page group, each
    /// fault placing one page; fine grain until [`HbmMachine::set_attrs`].
    ///
    /// # Errors
    /// [`MachineError::Core`] if the space has no room.
    pub fn alloc(&self, bytes: u64) -> Result<Region, MachineError> {
        let size = bytes.max(1).div_ceil(PAGE_SIZE) * PAGE_SIZE;
        let req = AllocRequest {
            align: self.cfg.group_bytes(),
            ..AllocRequest::new(size)
        };
        let r = self.gm.as_alloc(self.space, req).map_err(core("alloc"))?;
        self.gm
            .region_set_zero_fill_block(r, PAGE_SIZE)
            .map_err(core("zero-fill block"))?;
        Ok(r)
    }

    /// Give a whole object its placement descriptor (before the first touch).
    ///
    /// # Errors
    /// [`MachineError::Core`] for a stale region.
    pub fn set_attrs(&self, region: Region, attrs: CodaAttrs) -> Result<(), MachineError> {
        self.gm
            .region_set_attrs(region, attrs.encode())
            .map_err(core("attrs"))
    }

    /// Give the pages `[va, va + len)` of `region` a descriptor.
    ///
    /// # Errors
    /// [`MachineError::Core`] for a stale region or a range outside it.
    pub fn set_attrs_range(
        &self,
        region: Region,
        va: u64,
        len: u64,
        attrs: CodaAttrs,
    ) -> Result<(), MachineError> {
        let range = VaRange::new(VirtAddr::new(va), len).map_err(core("range"))?;
        self.gm
            .region_set_attrs(gmem_core::Pages::range(region.space, range), attrs.encode())
            .map_err(core("attrs range"))
    }

    /// The descriptor that puts the page at `va` in `stack` (a one-page chunk whose
    /// grid starts `stack` pages earlier; the space starts at 4 GiB, so there is room).
    pub fn page_in_stack(&self, va: u64, stack: u32) -> CodaAttrs {
        let page = va / PAGE_SIZE * PAGE_SIZE;
        CodaAttrs::coarse(
            page.saturating_sub(u64::from(stack % self.cfg.stacks) * PAGE_SIZE),
            PAGE_SIZE,
            self.cfg.stacks,
        )
    }

    /// The frame holding `va`, if it has one.
    pub fn frame(&self, va: u64) -> Option<PhysAddr> {
        match self.gm.as_page_frame(self.space, VirtAddr::new(va)) {
            Ok(Some((_, pa))) => Some(PhysAddr::new(pa.as_u64() + va % PAGE_SIZE)),
            _ => None,
        }
    }

    /// The mode and stack of the frame holding `va` (the page group's, not a PTE's).
    pub fn placement_of(&self, va: u64) -> Option<(Granularity, u32)> {
        let pa = self.frame(va)?;
        let g = self.mem.granularity(pa)?;
        Some((g, decode(&self.cfg, pa, g)?.stack))
    }

    fn unit(&self, who: Requester) -> usize {
        match who {
            Requester::Sm(n) => n as usize,
            Requester::Host => self.cfg.sms() as usize,
        }
    }

    /// Walk `[va, va + len)` page by page, translating for `who` (faulting in what is
    /// missing), and call `f(pa, bit, offset, n)` for each piece.
    fn each_piece(
        &self,
        who: Requester,
        va: u64,
        len: u64,
        access: Prot,
        mut f: impl FnMut(PhysAddr, Granularity, usize, usize) -> Result<(), MemError>,
    ) -> Result<(), MachineError> {
        if let Requester::Sm(n) = who {
            if n >= self.cfg.sms() {
                return Err(MachineError::Core(std::format!("no SM {n}")));
            }
        }
        let unit = self.unit(who);
        let mut done = 0;
        while done < len {
            let at = va + done;
            let n = (PAGE_SIZE - at % PAGE_SIZE).min(len - done);
            let mut tries = 0;
            let leaf = loop {
                match self.mmu.translate(unit, VirtAddr::new(at), access) {
                    Ok(l) => break l,
                    Err(_) if tries < 3 => {
                        tries += 1;
                        let _retry = self
                            .gm
                            .dev_fault(self.dev, VirtAddr::new(at), access)
                            .map_err(core("fault"))?;
                    }
                    Err(_) => return Err(MachineError::Unresolved(at)),
                }
            };
            let pa = leaf.translate(VirtAddr::new(at));
            f(pa, granularity_of(leaf.bits), done as usize, n as usize)
                .map_err(MachineError::Memory)?;
            done += n;
        }
        Ok(())
    }

    /// Load `buf.len()` bytes at `va` as `who` (counted by path).
    ///
    /// # Errors
    /// [`MachineError`] if the address is not allocated or the access fails.
    pub fn load(&self, who: Requester, va: u64, buf: &mut [u8]) -> Result<(), MachineError> {
        let len = buf.len() as u64;
        self.each_piece(who, va, len, Prot::READ, |pa, g, at, n| {
            self.mem.load(who, pa, g, &mut buf[at..at + n])
        })
    }

    /// Store `data` at `va` as `who` (counted by path).
    ///
    /// # Errors
    /// [`MachineError`] if the address is not allocated or the access fails.
    pub fn store(&self, who: Requester, va: u64, data: &[u8]) -> Result<(), MachineError> {
        let len = data.len() as u64;
        self.each_piece(who, va, len, Prot::WRITE, |pa, g, at, n| {
            self.mem.store(who, pa, g, &data[at..at + n])
        })
    }

    /// Load `buf.len()` bytes at `va` as `who` without counting traffic: each piece's
    /// `(pa, bit, len)` goes to `seen` first, which accounts it (through the executor's
    /// data caches, [`crate::dcache`]); the bytes themselves always come from memory.
    ///
    /// # Errors
    /// As [`HbmMachine::load`], or what `seen` returns.
    pub fn load_via(
        &self,
        who: Requester,
        va: u64,
        buf: &mut [u8],
        mut seen: impl FnMut(PhysAddr, Granularity, u64) -> Result<(), MemError>,
    ) -> Result<(), MachineError> {
        let len = buf.len() as u64;
        self.each_piece(who, va, len, Prot::READ, |pa, g, at, n| {
            seen(pa, g, n as u64)?;
            self.mem.read_as(pa, g, &mut buf[at..at + n])
        })
    }

    /// Store `data` at `va` as `who` without counting traffic (see
    /// [`HbmMachine::load_via`]).
    ///
    /// # Errors
    /// As [`HbmMachine::store`], or what `seen` returns.
    pub fn store_via(
        &self,
        who: Requester,
        va: u64,
        data: &[u8],
        mut seen: impl FnMut(PhysAddr, Granularity, u64) -> Result<(), MemError>,
    ) -> Result<(), MachineError> {
        let len = data.len() as u64;
        self.each_piece(who, va, len, Prot::WRITE, |pa, g, at, n| {
            seen(pa, g, n as u64)?;
            self.mem.write_as(pa, g, &data[at..at + n])
        })
    }

    /// Load `n` 32-bit words at `va`.
    ///
    /// # Errors
    /// As [`HbmMachine::load`].
    pub fn load_u32s(&self, who: Requester, va: u64, n: usize) -> Result<Vec<u32>, MachineError> {
        let mut b = vec![0u8; n * 4];
        self.load(who, va, &mut b)?;
        Ok(b.chunks_exact(4)
            .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect())
    }

    /// Store 32-bit words at `va`.
    ///
    /// # Errors
    /// As [`HbmMachine::store`].
    pub fn store_u32s(&self, who: Requester, va: u64, words: &[u32]) -> Result<(), MachineError> {
        let b: Vec<u8> = words.iter().flat_map(|w| w.to_le_bytes()).collect();
        self.store(who, va, &b)
    }

    /// Load `n` floats at `va`.
    ///
    /// # Errors
    /// As [`HbmMachine::load`].
    pub fn load_f32s(&self, who: Requester, va: u64, n: usize) -> Result<Vec<f32>, MachineError> {
        Ok(self
            .load_u32s(who, va, n)?
            .into_iter()
            .map(f32::from_bits)
            .collect())
    }

    /// Store floats at `va`.
    ///
    /// # Errors
    /// As [`HbmMachine::store`].
    pub fn store_f32s(&self, who: Requester, va: u64, v: &[f32]) -> Result<(), MachineError> {
        let w: Vec<u32> = v.iter().map(|x| x.to_bits()).collect();
        self.store_u32s(who, va, &w)
    }

    /// Move the page at `va` of `region` into `stack`, as `who` (an SM that touched
    /// it) asks: its bytes are read through the old translation, the page gets a
    /// descriptor for `stack`, loses its frame, faults a new one (coarse in `stack`
    /// if a slot is free, else fine grain — the core counts the fallback) and gets
    /// its bytes back through the new translation. Both copies are counted as traffic
    /// of `who`. Returns where the page landed.
    ///
    /// # Errors
    /// [`MachineError`] for a page outside `region` or a refused fault.
    pub fn migrate_page(
        &self,
        region: Region,
        who: Requester,
        va: u64,
        stack: u32,
    ) -> Result<Option<(Granularity, u32)>, MachineError> {
        let page = va / PAGE_SIZE * PAGE_SIZE;
        let mut bytes = vec![0u8; PAGE_SIZE as usize];
        self.load(who, page, &mut bytes)?;
        self.set_attrs_range(region, page, PAGE_SIZE, self.page_in_stack(page, stack))?;
        let range = VaRange::new(VirtAddr::new(page), PAGE_SIZE).map_err(core("range"))?;
        self.gm
            .region_unmap(
                gmem_core::Pages::range(region.space, range),
                MapFlags::empty(),
                None,
            )
            .map_err(core("unmap"))?;
        self.store(who, page, &bytes)?;
        Ok(self.placement_of(page))
    }

    /// Fault injection for the must-hold test: the PTE (and so every TLB entry) of the
    /// page at `va` of `region` gets the opposite granularity bit, its data staying
    /// where they are. The page is remapped with its region's attributes.
    ///
    /// # Errors
    /// [`MachineError::Core`] if the page has no frame or the remap is refused.
    pub fn flip_granularity_bit(&self, region: Region, va: u64) -> Result<(), MachineError> {
        let pa = self
            .frame(va)
            .ok_or_else(|| MachineError::Core("page has no frame".to_string()))?;
        self.tables.set_wrong_bit(pa, true);
        let page = va / PAGE_SIZE * PAGE_SIZE;
        let info = self.gm.region_info(region).map_err(core("region info"))?;
        // Setting the page's attributes again unmaps it (frame kept); the next
        // access maps it anew and the leaf gets the wrong bit.
        let range = VaRange::new(VirtAddr::new(page), PAGE_SIZE).map_err(core("range"))?;
        self.gm
            .region_set_attrs(gmem_core::Pages::range(region.space, range), info.attrs)
            .map_err(core("attrs"))
    }

    /// The core's structural invariants of the space (page groups uniform, ...).
    ///
    /// # Errors
    /// A description of the first violation.
    pub fn check_invariants(&self) -> Result<(), MachineError> {
        self.gm
            .check_invariants(self.space)
            .map_err(core("invariants"))
    }

    /// Page groups by class as the core keeps them, `(fine, coarse)` — groups with
    /// every frame free included (they keep their last class).
    pub fn page_groups(&self) -> (u64, u64) {
        let mut out = (0, 0);
        if let Ok(Some(s)) = self.gm.dev_page_groups(self.dev) {
            for &(class, groups, _) in &s.by_class {
                match Granularity::of_class(class) {
                    Granularity::Fine => out.0 += groups,
                    Granularity::Coarse => out.1 += groups,
                }
            }
        }
        out
    }
}
