//! The translation side (FreeBSD's `pmap`): one owned part of a space's state. It owns
//! everything that turns the logical page table into hardware translations — the
//! page tables (each made by a driver, up to [`super::MAX_TABLES`]), the attachments
//! (which device uses which table), the mask of replicate-mode tables, the large
//! leaves the core asked drivers for, the asynchronous MMU queue, the page-table
//! edits running outside the lock (`unlocked`), the table generations and the attach
//! epoch.
//!
//! Its own invariants, checked by [`Translation::check`]:
//! - the kept replica mask is the tables' (every change of the tables goes through
//!   [`Translation::tables_changed`]);
//! - every attachment names a live table whose users include its slot, and every
//!   live table's users are exactly the attachments naming it (none is empty);
//! - tables' generations are distinct and below the next one handed out;
//! - the unlocked-edit bookkeeping is consistent (`unlocked::UnlockedEdits::check`).
//!
//! Whether a table *should* map a page (mapping bits against live tables, replicate
//! and wired coverage, large leaves against the logical page table) joins this part
//! with the page store and is checked in `check`. The tables, attachments, large
//! leaves and queue stay reachable by the space's other modules as fields (`xlat.…`):
//! the edits of `tables` and `attach` borrow a table while they update page entries.

use super::queue::{MmuQueue, TableRun};
use super::MmuMode;
use crate::addr::{PageSize, VirtAddr, Vpn, PAGE_SIZE};
use crate::device::DeviceInner;
use crate::flags::PageSizes;
use crate::handle::DeviceId;
use crate::mmu::{Mmu, PageTableFormat, PageTableRoot};
use crate::space::violation::{fail, Violation};
use crate::sync::Arc;
use alloc::collections::BTreeMap;
use alloc::vec::Vec;

/// A page table of the space, made by a driver.
pub(crate) struct PageTable {
    pub root: PageTableRoot,
    pub mmu: Arc<dyn Mmu>,
    pub format: PageTableFormat,
    /// The leaf sizes `mmu` maps: the creating device's, asked once when it registered
    /// (a capability that never changes, see [`Mmu::page_sizes`]). The fault path
    /// reads it for every page without a call through the trait object.
    pub sizes: PageSizes,
    pub mode: MmuMode,
    /// Attachment slots using this table.
    pub users: u32,
    /// Whether any user can fault (tables of non-faultable users get wired pages eagerly).
    pub faultable: bool,
    /// The device whose `mmu` this is (the creator, or the user that took the table
    /// over when its creator detached from a shared table).
    pub owner: DeviceId,
    /// Distinguishes this table from earlier and later ones in the same slot.
    pub generation: u64,
}

/// A device attached to the space, and the table it uses.
pub(crate) struct Attachment {
    pub dev: Arc<DeviceInner>,
    pub table: usize,
}

/// Pages of the largest leaf the core asks for (1 GiB).
const MAX_LEAF_PAGES: u64 = 1 << 18;

/// One large leaf the core asked a driver for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LargeLeaf {
    /// The page table (its root) that holds the leaf.
    pub root: PageTableRoot,
    /// The first address the leaf translates.
    pub va: VirtAddr,
    /// The leaf's size.
    pub size: PageSize,
}

/// The large leaves of one space: (first page, table) → pages.
#[derive(Default)]
pub(crate) struct LargeLeaves {
    map: BTreeMap<(u64, u8), u64>,
}

impl LargeLeaves {
    /// Whether there is none.
    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    /// Record the leaf of `pages` pages from page `first` in table `t`.
    pub fn insert(&mut self, first: u64, t: usize, pages: u64) {
        self.map.insert((first, t as u8), pages);
    }

    /// Forget the leaf from page `first` in table `t`.
    pub fn remove(&mut self, first: u64, t: usize) {
        self.map.remove(&(first, t as u8));
    }

    /// Whether table `t` has a leaf starting at page `first`.
    pub fn contains(&self, first: u64, t: usize) -> bool {
        self.map.contains_key(&(first, t as u8))
    }

    /// Every leaf: (first page, table, pages), by first page.
    pub fn iter(&self) -> impl Iterator<Item = (u64, usize, u64)> + '_ {
        self.map.iter().map(|(&(s, t), &n)| (s, t as usize, n))
    }

    /// Leaves of table `t` that overlap `[first, first + pages)`: (first page, pages).
    pub fn overlapping(&self, t: usize, first: u64, pages: u64) -> Vec<(u64, u64)> {
        let lo = first.saturating_sub(MAX_LEAF_PAGES - 1);
        let hi = first.saturating_add(pages);
        self.map
            .range((lo, 0)..(hi, 0))
            .filter(|((s, tt), n)| *tt as usize == t && s + *n > first)
            .map(|((s, _), n)| (*s, *n))
            .collect()
    }
}

/// A table detached while unlocked edits were in flight, waiting for them to end.
pub(crate) struct Doomed {
    pub mmu: Arc<dyn Mmu>,
    /// The device `mmu` belongs to.
    pub owner: DeviceId,
    pub root: PageTableRoot,
    /// The MMU of the device that used it last (its TLB is invalidated for the root
    /// before the table goes).
    pub last_user: Arc<dyn Mmu>,
    /// The device `last_user` belongs to.
    pub last_user_id: DeviceId,
}

/// The pages of one unlocked `region_map` in flight and the tables it edits (slots,
/// a bit each): no other edit of the core touches those pages in those tables until
/// it has finished (`fill_table` leaves them to it; faults on the region answer
/// [`crate::FaultError::Busy`]).
pub(crate) struct InFlightMap {
    /// The region's id (the key `finish` removes it by).
    region: u64,
    first: Vpn,
    pages: u64,
    tables: u32,
}

/// The bookkeeping of the page-table edits running outside the lock (a part of the
/// translation side; see the module header).
#[derive(Default)]
pub(crate) struct UnlockedEdits {
    /// Page-table edits running without the lock right now.
    count: u32,
    /// Tables detached while such edits ran, destroyed when the last one ends.
    doomed: Vec<Doomed>,
    /// The pages and tables each unlocked `region_map` in flight is editing: no other
    /// edit of the core touches them until it has finished.
    in_flight_maps: Vec<InFlightMap>,
    /// The devices named by strict unmaps whose unlocked completion runs right now
    /// (each once per pending unmap): `dev_destroy` refuses while one is listed.
    strict_refs: Vec<DeviceId>,
}

impl UnlockedEdits {
    /// One more unlocked edit in flight.
    pub fn begin(&mut self) {
        self.count += 1;
    }

    /// An unlocked edit ended: the tables doomed meanwhile, to destroy now if it was
    /// the last (none otherwise).
    pub fn end(&mut self) -> Vec<Doomed> {
        self.count -= 1;
        if self.count == 0 {
            core::mem::take(&mut self.doomed)
        } else {
            Vec::new()
        }
    }

    /// Whether no unlocked edit runs (a retired table may be destroyed at once).
    pub fn idle(&self) -> bool {
        self.count == 0
    }

    /// Keep a retired table until the last unlocked edit ends.
    pub fn doom(&mut self, table: Doomed) {
        self.doomed.push(table);
    }

    /// Whether device `id` is named by work still running outside the lock: a doomed
    /// table (its driver's or its last user's) or a strict unmap's completion.
    pub fn refers_to(&self, id: DeviceId) -> bool {
        self.strict_refs.contains(&id)
            || self
                .doomed
                .iter()
                .any(|d| d.owner == id || d.last_user_id == id)
    }

    /// Whether an unlocked `region_map` in flight edits page `v` of table slot `t`.
    #[inline]
    pub fn edits(&self, t: usize, v: Vpn) -> bool {
        !self.in_flight_maps.is_empty()
            && self
                .in_flight_maps
                .iter()
                .any(|m| m.tables & (1 << t) != 0 && v >= m.first && v < m.first + m.pages)
    }

    /// Table slot `t` retired: no map in flight edits the slot's next table.
    pub fn forget_table(&mut self, t: usize) {
        for m in &mut self.in_flight_maps {
            m.tables &= !(1 << t);
        }
    }

    /// An unlocked map of region `region`'s pages `[first, first + pages)` in the
    /// tables of mask `tables` starts.
    pub fn start_map(&mut self, region: u64, first: Vpn, pages: u64, tables: u32) {
        self.in_flight_maps.push(InFlightMap {
            region,
            first,
            pages,
            tables,
        });
    }

    /// The unlocked map of region `region` finished.
    pub fn finish_map(&mut self, region: u64) {
        self.in_flight_maps.retain(|m| m.region != region);
    }

    /// A strict unmap's unlocked completion names `devices` until it finishes.
    pub fn hold_devices(&mut self, devices: &[DeviceId]) {
        self.strict_refs.extend_from_slice(devices);
    }

    /// The completion that named `devices` finished.
    pub fn release_devices(&mut self, devices: &[DeviceId]) {
        for d in devices {
            if let Some(i) = self.strict_refs.iter().position(|x| x == d) {
                self.strict_refs.swap_remove(i);
            }
        }
    }

    /// Its invariants: doomed tables and maps in flight exist only while edits run,
    /// no more maps in flight than edits, and maps in flight never overlap.
    pub fn check(&self) -> Result<(), Violation> {
        if self.count == 0 && !(self.doomed.is_empty() && self.in_flight_maps.is_empty()) {
            return fail(
                "doomed tables or maps in flight with no unlocked edit",
                None,
            );
        }
        if self.in_flight_maps.len() > self.count as usize {
            return fail("more maps in flight than unlocked edits", None);
        }
        for (i, a) in self.in_flight_maps.iter().enumerate() {
            for b in &self.in_flight_maps[..i] {
                if a.first < b.first + b.pages && b.first < a.first + a.pages {
                    return fail("unlocked maps in flight overlap", Some(a.first.0));
                }
            }
        }
        Ok(())
    }
}

/// The translation side of one space (see the module header).
#[derive(Default)]
pub(crate) struct Translation {
    /// Page tables by index (a page entry's mapping bit `t` names `tables[t]`).
    pub(super) tables: Vec<Option<PageTable>>,
    /// Mask of the tables in [`MmuMode::Replicate`] mode, kept by
    /// [`Translation::tables_changed`] (every fault asks it; the tables change only at
    /// attach and when a table retires).
    replicas: u32,
    /// Attachment slots (which device uses which table).
    pub(super) attached: Vec<Option<Attachment>>,
    /// The large leaves the core asked the drivers for (`large`).
    pub(super) large: LargeLeaves,
    /// The asynchronous MMU queue.
    pub(super) queue: MmuQueue,
    /// Page-table edits running without the lock (`unlocked`).
    pub(super) unlocked: UnlockedEdits,
    /// While a fault batch is serviced (`batch`): the stale-TLB invalidations its
    /// spurious faults owe, issued once at the end of the batch's block.
    pub(super) deferred_spurious: Option<Vec<TableRun>>,
    /// Generation of the next page table created.
    next_generation: u64,
    /// Bumped by every attach: a strict unmap finishing its unlocked invalidation
    /// sees whether a device joined a table meanwhile.
    attach_epoch: u64,
}

impl Translation {
    /// The attachment slot of a device.
    pub fn slot_of(&self, dev: DeviceId) -> Option<usize> {
        self.attached
            .iter()
            .position(|a| a.as_ref().is_some_and(|a| a.dev.id == dev))
    }

    /// The attachment slot of a device and the index of the table it uses, found
    /// together (the fault path needs both: one search, no second look at the slot).
    #[inline]
    pub fn attachment_of(&self, dev: DeviceId) -> Option<(usize, usize)> {
        self.attached
            .iter()
            .enumerate()
            .find_map(|(slot, a)| match a {
                Some(a) if a.dev.id == dev => Some((slot, a.table)),
                _ => None,
            })
    }

    /// The root of the page table device `dev` uses, if it is attached.
    pub fn root_of(&self, dev: DeviceId) -> Option<PageTableRoot> {
        let (_, t) = self.attachment_of(dev)?;
        Some(self.tables.get(t)?.as_ref()?.root)
    }

    /// Mask of the live tables.
    pub fn live_mask(&self) -> u32 {
        Self::mask_of(&self.tables, |_| true)
    }

    /// Mask of tables that must hold every populated page (replicate mode).
    #[inline]
    pub fn replica_mask(&self) -> u32 {
        self.replicas
    }

    /// Mask of tables that must hold every wired page (users cannot fault).
    pub fn wired_mask(&self) -> u32 {
        Self::mask_of(&self.tables, |t| !t.faultable) | self.replica_mask()
    }

    fn mask_of(tables: &[Option<PageTable>], f: impl Fn(&PageTable) -> bool) -> u32 {
        tables
            .iter()
            .enumerate()
            .filter(|(_, t)| t.as_ref().is_some_and(&f))
            .fold(0, |m, (i, _)| m | 1 << i)
    }

    /// Recompute what is kept about the set of tables: the one call after every
    /// change of `tables` (a table made at attach, a table retired), so that
    /// [`Translation::replica_mask`] stays exact (`check` compares it).
    pub fn tables_changed(&mut self) {
        self.replicas = Self::mask_of(&self.tables, |t| t.mode == MmuMode::Replicate);
    }

    /// Whether every table in `mask` takes unlocked edits (and there is at least one).
    pub fn edits_unlocked(&self, mask: u32) -> bool {
        mask != 0
            && self
                .tables
                .iter()
                .enumerate()
                .filter(|(t, _)| mask & (1 << t) != 0)
                .all(|(_, t)| t.as_ref().is_some_and(|t| t.mmu.concurrent_edits()))
    }

    /// The generation a new table gets.
    pub fn new_generation(&mut self) -> u64 {
        self.next_generation += 1;
        self.next_generation
    }

    /// The attach epoch (see the field).
    pub fn attach_epoch(&self) -> u64 {
        self.attach_epoch
    }

    /// A device attached: later strict unmaps' completions see the epoch changed.
    pub fn attached_one(&mut self) {
        self.attach_epoch += 1;
    }

    /// Every large leaf of the space.
    pub fn large_leaves(&self) -> Vec<LargeLeaf> {
        self.large
            .iter()
            .filter_map(|(s, t, n)| {
                let table = self.tables.get(t)?.as_ref()?;
                Some(LargeLeaf {
                    root: table.root,
                    va: Vpn(s).addr(),
                    size: PageSize::from_bytes(n * PAGE_SIZE)?,
                })
            })
            .collect()
    }

    /// Check the translation side's own invariants (module header).
    pub fn check(&self) -> Result<(), Violation> {
        if self.replicas != Self::mask_of(&self.tables, |t| t.mode == MmuMode::Replicate) {
            return fail("the kept replica mask differs from the tables'", None);
        }
        let mut users = alloc::vec![0u32; self.tables.len()];
        for (slot, a) in self.attached.iter().enumerate() {
            let Some(a) = a else { continue };
            match self.tables.get(a.table).and_then(Option::as_ref) {
                Some(t) if t.users & (1 << slot) != 0 => users[a.table] |= 1 << slot,
                _ => {
                    return fail(
                        "attachment names a dead table or is not its user",
                        Some(slot as u64),
                    )
                }
            }
        }
        for (i, t) in self.tables.iter().enumerate() {
            let Some(t) = t else { continue };
            if t.users == 0 || t.users != users[i] {
                return fail(
                    "table's users differ from the attachments naming it",
                    Some(i as u64),
                );
            }
            if t.generation > self.next_generation
                || self.tables[..i]
                    .iter()
                    .flatten()
                    .any(|o| o.generation == t.generation)
            {
                return fail("table generations repeat or run ahead", Some(i as u64));
            }
        }
        self.unlocked.check()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stale_replica_mask_is_caught() {
        let mut x = Translation::default();
        assert_eq!(x.check(), Ok(()));
        x.replicas = 1;
        assert_eq!(
            x.check().unwrap_err().what,
            "the kept replica mask differs from the tables'"
        );
        x.tables_changed();
        assert_eq!(x.check(), Ok(()));
        assert_eq!(x.new_generation(), 1);
        assert_eq!(x.new_generation(), 2);
        x.attached_one();
        assert_eq!(x.attach_epoch(), 1);
    }

    #[test]
    fn unlocked_bookkeeping_without_an_edit_or_overlapping_is_caught() {
        let mut u = UnlockedEdits::default();
        assert_eq!(u.check(), Ok(()));
        let map = |region, first, pages| InFlightMap {
            region,
            first: Vpn(first),
            pages,
            tables: 1,
        };
        u.in_flight_maps.push(map(1, 0x100, 4));
        assert_eq!(
            u.check().unwrap_err().what,
            "doomed tables or maps in flight with no unlocked edit"
        );
        u.count = 2;
        assert_eq!(u.check(), Ok(()));
        u.in_flight_maps.push(map(2, 0x103, 4));
        assert_eq!(
            u.check().unwrap_err().what,
            "unlocked maps in flight overlap"
        );
        u.in_flight_maps[1].first = Vpn(0x104);
        assert_eq!(u.check(), Ok(()));
        u.count = 1;
        assert_eq!(
            u.check().unwrap_err().what,
            "more maps in flight than unlocked edits"
        );
        u.hold_devices(&[DeviceId::from_raw(3, 0), DeviceId::from_raw(3, 0)]);
        u.release_devices(&[DeviceId::from_raw(3, 0)]);
        assert_eq!(u.strict_refs.len(), 1, "one hold per pending unmap");
    }
}
