//! The machine's physical memory map: which device's memory answers for an address.
//!
//! Every simulated memory occupies its own range of one physical address space, as
//! host DRAM and a GPU's video memory (behind its PCI BAR) do on a real machine. A
//! translation that ends in a physical address is resolved here to the memory that
//! holds the bytes, and the registry also answers "which memory is device `D`'s" for a
//! format whose entries name the memory by aperture rather than by address.
//!
//! Every state of every map has its own [`MemoryMap::generation`] number: a port may
//! keep the memory it resolved for an address across accesses while the number is
//! unchanged, without taking the map's lock (see `Port::with_pages`).

use crate::lock;
use crate::memory::SimMemory;
use gmem_core::{DeviceId, PhysAddr};
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

/// The source of generation numbers, shared by all maps so that a number names one
/// state of one map: two maps never show the same number, and a map never shows a
/// number again (no ABA for a port that compares numbers).
static GENERATIONS: AtomicU64 = AtomicU64::new(1);

fn fresh_generation() -> u64 {
    GENERATIONS.fetch_add(1, Ordering::Relaxed)
}

/// Why a memory could not be added to the map.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MapError {
    /// Its range overlaps the memory of this device.
    Overlaps(DeviceId),
    /// The device already has a memory in the map.
    AlreadyRegistered(DeviceId),
}

impl fmt::Display for MapError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            MapError::Overlaps(d) => write!(f, "range overlaps the memory of {d}"),
            MapError::AlreadyRegistered(d) => write!(f, "{d} already has a memory"),
        }
    }
}

/// Device id → memory, and physical address → memory.
pub struct MemoryMap {
    entries: Mutex<Vec<(DeviceId, Arc<SimMemory>)>>,
    /// The number of the current state: replaced (under the lock of `entries`) by
    /// every change.
    generation: AtomicU64,
}

impl Default for MemoryMap {
    fn default() -> MemoryMap {
        MemoryMap {
            entries: Mutex::new(Vec::new()),
            generation: AtomicU64::new(fresh_generation()),
        }
    }
}

impl MemoryMap {
    /// An empty map.
    pub fn new() -> Arc<MemoryMap> {
        Arc::new(MemoryMap::default())
    }

    /// The number of the map's current state. Every [`MemoryMap::add`] and successful
    /// [`MemoryMap::remove`] replaces it by a number no map showed before, so while it
    /// is unchanged [`MemoryMap::at`] gives the same answer for every address.
    #[inline]
    pub fn generation(&self) -> u64 {
        // Acquire pairs with the Release store of a change: a reader that sees the
        // new number also sees the new entries.
        self.generation.load(Ordering::Acquire)
    }

    /// Give the map a new generation number; called with the entries' lock held,
    /// after the change.
    fn changed(&self) {
        self.generation.store(fresh_generation(), Ordering::Release);
    }

    /// Add `memory` as device `id`'s.
    ///
    /// # Errors
    /// [`MapError::AlreadyRegistered`] if `id` has a memory in the map already,
    /// [`MapError::Overlaps`] (naming the other device) if `memory`'s range overlaps
    /// one in the map; the map is unchanged.
    pub fn add(&self, id: DeviceId, memory: Arc<SimMemory>) -> Result<(), MapError> {
        let mut e = lock(&self.entries);
        for (d, m) in e.iter() {
            if *d == id {
                return Err(MapError::AlreadyRegistered(id));
            }
            if memory.base() < m.end() && m.base() < memory.end() {
                return Err(MapError::Overlaps(*d));
            }
        }
        e.push((id, memory));
        self.changed();
        Ok(())
    }

    /// Remove device `id`'s memory (when the device is destroyed).
    pub fn remove(&self, id: DeviceId) -> Option<Arc<SimMemory>> {
        let mut e = lock(&self.entries);
        let i = e.iter().position(|(d, _)| *d == id)?;
        let m = e.remove(i).1;
        self.changed();
        Some(m)
    }

    /// The memory holding `pa`, with its device.
    pub fn at(&self, pa: PhysAddr) -> Option<(DeviceId, Arc<SimMemory>)> {
        lock(&self.entries)
            .iter()
            .find(|(_, m)| m.contains(pa))
            .map(|(d, m)| (*d, m.clone()))
    }

    /// Device `id`'s memory.
    pub fn of(&self, id: DeviceId) -> Option<Arc<SimMemory>> {
        lock(&self.entries)
            .iter()
            .find(|(d, _)| *d == id)
            .map(|(_, m)| m.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gmem_core::testing::TestSystem;
    use gmem_core::{DevCaps, PAGE_SIZE};

    #[test]
    fn addresses_resolve_to_their_memory_and_overlaps_are_refused() {
        let mut sys = TestSystem::new(4);
        let host = sys.host().id;
        let g = sys.add_device(2, DevCaps::FAULTABLE, 0, 0);
        let gpu = sys.devices[g].id;
        let map = MemoryMap::new();
        let dram = Arc::new(SimMemory::new("dram", PhysAddr::new(0), 16 * PAGE_SIZE).unwrap());
        let vram = Arc::new(SimMemory::new("vram", PhysAddr::new(1 << 30), PAGE_SIZE).unwrap());
        map.add(host, dram.clone()).unwrap();
        assert_eq!(
            map.add(host, vram.clone()),
            Err(MapError::AlreadyRegistered(host))
        );
        let clash = Arc::new(SimMemory::new("x", PhysAddr::new(0xf000), 2 * PAGE_SIZE).unwrap());
        assert_eq!(map.add(gpu, clash), Err(MapError::Overlaps(host)));
        let g0 = map.generation();
        map.add(gpu, vram.clone()).unwrap();
        let g1 = map.generation();
        assert_ne!(g0, g1);
        // A refused change and a lookup keep the number.
        assert!(map.add(gpu, vram.clone()).is_err());
        assert!(map.of(gpu).is_some());
        assert_eq!(map.generation(), g1);
        assert_ne!(MemoryMap::new().generation(), g1);
        assert_eq!(map.at(PhysAddr::new(0x5123)).map(|(d, _)| d), Some(host));
        assert_eq!(
            map.at(PhysAddr::new((1 << 30) + 8)).map(|(d, _)| d),
            Some(gpu)
        );
        assert!(map.at(PhysAddr::new(0x10_0000)).is_none());
        assert!(Arc::ptr_eq(&map.of(gpu).unwrap(), &vram));
        assert!(map.remove(gpu).is_some());
        assert!(map.at(PhysAddr::new(1 << 30)).is_none());
        let g2 = map.generation();
        assert!(g2 != g1 && g2 != g0);
        // Removing what is not there changes nothing.
        assert!(map.remove(gpu).is_none());
        assert_eq!(map.generation(), g2);
    }
}
