//! A seeded fragmenter: brings a device's memory to a chosen unusable-free-space index
//! by holding frames. The testkit's frame tests and the harness's MESC reproduction use it.
//!
//! The MESC and CODA experiments sweep fragmentation; this is how a run gets a memory
//! with a known index. [`Fragmenter::fill`] holds every free frame of the device, each
//! behind a one-page region of an address space prefetched into the device's memory
//! (so the frames are ordinary, movable, unwired pages that compaction may move).
//! [`Fragmenter::fragment`] then releases frames so that `free` frames are free and
//! the index at `order` is as close to the target as whole frames allow:
//! - `round((1 - target) · free / 2^order)` aligned blocks of `2^order` frames, chosen at
//!   random among the blocks it holds wholly, are released whole (usable free space);
//! - the rest of `free` is released as single frames (or, with
//!   [`Fragmenter::fragment_runs`], runs of up to a given length) chosen at random among the other
//!   held frames, never the last held frame of a block, so none of them joins a free
//!   block of the order (unusable free space).
//!
//! With nothing else free in the memory the index is then exactly
//! `scattered / free` (see [`gmem_core::FreeExtents::unusable_index`]); the result
//! reports the index the core measures, not the one intended. Choices depend only on
//! the seed and on which frames the core gave out.

use gmem_core::{
    AllocRequest, DeviceId, Gmem, MapFlags, MigrateScope, PhysAddr, Region, SpaceId, PAGE_SIZE,
};
use std::collections::BTreeMap;

/// What [`Fragmenter::fragment`] achieved.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Fragmented {
    /// The order of the index.
    pub order: u32,
    /// The index asked for.
    pub target: f64,
    /// The index the core measures afterwards (`dev_free_extents`).
    pub achieved: f64,
    /// Free frames of the device afterwards.
    pub free: u64,
    /// Frames released as whole aligned blocks.
    pub in_blocks: u64,
    /// Frames released one by one.
    pub scattered: u64,
}

/// Holds frames of one device through one-page regions of one space.
pub struct Fragmenter {
    space: SpaceId,
    dev: DeviceId,
    /// Held frames by frame number, with the region holding each.
    held: BTreeMap<u64, Region>,
}

/// The seeded generator of the fragmenter's choices (xorshift64*, the same sequence as
/// `gmem_testkit::SeedBytes`).
struct SeedBytes(u64);

impl SeedBytes {
    fn new(seed: u64) -> SeedBytes {
        SeedBytes(seed ^ 0x9e37_79b9_7f4a_7c15)
    }

    fn next_u64(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
}

fn shuffle<T>(v: &mut [T], rng: &mut SeedBytes) {
    for i in (1..v.len()).rev() {
        let j = (rng.next_u64() % (i as u64 + 1)) as usize;
        v.swap(i, j);
    }
}

impl Fragmenter {
    /// A fragmenter for device `dev`, allocating its regions in `space` (which needs
    /// room for one page per frame of the device).
    pub fn new(space: SpaceId, dev: DeviceId) -> Fragmenter {
        Fragmenter {
            space,
            dev,
            held: BTreeMap::new(),
        }
    }

    /// The frames held, with their regions, by physical address.
    pub fn held(&self) -> impl Iterator<Item = (PhysAddr, Region)> + '_ {
        self.held
            .iter()
            .map(|(&pfn, &r)| (PhysAddr::new(pfn * PAGE_SIZE), r))
    }

    /// Hold every free frame of the device. Returns the frames held now.
    ///
    /// # Errors
    /// A description of the KPI call that failed.
    pub fn fill(&mut self, gm: &Gmem) -> Result<u64, String> {
        let free = gm.dev_frames(self.dev).map_err(|e| format!("{e:?}"))?.free;
        for _ in 0..free {
            let r = gm
                .as_alloc(self.space, AllocRequest::new(PAGE_SIZE))
                .map_err(|e| format!("as_alloc: {e:?}"))?;
            gm.region_migrate(r, self.dev, MigrateScope::Prefetch)
                .map_err(|e| format!("region_migrate: {e:?}"))?;
            match gm.as_page_frame(self.space, r.start) {
                Ok(Some((d, pa))) if d == self.dev => {
                    self.held.insert(pa.as_u64() / PAGE_SIZE, r);
                }
                other => return Err(format!("prefetched page not in the device: {other:?}")),
            }
        }
        Ok(self.held.len() as u64)
    }

    /// Release held frames so that the device has `free` free frames with the
    /// unusable-free-space index at `order` close to `target` (see the module
    /// documentation). Call it on a memory [`Fragmenter::fill`] filled.
    ///
    /// # Errors
    /// When `target` is outside `[0, 1]`, when fewer frames are held than asked, when
    /// too few whole blocks are held, or when a KPI call fails.
    pub fn fragment(
        &mut self,
        gm: &Gmem,
        order: u32,
        target: f64,
        free: u64,
        seed: u64,
    ) -> Result<Fragmented, String> {
        self.fragment_runs(gm, order, target, free, 1, seed)
    }

    /// [`Fragmenter::fragment`], the unusable part released in runs of 1 to `max_run`
    /// consecutive frames (each inside one block of the order and never completing it)
    /// instead of single frames: the partly used blocks a buddy allocator leaves, with
    /// contiguity below the order. `max_run` 1 is [`Fragmenter::fragment`].
    ///
    /// # Errors
    /// As [`Fragmenter::fragment`].
    pub fn fragment_runs(
        &mut self,
        gm: &Gmem,
        order: u32,
        target: f64,
        free: u64,
        max_run: u64,
        seed: u64,
    ) -> Result<Fragmented, String> {
        if !(0.0..=1.0).contains(&target) || order > gmem_core::MAX_ORDER {
            return Err(format!("bad target {target} or order {order}"));
        }
        if free > self.held.len() as u64 {
            return Err(format!("{free} frames asked, {} held", self.held.len()));
        }
        let size = 1u64 << order;
        let mut rng = SeedBytes::new(seed);
        let mut per_block: BTreeMap<u64, Vec<u64>> = BTreeMap::new();
        for &pfn in self.held.keys() {
            per_block.entry(pfn >> order).or_default().push(pfn);
        }
        let mut whole: Vec<u64> = per_block
            .iter()
            .filter(|(_, v)| v.len() as u64 == size)
            .map(|(&b, _)| b)
            .collect();
        shuffle(&mut whole, &mut rng);
        let n_whole = ((1.0 - target) * free as f64 / size as f64).round() as u64;
        let n_whole = n_whole.min(free / size);
        if n_whole > whole.len() as u64 {
            return Err(format!(
                "{n_whole} whole blocks needed, {} held",
                whole.len()
            ));
        }
        let chosen: Vec<u64> = whole[..n_whole as usize].to_vec();
        let mut release: Vec<u64> = chosen
            .iter()
            .flat_map(|b| per_block[b].iter().copied())
            .collect();
        let scattered = free - n_whole * size;
        let mut rest: Vec<u64> = self
            .held
            .keys()
            .copied()
            .filter(|p| !chosen.contains(&(p >> order)))
            .collect();
        shuffle(&mut rest, &mut rng);
        let mut freed: BTreeMap<u64, u64> = BTreeMap::new();
        let mut left = scattered;
        let mut released = std::collections::BTreeSet::new();
        for pfn in rest {
            if left == 0 {
                break;
            }
            if released.contains(&pfn) {
                continue;
            }
            // One frame, or (`max_run` > 1) a run of up to `max_run` held frames up
            // from it inside its block; never the block's last held frame.
            let len = if max_run > 1 {
                1 + rng.next_u64() % max_run
            } else {
                1
            };
            let b = pfn >> order;
            for p in pfn..pfn + len {
                let f = freed.entry(b).or_default();
                if left == 0
                    || p >> order != b
                    || !self.held.contains_key(&p)
                    || released.contains(&p)
                    || *f + 1 >= per_block[&b].len() as u64
                {
                    break;
                }
                *f += 1;
                released.insert(p);
                release.push(p);
                left -= 1;
            }
        }
        if left > 0 {
            return Err(format!("{left} frames could not be released one by one"));
        }
        for pfn in release {
            let r = self.held.remove(&pfn).expect("held frame");
            gm.region_dealloc(r, MapFlags::empty(), None)
                .map_err(|e| format!("region_dealloc: {e:?}"))?;
        }
        gm.as_synchronize(self.space)
            .map_err(|e| format!("as_synchronize: {e:?}"))?;
        let e = gm
            .dev_free_extents(self.dev)
            .map_err(|e| format!("dev_free_extents: {e:?}"))?;
        Ok(Fragmented {
            order,
            target,
            achieved: e.unusable_index(order),
            free: e.free,
            in_blocks: n_whole * size,
            scattered,
        })
    }

    /// Learn where each held page lives now (after a compaction moved some).
    ///
    /// # Errors
    /// A description of the KPI call that failed.
    pub fn refresh(&mut self, gm: &Gmem) -> Result<(), String> {
        let regions: Vec<Region> = self.held.values().copied().collect();
        self.held.clear();
        for r in regions {
            match gm.as_page_frame(self.space, r.start) {
                Ok(Some((_, pa))) => {
                    self.held.insert(pa.as_u64() / PAGE_SIZE, r);
                }
                other => return Err(format!("held page lost its frame: {other:?}")),
            }
        }
        Ok(())
    }

    /// Release every held frame.
    ///
    /// # Errors
    /// A description of the KPI call that failed.
    pub fn release_all(&mut self, gm: &Gmem) -> Result<(), String> {
        for (_, r) in std::mem::take(&mut self.held) {
            gm.region_dealloc(r, MapFlags::empty(), None)
                .map_err(|e| format!("region_dealloc: {e:?}"))?;
        }
        gm.as_synchronize(self.space)
            .map(|_| ())
            .map_err(|e| format!("as_synchronize: {e:?}"))
    }
}
