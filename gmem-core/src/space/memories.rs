//! The memories one address space's frames live in: the table a page entry's `mem`
//! byte indexes, with reusable slots so that a destroyed device is not kept alive and
//! the 256th memory is refused rather than aliased with `NO_MEM`.

use crate::device::DeviceInner;
use crate::handle::DeviceId;
use crate::lpt::NO_MEM;
use crate::sync::Arc;
use alloc::vec::Vec;

/// A space already names [`MAX_MEMORIES`] memories and cannot name one more.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct TooManyMemories;

/// Memories a space can name at once (a page entry's `mem` is one byte; `NO_MEM` is
/// reserved for "no frame").
pub const MAX_MEMORIES: usize = NO_MEM as usize;

/// The memories frames of one space live in; a page entry's `mem` byte indexes it.
///
/// Slot 0 is the host. A slot is added the first time a frame of that memory backs a
/// page of the space, and emptied only by `dev_destroy` once no entry names it, so an
/// index stays valid as long as an entry holds it and a destroyed device is not kept
/// alive by the spaces it once served.
pub(crate) struct Memories {
    slots: Vec<Option<Arc<DeviceInner>>>,
}

impl Memories {
    pub(super) fn new(host: Arc<DeviceInner>) -> Memories {
        Memories {
            slots: alloc::vec![Some(host)],
        }
    }

    /// The memory an entry names. Every populated entry names a live slot (checked by
    /// `check_invariants`).
    #[inline]
    pub fn get(&self, mem: u8) -> &Arc<DeviceInner> {
        self.slots[mem as usize]
            .as_ref()
            .expect("a page entry names a live memory slot")
    }

    /// The memory an entry names, if the slot is live.
    pub fn try_get(&self, mem: u8) -> Option<&Arc<DeviceInner>> {
        self.slots.get(mem as usize).and_then(Option::as_ref)
    }

    /// The slot of device `id`, if the space names it.
    pub fn position(&self, id: DeviceId) -> Option<u8> {
        self.slots
            .iter()
            .position(|d| d.as_ref().is_some_and(|d| d.id == id))
            .map(|i| i as u8)
    }

    /// The slot of `dev`, taking a free one if the space does not name it yet.
    #[inline]
    pub fn index_of(&mut self, dev: &Arc<DeviceInner>) -> Result<u8, TooManyMemories> {
        // Slot 0 is the host (every host fault's target): no search.
        if let Some(Some(h)) = self.slots.first() {
            if Arc::ptr_eq(h, dev) {
                return Ok(0);
            }
        }
        self.index_of_slow(dev)
    }

    /// [`Memories::index_of`] past slot 0: a search, or a new slot.
    #[inline(never)]
    fn index_of_slow(&mut self, dev: &Arc<DeviceInner>) -> Result<u8, TooManyMemories> {
        if let Some(i) = self.position(dev.id) {
            return Ok(i);
        }
        if let Some(i) = self.slots.iter().position(Option::is_none) {
            self.slots[i] = Some(dev.clone());
            return Ok(i as u8);
        }
        if self.slots.len() >= MAX_MEMORIES {
            return Err(TooManyMemories);
        }
        self.slots.push(Some(dev.clone()));
        Ok((self.slots.len() - 1) as u8)
    }

    /// Empty the slot of device `id` (no entry may name it any more).
    pub fn forget(&mut self, id: DeviceId) {
        if let Some(i) = self.position(id) {
            self.slots[i as usize] = None;
        }
    }

    /// Live slots with their indices.
    pub fn iter(&self) -> impl Iterator<Item = (u8, &Arc<DeviceInner>)> {
        self.slots
            .iter()
            .enumerate()
            .filter_map(|(i, d)| d.as_ref().map(|d| (i as u8, d)))
    }
}
