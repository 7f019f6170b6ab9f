//! Attaching devices to a space and detaching them: page tables per format and mode,
//! the eager filling of tables whose users cannot fault, and tearing a space down.
//!
//! Invariant owned here: a device is attached (has a slot) exactly when its binding
//! lists the space, and both change under the space lock (see `kpi::device` for the
//! races this closes).

use super::{Attachment, MmuMode, PageTable, SpaceState, MAX_TABLES};
use crate::addr::Vpn;
use crate::device::DeviceInner;
use crate::error::AttachError;
use crate::handle::SpaceId;
use crate::lpt::{PageEntry, PENDING, WIRED};
use crate::stats::Counters;
use crate::sync::Arc;
use crate::vmem::Arena;
use alloc::vec::Vec;

impl SpaceState {
    /// Attach `dev` (`as_attach` under the lock): find or create its page table, fill
    /// it with what it must hold eagerly, and record the binding. Returns the mode in
    /// effect. On error nothing changed.
    pub(crate) fn attach(
        &mut self,
        stats: &Counters,
        space_id: SpaceId,
        dev: &Arc<DeviceInner>,
        mode: MmuMode,
    ) -> Result<MmuMode, AttachError> {
        let id = dev.id;
        if !self.alive {
            return Err(AttachError::UnknownSpace(space_id));
        }
        if self.slot_of(id).is_some() {
            return Err(AttachError::AlreadyAttached);
        }
        let slot = match self.xlat.attached.iter().position(|a| a.is_none()) {
            Some(s) => s,
            None if self.xlat.attached.len() < MAX_TABLES => {
                self.xlat.attached.push(None);
                self.xlat.attached.len() - 1
            }
            None => return Err(AttachError::TooManyAttachments),
        };
        // A replicate table, or the table of a device that cannot fault, maps pages
        // writable without a fault: no page may keep read copies (`duplicate`).
        if mode == MmuMode::Replicate || !dev.faultable() {
            self.drop_all_copies(stats);
        }
        let format = dev.mmu.format();
        let shared = (mode == MmuMode::Shared)
            .then(|| {
                self.xlat.tables.iter().position(|t| {
                    t.as_ref()
                        .is_some_and(|t| t.mode != MmuMode::Replicate && t.format == format)
                })
            })
            .flatten();
        let (t, effective) = match shared {
            Some(t) => (t, MmuMode::Shared),
            None => {
                let t = match self.xlat.tables.iter().position(|t| t.is_none()) {
                    Some(t) => t,
                    None if self.xlat.tables.len() < MAX_TABLES => {
                        self.xlat.tables.push(None);
                        self.xlat.tables.len() - 1
                    }
                    None => return Err(AttachError::TooManyAttachments),
                };
                let root = dev.mmu.create_page_table().map_err(AttachError::Mmu)?;
                let generation = self.xlat.new_generation();
                self.xlat.tables[t] = Some(PageTable {
                    generation,
                    root,
                    mmu: dev.mmu.clone(),
                    format,
                    sizes: dev.page_sizes,
                    mode,
                    users: 0,
                    faultable: true,
                    owner: dev.id,
                });
                self.xlat.tables_changed();
                (
                    t,
                    if mode == MmuMode::Shared {
                        MmuMode::Coherent
                    } else {
                        mode
                    },
                )
            }
        };
        self.xlat.attached_one();
        let table = self.xlat.tables[t].as_mut().expect("just set");
        table.users |= 1 << slot;
        table.faultable &= dev.faultable();
        self.xlat.attached[slot] = Some(Attachment {
            dev: dev.clone(),
            table: t,
        });
        if let Err(e) = self
            .fill_table(stats, t)
            .and_then(|()| self.dma_fill(stats, t))
        {
            self.detach_slot(stats, slot, space_id);
            return Err(AttachError::Mmu(e));
        }
        // The binding is recorded under the space lock, and refused for a device
        // `dev_destroy` has claimed: of a racing attach and destroy one wins.
        #[cfg(not(gmem_loom_bug = "attach_binds_after_unlock"))]
        {
            let mut b = dev.binding.lock();
            if b.destroyed {
                drop(b);
                self.detach_slot(stats, slot, space_id);
                return Err(AttachError::UnknownDevice(id));
            }
            b.attached.push(space_id);
        }
        Ok(effective)
    }

    /// Tear the space down (`as_destroy` under the lock): drain the queue, detach every
    /// device, free every frame and every region's range, and mark the space dead.
    pub(crate) fn destroy(&mut self, stats: &Counters, arena: &Arena, id: SpaceId) {
        self.drain(stats, arena);
        for slot in 0..self.xlat.attached.len() {
            self.detach_slot(stats, slot, id);
        }
        let entries: Vec<(Vpn, PageEntry)> = self.store.lpt.iter().collect();
        for (v, e) in entries {
            self.store.release_frame(&e, false);
            self.store.lpt.take(v);
        }
        self.dma_destroy(arena);
        self.map.clear(|start, len| {
            let _ = arena.free(start, len);
        });
        self.alive = false;
    }

    /// Fill a new table with what it must hold eagerly: every populated page for a
    /// replicate table, every wired page for a table whose users cannot fault.
    pub(crate) fn fill_table(
        &mut self,
        stats: &Counters,
        t: usize,
    ) -> Result<(), crate::mmu::MmuError> {
        let table = self.xlat.tables[t].as_ref().expect("live table");
        let all = table.mode == MmuMode::Replicate;
        if !all && table.faultable {
            return Ok(());
        }
        let mut vpns: Vec<Vpn> = self
            .store
            .lpt
            .iter()
            .filter(|(_, e)| e.is_populated() && (all || e.has(WIRED)) && !e.has(PENDING))
            .map(|(v, _)| v)
            .collect();
        vpns.sort_unstable();
        let mut i = 0;
        while i < vpns.len() {
            let mut n = 1;
            while i + n < vpns.len() && vpns[i + n] == vpns[i] + n as u64 {
                n += 1;
            }
            self.mirror(stats, vpns[i], n as u64, 1 << t)?;
            i += n;
        }
        Ok(())
    }

    /// Remove attachment `slot` of space `space`: the device is deactivated first if it
    /// is active here (so its MMU never points at a destroyed table), then its table
    /// loses a user; a table without users is emptied (unmap + invalidate) and
    /// destroyed, a shared one left behind gets the device's whole TLB invalidated.
    pub(crate) fn detach_slot(&mut self, stats: &Counters, slot: usize, space: SpaceId) {
        let Some(att) = self.xlat.attached[slot].as_ref() else {
            return;
        };
        let t = att.table;
        let dev = att.dev.clone();
        self.forget_accesses_of(dev.id);
        // Read copies go: some may be in its memory or its table (`duplicate`).
        self.drop_all_copies(stats);
        // Its private frames go first (unmapped, invalidated, freed).
        let private = self.private_of_slot(slot);
        self.free_private(stats, &private);
        {
            let mut b = dev.binding.lock();
            if b.is_active_in(space) {
                b.active = None;
                dev.mmu.activate(None);
            }
            b.attached.retain(|s| *s != space);
        }
        let users = self.xlat.tables[t]
            .as_ref()
            .map_or(0, |tb| tb.users & !(1 << slot));
        if users == 0 {
            let mut touched: Vec<(Vpn, u32)> = self
                .store
                .lpt
                .iter()
                .filter(|(_, e)| e.mapped & (1 << t) != 0)
                .map(|(v, _)| (v, 1u32 << t))
                .collect();
            touched.sort_unstable();
            self.dma_table_gone(stats, t);
            // The table's whole TLB goes, not only the ranges unmapped here: a strict
            // dealloc whose invalidation has not run yet, or a queued unmap, cleared
            // entries whose translations the device may still cache, and their late
            // invalidation would name a root that no longer exists (see
            // `Mmu::invalidate`: after this a driver may treat such a call as a no-op).
            let super::OwedInvalidation(_covered) = self.clear_entries(stats, &touched);
            if let Some(table) = &self.xlat.tables[t] {
                dev.mmu.invalidate_all(table.root);
                Counters::add(&stats.invalidations, 1);
            }
            self.retire_table(t, dev.id, dev.mmu.clone());
        } else {
            // Remaining users of a shared table: if the leaving device made it, one of
            // them takes it over, so that no edit of the table goes through the MMU
            // of a device that may be destroyed next.
            let heir = self
                .xlat
                .attached
                .iter()
                .enumerate()
                .filter(|(s, a)| *s != slot && a.as_ref().is_some_and(|a| a.table == t))
                .find_map(|(_, a)| {
                    a.as_ref()
                        .map(|a| (a.dev.id, a.dev.mmu.clone(), a.dev.page_sizes))
                });
            let owner = self.xlat.tables[t].as_ref().map(|tb| tb.owner);
            if let (Some((_, _, sizes)), true) = (&heir, owner == Some(dev.id)) {
                // The heir's MMU edits the table from now on: the leaves of sizes it
                // cannot map go first (through the leaving MMU, which made them), and
                // the table's sizes become the heir's, so that no later fault asks it
                // for a leaf it does not map.
                let foreign: Vec<(u64, u64)> = self
                    .xlat
                    .large
                    .iter()
                    .filter(|&(_, lt, n)| {
                        lt == t
                            && crate::addr::PageSize::from_bytes(n << crate::addr::PAGE_SHIFT)
                                .map_or(true, |size| !sizes.supports(size))
                    })
                    .map(|(first, _, n)| (first, n))
                    .collect();
                for (first, n) in foreign {
                    self.unmap_pages(stats, Vpn(first), n, 1 << t);
                }
            }
            let table = self.xlat.tables[t].as_mut().expect("live table");
            table.users = users;
            if table.owner == dev.id {
                if let Some((owner, mmu, sizes)) = heir {
                    table.owner = owner;
                    table.mmu = mmu;
                    table.sizes = sizes;
                }
            }
            dev.mmu.invalidate_all(table.root);
            Counters::add(&stats.invalidations, 1);
        }
        self.xlat.attached[slot] = None;
        if let Some(table) = self.xlat.tables[t].as_mut() {
            let faultable = self
                .xlat
                .attached
                .iter()
                .flatten()
                .filter(|a| a.table == t)
                .all(|a| a.dev.faultable());
            table.faultable = faultable;
        }
        let hint = (slot + 1) as u8;
        let hinted: Vec<Vpn> = self
            .store
            .lpt
            .iter()
            .filter(|(_, e)| e.hint == hint)
            .map(|(v, _)| v)
            .collect();
        for v in hinted {
            self.store.lpt.update(v, |e| e.hint = 0);
        }
    }
}
