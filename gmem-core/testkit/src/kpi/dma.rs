//! DMA mappings in the KPI runner (`dma_map` / `dma_unmap`): the model of each live
//! mapping (its IOVA reservation, frames, protection and bytes), the calls with their
//! predicted outcomes, and the frames' bytes checked in memory at every unmap.

use super::*;
use gmem_core::{DeviceMemory, DmaMapError, DmaMapping, DmaUnmapError};

/// One live DMA mapping as the model knows it.
#[derive(Clone, Debug)]
pub(super) struct DmaModel {
    pub handle: DmaMapping,
    pub frames: Vec<PhysAddr>,
    pub prot: Prot,
    /// The arena reservation (with guard pages): `(start, len)`.
    pub reserve: (u64, u64),
    /// Pages whose bytes are not all zeros (the frames start zeroed: fresh host RAM).
    pub bytes: BTreeMap<u64, Vec<u8>>,
}

impl DmaModel {
    pub fn start(&self) -> u64 {
        self.handle.start.as_u64()
    }
    pub fn pages(&self) -> u64 {
        self.handle.len / PAGE_SIZE
    }
    pub fn holds(&self, va: u64) -> bool {
        va >= self.start() && va - self.start() < self.handle.len
    }
    pub fn bytes_at(&self, va: u64, len: usize) -> Vec<u8> {
        let page = (va - self.start()) / PAGE_SIZE;
        let off = (va % PAGE_SIZE) as usize;
        match self.bytes.get(&page) {
            Some(b) => b[off..off + len].to_vec(),
            None => vec![0; len],
        }
    }
    pub fn store(&mut self, va: u64, data: &[u8]) {
        let page = (va - self.start()) / PAGE_SIZE;
        let off = (va % PAGE_SIZE) as usize;
        self.bytes
            .entry(page)
            .or_insert_with(|| vec![0; PAGE_SIZE as usize])[off..off + data.len()]
            .copy_from_slice(data);
    }
}

impl SpaceModel {
    /// The DMA mapping holding `va`.
    pub(super) fn dma_at(&self, va: u64) -> Option<&DmaModel> {
        let (_, d) = self.dmas.range(..=va).next_back()?;
        d.holds(va).then_some(d)
    }
}

impl KpiRunner {
    /// A live DMA mapping: `(space slot, first IOVA)`.
    pub(super) fn pick_dma(&self, k: u16) -> Option<(usize, u64)> {
        let all: Vec<(usize, u64)> = self
            .live_slots()
            .into_iter()
            .flat_map(|s| {
                self.space(s)
                    .dmas
                    .keys()
                    .map(move |a| (s, *a))
                    .collect::<Vec<_>>()
            })
            .collect();
        (!all.is_empty()).then(|| all[usize::from(k) % all.len()])
    }

    pub(super) fn dma_map(
        &mut self,
        ctx: &str,
        slot: usize,
        pages: u64,
        prot: Prot,
        scattered: bool,
        misuse: DmaMisuse,
    ) {
        let step = if scattered { 2 } else { 1 };
        let mut frames: Vec<PhysAddr> = (0..pages)
            .map(|i| PhysAddr::new(self.next_external + i * step * PAGE_SIZE))
            .collect();
        let host = self.devices[HOST];
        let mut want = None;
        if prot.is_empty() {
            want = Some(DmaMapError::BadProt(prot));
        } else {
            match misuse {
                DmaMisuse::None => {}
                DmaMisuse::NoFrames => {
                    frames.clear();
                    want = Some(DmaMapError::BadLength(0));
                }
                DmaMisuse::UnalignedFrame => {
                    let f = PhysAddr::new(frames[0].as_u64() + 8);
                    frames[0] = f;
                    want = Some(DmaMapError::BadFrame(f));
                }
                DmaMisuse::ManagedFrame => {
                    let f = PhysAddr::new(HOST_BASE);
                    frames[0] = f;
                    want = Some(DmaMapError::BadFrame(f));
                }
            }
        }
        let id = self.space(slot).id;
        let r = self.sys.gm.dma_map(id, &frames, host, prot);
        if let Some(w) = want {
            return self.misuse(ctx, r.map(|_| ()), w);
        }
        let guard = self.space(slot).guard;
        let size = pages * PAGE_SIZE;
        if self.injected(slot) {
            return self.expect_failed(ctx, r.map(|_| ()), DmaMapError::Injected);
        }
        let c = Constraint::new(size + 2 * guard);
        if self.feasible_somewhere(slot, &c).is_none() {
            return self.expect_failed(ctx, r.map(|_| ()), DmaMapError::NoSpace { size });
        }
        let handle = r.unwrap_or_else(|e| panic!("{ctx}: expected a mapping, got {e:?}"));
        let start = handle.start.as_u64();
        let reserve = (start - guard, size + 2 * guard);
        let sp = self.space(slot);
        assert!(
            start - guard >= sp.begin && start + size + guard <= sp.end(),
            "{ctx}: DMA IOVA {start:#x} outside the space"
        );
        assert!(
            sp.busy()
                .iter()
                .all(|&(b, l)| b + l <= reserve.0 || reserve.0 + reserve.1 <= b),
            "{ctx}: DMA IOVA {start:#x} overlaps a live or pending reservation"
        );
        assert_eq!((handle.space, handle.len), (id, size), "{ctx}");
        self.next_external += pages * step * PAGE_SIZE;
        self.summary.succeeded += 1;
        self.summary.dma_maps += 1;
        self.space_mut(slot).dmas.insert(
            start,
            DmaModel {
                handle,
                frames,
                prot,
                reserve,
                bytes: BTreeMap::new(),
            },
        );
    }

    pub(super) fn dma_unmap(
        &mut self,
        ctx: &str,
        which: u16,
        asynchronous: bool,
        cb: bool,
        stale: bool,
    ) {
        let flags = if asynchronous {
            MapFlags::ASYNC
        } else {
            MapFlags::empty()
        };
        if stale && !self.dead_dmas.is_empty() {
            let h = self.dead_dmas[usize::from(which) % self.dead_dmas.len()];
            let want = if self.slot_of(h.space).is_some() {
                DmaUnmapError::StaleMapping(h)
            } else {
                DmaUnmapError::UnknownSpace(h.space)
            };
            let cbk = self.callback(cb, None);
            let r = self.sys.gm.dma_unmap(h, flags, cbk.map(|(_, b)| b));
            // The callback was dropped unrun: its id was never expected.
            return self.misuse(ctx, r, want);
        }
        let Some((slot, start)) = self.pick_dma(which) else {
            return;
        };
        let d = self.space(slot).dmas[&start].clone();
        let cbk = self.callback(cb, Some((slot, start, d.handle.len)));
        let (cid, cbox) = cbk.map_or((None, None), |(i, b)| (Some(i), Some(b)));
        let r = self.sys.gm.dma_unmap(d.handle, flags, cbox);
        assert_eq!(r, Ok(()), "{ctx}");
        self.summary.succeeded += 1;
        // Every byte the devices stored is in the frames (host memory, outside what
        // the core manages).
        let memory = self.sys.devices[HOST].memory.clone().expect("host memory");
        for (k, f) in d.frames.iter().enumerate() {
            let mut got = vec![0u8; PAGE_SIZE as usize];
            memory.read(*f, &mut got).expect("host RAM");
            let want = d.bytes_at(d.start() + k as u64 * PAGE_SIZE, PAGE_SIZE as usize);
            assert!(got == want, "{ctx}: DMA frame {f:?} differs from the model");
            self.summary.bytes_checked += PAGE_SIZE;
        }
        self.summary.dma_unmaps += 1;
        let sp = self.space_mut(slot);
        sp.dmas.remove(&start);
        if asynchronous {
            sp.queue.push(Request::Unmap {
                range: (start, d.handle.len),
                reserve: Some(d.reserve),
                callback: cid,
            });
        } else {
            self.expected_fired.extend(cid);
        }
        self.dead_dmas.push(d.handle);
    }
}
