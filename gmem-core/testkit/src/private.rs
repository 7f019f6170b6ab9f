//! The private-frame runner: device-private frames (`region_alloc_private`, the core
//! side of ADSM/GMAC) driven by an operation list against a model of two copies per
//! page.
//!
//! ## The system
//! A [`TestSystem`] with the host (format 1, 256 pages) and one device that cannot
//! fault, with memory of its own (format 7, 2 + `dev_pages % 24` pages), both attached
//! to one space; the device's table is its own, so it may hold private frames.
//!
//! ## The model
//! Per live region (at most four, 1–8 pages each): its protection, and per page the
//! CPU's bytes (the shared frame), whether it is wired, and whether the device has a
//! private frame there with that frame's bytes and the protection it was mapped with
//! (a region protect changes the shared mappings only). Whether the device is attached.
//!
//! ## What is checked after every operation
//! - the result or the exact typed error the model predicts; every read equals the
//!   model's bytes: the CPU always reads the shared copy; the device reads its private
//!   copy where it has one, else the shared copy where the page is wired (the eager
//!   mirror), else nothing (`Unmapped`: it cannot fault);
//! - [`gmem_core::Gmem::check_invariants`];
//! - the device's wired frames are exactly the private frames, the rest free;
//! - `as_private_frame` names a frame exactly for the pages that have one.

use arbitrary::Arbitrary;
use gmem_core::testing::{AccessError, TestSystem};
use gmem_core::{
    Activation, AllocPolicy, AllocRequest, DevCaps, DeviceId, FaultError, MapFlags, MmuMode,
    PopulateError, Prot, Region, SpaceId, VaRange, VirtAddr, PAGE_SIZE,
};

/// Operations a fuzz input or a seeded sequence may hold at most.
pub const MAX_OPS: usize = 128;

const HOST: usize = 0;
const DEV: usize = 1;
const DEV_BASE: u64 = 0x8000_0000;
const MAX_REGIONS: usize = 4;

/// Sizes of the system.
#[derive(Arbitrary, Clone, Copy, Debug)]
pub struct PrivateSetup {
    /// Device memory: 2 + this modulo 24 pages.
    pub dev_pages: u8,
}

/// One operation. `r` picks a live region (modulo their number), `page` a page of it.
#[derive(Arbitrary, Clone, Copy, Debug)]
pub enum PrivateOp {
    /// `as_alloc` of 1 + `pages % 8` pages.
    Alloc {
        /// Size selector.
        pages: u8,
    },
    /// `region_dealloc`.
    Dealloc {
        /// Region.
        r: u8,
    },
    /// A CPU store of 8 bytes.
    CpuWrite {
        /// Region.
        r: u8,
        /// Page.
        page: u8,
        /// Offset selector.
        off: u16,
        /// Data seed.
        seed: u8,
    },
    /// A CPU load of 8 bytes.
    CpuRead {
        /// Region.
        r: u8,
        /// Page.
        page: u8,
        /// Offset selector.
        off: u16,
    },
    /// A device store of 8 bytes.
    DevWrite {
        /// Region.
        r: u8,
        /// Page.
        page: u8,
        /// Offset selector.
        off: u16,
        /// Data seed.
        seed: u8,
    },
    /// A device load of 8 bytes.
    DevRead {
        /// Region.
        r: u8,
        /// Page.
        page: u8,
        /// Offset selector.
        off: u16,
    },
    /// `region_alloc_private` for the device (or, with `host`, for the CPU: refused).
    AllocPrivate {
        /// Region.
        r: u8,
        /// Ask for the host instead (a faultable device).
        host: bool,
    },
    /// `region_free_private`.
    FreePrivate {
        /// Region.
        r: u8,
    },
    /// `region_wire`.
    Wire {
        /// Region.
        r: u8,
    },
    /// `region_unwire`.
    Unwire {
        /// Region.
        r: u8,
    },
    /// `region_protect` to read-only or read-write.
    Protect {
        /// Region.
        r: u8,
        /// Read-write instead of read-only.
        write: bool,
    },
    /// `region_unmap` of one page.
    UnmapPage {
        /// Region.
        r: u8,
        /// Page.
        page: u8,
    },
    /// `dev_detach` of the device, or `as_attach` again when detached.
    Reattach,
}

struct PageModel {
    cpu: Vec<u8>,
    wired: bool,
    private: Option<(Vec<u8>, Prot)>,
}

struct RegionModel {
    handle: Region,
    prot: Prot,
    pages: Vec<PageModel>,
}

/// The runner.
pub struct PrivateRunner {
    sys: TestSystem,
    space: SpaceId,
    dev: DeviceId,
    dev_pages: u64,
    attached: bool,
    regions: Vec<RegionModel>,
    summary: crate::Summary,
}

fn zero_page() -> Vec<u8> {
    vec![0; PAGE_SIZE as usize]
}

fn pattern(seed: u8, va: u64) -> [u8; 8] {
    let mut b = [0u8; 8];
    for (i, x) in b.iter_mut().enumerate() {
        *x = seed
            .wrapping_add((va as u8).wrapping_mul(7))
            .wrapping_add(i as u8)
            | 1;
    }
    b
}

impl PrivateRunner {
    /// The system and its model.
    pub fn new(setup: PrivateSetup) -> PrivateRunner {
        let mut sys = TestSystem::new(256);
        let space = sys
            .gm
            .as_create(
                VirtAddr::new(1 << 30),
                VirtAddr::new(2 << 30),
                AllocPolicy::empty(),
            )
            .expect("space");
        sys.gm
            .as_attach(space, sys.host().id, MmuMode::Coherent, Activation::Switch)
            .expect("host attach");
        let dev_pages = 2 + u64::from(setup.dev_pages) % 24;
        let d = sys.add_device(7, DevCaps::empty(), DEV_BASE, dev_pages);
        assert_eq!(d, DEV);
        let dev = sys.devices[DEV].id;
        sys.gm
            .as_attach(space, dev, MmuMode::Coherent, Activation::Switch)
            .expect("device attach");
        PrivateRunner {
            sys,
            space,
            dev,
            dev_pages,
            attached: true,
            regions: Vec::new(),
            summary: crate::Summary::default(),
        }
    }

    fn pick(&self, r: u8) -> Option<usize> {
        (!self.regions.is_empty()).then(|| usize::from(r) % self.regions.len())
    }

    fn privates(&self) -> u64 {
        self.regions
            .iter()
            .flat_map(|r| &r.pages)
            .filter(|p| p.private.is_some())
            .count() as u64
    }

    fn addr(&self, i: usize, page: u8, off: u16) -> (usize, u64) {
        let r = &self.regions[i];
        let p = usize::from(page) % r.pages.len();
        // Four 8-byte slots per page, so that accesses meet often.
        let off = [0, 8, PAGE_SIZE / 2, PAGE_SIZE - 8][usize::from(off) % 4];
        (p, r.handle.start.as_u64() + p as u64 * PAGE_SIZE + off)
    }

    /// What the device sees at page `p` of region `i` for `access`: the bytes' owner
    /// (`true`: its private copy), or `None` when it cannot access.
    fn device_view(&self, i: usize, p: usize, access: Prot) -> Option<bool> {
        let r = &self.regions[i];
        let pg = &r.pages[p];
        if !self.attached {
            return None;
        }
        match &pg.private {
            Some((_, prot)) => prot.contains(access).then_some(true),
            None => (pg.wired && r.prot.contains(access)).then_some(false),
        }
    }

    /// Run the operations; panics on the first disagreement with the model.
    pub fn run(mut self, ops: &[PrivateOp]) -> crate::Summary {
        for (k, op) in ops.iter().enumerate() {
            let ctx = format!("op {k} {op:?}");
            self.apply(*op, &ctx);
            self.summary.ops += 1;
            self.check(&ctx);
        }
        // Tear down: everything goes back.
        for r in std::mem::take(&mut self.regions) {
            self.sys
                .gm
                .region_dealloc(r.handle, MapFlags::empty(), None)
                .expect("dealloc at the end");
        }
        let c = self.sys.gm.dev_frames(self.dev).expect("device");
        assert_eq!(
            (c.wired, c.free),
            (0, self.dev_pages),
            "end: all frames free"
        );
        self.summary
    }

    fn check(&mut self, ctx: &str) {
        if let Err(v) = self.sys.gm.check_invariants(self.space) {
            panic!("{ctx}: invariant: {v:?}");
        }
        let c = self.sys.gm.dev_frames(self.dev).expect("device");
        let n = self.privates();
        assert_eq!(
            (c.wired, c.free),
            (n, self.dev_pages - n),
            "{ctx}: device frames"
        );
        for r in &self.regions {
            for (p, pg) in r.pages.iter().enumerate() {
                let va = VirtAddr::new(r.handle.start.as_u64() + p as u64 * PAGE_SIZE);
                let got = self
                    .sys
                    .gm
                    .as_private_frame(self.space, va, self.dev)
                    .expect("lookup");
                assert_eq!(
                    got.is_some(),
                    pg.private.is_some(),
                    "{ctx}: private frame at {va:?}"
                );
                if let Some((mem, pa)) = got {
                    assert!(mem == self.dev && pa.as_u64() >= DEV_BASE, "{ctx}");
                }
            }
        }
    }

    fn apply(&mut self, op: PrivateOp, ctx: &str) {
        let gm = &self.sys.gm;
        match op {
            PrivateOp::Alloc { pages } => {
                if self.regions.len() >= MAX_REGIONS {
                    return;
                }
                let n = 1 + u64::from(pages) % 8;
                let h = gm
                    .as_alloc(self.space, AllocRequest::new(n * PAGE_SIZE))
                    .unwrap_or_else(|e| panic!("{ctx}: {e:?}"));
                self.regions.push(RegionModel {
                    handle: h,
                    prot: Prot::RW,
                    pages: (0..n)
                        .map(|_| PageModel {
                            cpu: zero_page(),
                            wired: false,
                            private: None,
                        })
                        .collect(),
                });
                self.summary.succeeded += 1;
            }
            PrivateOp::Dealloc { r } => {
                let Some(i) = self.pick(r) else { return };
                let m = self.regions.remove(i);
                gm.region_dealloc(m.handle, MapFlags::empty(), None)
                    .unwrap_or_else(|e| panic!("{ctx}: {e:?}"));
                self.summary.succeeded += 1;
            }
            PrivateOp::CpuWrite { r, page, off, seed } => {
                let Some(i) = self.pick(r) else { return };
                let (p, va) = self.addr(i, page, off);
                let data = pattern(seed, va);
                let got = self.sys.write(HOST, VirtAddr::new(va), &data);
                let prot = self.regions[i].prot;
                if prot.contains(Prot::WRITE) {
                    got.unwrap_or_else(|e| panic!("{ctx}: CPU write: {e:?}"));
                    let o = (va % PAGE_SIZE) as usize;
                    self.regions[i].pages[p].cpu[o..o + 8].copy_from_slice(&data);
                    self.summary.succeeded += 1;
                } else {
                    assert_eq!(
                        got,
                        Err(AccessError::Fault(FaultError::ProtectionViolation {
                            va: VirtAddr::new(va),
                            access: Prot::WRITE,
                            allowed: prot,
                        })),
                        "{ctx}"
                    );
                    self.summary.rejected += 1;
                }
            }
            PrivateOp::CpuRead { r, page, off } => {
                let Some(i) = self.pick(r) else { return };
                let (p, va) = self.addr(i, page, off);
                let got = self
                    .sys
                    .read(HOST, VirtAddr::new(va), 8)
                    .unwrap_or_else(|e| panic!("{ctx}: CPU read: {e:?}"));
                let o = (va % PAGE_SIZE) as usize;
                assert_eq!(got, self.regions[i].pages[p].cpu[o..o + 8], "{ctx}");
                self.summary.succeeded += 1;
                self.summary.bytes_checked += 8;
            }
            PrivateOp::DevWrite { r, page, off, seed } => {
                let Some(i) = self.pick(r) else { return };
                let (p, va) = self.addr(i, page, off);
                let data = pattern(seed, va);
                let got = self.sys.write(DEV, VirtAddr::new(va), &data);
                let o = (va % PAGE_SIZE) as usize;
                match self.device_view(i, p, Prot::WRITE) {
                    None => {
                        assert_eq!(got, Err(AccessError::Unmapped(VirtAddr::new(va))), "{ctx}");
                        self.summary.rejected += 1;
                    }
                    Some(private) => {
                        got.unwrap_or_else(|e| panic!("{ctx}: device write: {e:?}"));
                        let pg = &mut self.regions[i].pages[p];
                        let buf = if private {
                            &mut pg.private.as_mut().expect("private").0
                        } else {
                            &mut pg.cpu
                        };
                        buf[o..o + 8].copy_from_slice(&data);
                        self.summary.succeeded += 1;
                    }
                }
            }
            PrivateOp::DevRead { r, page, off } => {
                let Some(i) = self.pick(r) else { return };
                let (p, va) = self.addr(i, page, off);
                let got = self.sys.read(DEV, VirtAddr::new(va), 8);
                let o = (va % PAGE_SIZE) as usize;
                match self.device_view(i, p, Prot::READ) {
                    None => {
                        assert_eq!(got, Err(AccessError::Unmapped(VirtAddr::new(va))), "{ctx}");
                        self.summary.rejected += 1;
                    }
                    Some(private) => {
                        let pg = &self.regions[i].pages[p];
                        let want = if private {
                            &pg.private.as_ref().expect("private").0
                        } else {
                            &pg.cpu
                        };
                        assert_eq!(
                            got.unwrap_or_else(|e| panic!("{ctx}: device read: {e:?}")),
                            want[o..o + 8],
                            "{ctx}: device read {}",
                            if private { "(private)" } else { "(shared)" }
                        );
                        self.summary.succeeded += 1;
                        self.summary.bytes_checked += 8;
                    }
                }
            }
            PrivateOp::AllocPrivate { r, host } => {
                let Some(i) = self.pick(r) else { return };
                let h = self.regions[i].handle;
                if host {
                    let id = self.sys.host().id;
                    assert_eq!(
                        gm.region_alloc_private(h, id),
                        Err(PopulateError::CannotHoldPrivate(id)),
                        "{ctx}"
                    );
                    self.summary.rejected += 1;
                    return;
                }
                let got = gm.region_alloc_private(h, self.dev);
                let need = self.regions[i]
                    .pages
                    .iter()
                    .filter(|p| p.private.is_none())
                    .count() as u64;
                if !self.attached {
                    assert_eq!(got, Err(PopulateError::NotAttached(self.dev)), "{ctx}");
                    self.summary.rejected += 1;
                } else if need > self.dev_pages - self.privates() {
                    assert_eq!(
                        got,
                        Err(PopulateError::Move(gmem_core::MoveError::OutOfMemory(
                            self.dev
                        ))),
                        "{ctx}"
                    );
                    self.summary.rejected += 1;
                } else {
                    assert_eq!(got, Ok(need), "{ctx}");
                    let prot = self.regions[i].prot;
                    for p in &mut self.regions[i].pages {
                        if p.private.is_none() {
                            p.private = Some((zero_page(), prot));
                        }
                    }
                    self.summary.succeeded += 1;
                }
            }
            PrivateOp::FreePrivate { r } => {
                let Some(i) = self.pick(r) else { return };
                let got = gm.region_free_private(self.regions[i].handle, self.dev);
                if !self.attached {
                    assert_eq!(got, Err(PopulateError::NotAttached(self.dev)), "{ctx}");
                    self.summary.rejected += 1;
                    return;
                }
                let mut n = 0;
                for p in &mut self.regions[i].pages {
                    n += u64::from(p.private.take().is_some());
                }
                assert_eq!(got, Ok(n), "{ctx}");
                self.summary.succeeded += 1;
            }
            PrivateOp::Wire { r } => {
                let Some(i) = self.pick(r) else { return };
                let got = gm.region_wire(self.regions[i].handle);
                let mut n = 0;
                for p in &mut self.regions[i].pages {
                    n += u64::from(!p.wired);
                    p.wired = true;
                }
                assert_eq!(got, Ok(n), "{ctx}");
                self.summary.succeeded += 1;
            }
            PrivateOp::Unwire { r } => {
                let Some(i) = self.pick(r) else { return };
                gm.region_unwire(self.regions[i].handle)
                    .unwrap_or_else(|e| panic!("{ctx}: {e:?}"));
                for p in &mut self.regions[i].pages {
                    p.wired = false;
                }
                self.summary.succeeded += 1;
            }
            PrivateOp::Protect { r, write } => {
                let Some(i) = self.pick(r) else { return };
                let prot = if write { Prot::RW } else { Prot::READ };
                gm.region_protect(self.regions[i].handle, prot)
                    .unwrap_or_else(|e| panic!("{ctx}: {e:?}"));
                self.regions[i].prot = prot;
                self.summary.succeeded += 1;
            }
            PrivateOp::UnmapPage { r, page } => {
                let Some(i) = self.pick(r) else { return };
                let (p, _) = self.addr(i, page, 0);
                let h = self.regions[i].handle;
                let range = VaRange {
                    start: VirtAddr::new(h.start.as_u64() + p as u64 * PAGE_SIZE),
                    len: PAGE_SIZE,
                };
                gm.region_unmap(
                    gmem_core::Pages::range(h.space, range),
                    MapFlags::empty(),
                    None,
                )
                .unwrap_or_else(|e| panic!("{ctx}: {e:?}"));
                self.regions[i].pages[p] = PageModel {
                    cpu: zero_page(),
                    wired: false,
                    private: None,
                };
                self.summary.succeeded += 1;
            }
            PrivateOp::Reattach => {
                if self.attached {
                    gm.dev_detach(self.dev, self.space)
                        .unwrap_or_else(|e| panic!("{ctx}: {e:?}"));
                    for p in self.regions.iter_mut().flat_map(|r| &mut r.pages) {
                        p.private = None;
                    }
                } else {
                    gm.as_attach(self.space, self.dev, MmuMode::Coherent, Activation::Switch)
                        .unwrap_or_else(|e| panic!("{ctx}: {e:?}"));
                }
                self.attached = !self.attached;
                self.summary.succeeded += 1;
            }
        }
    }
}
