//! The machine's physical memory map: which device's memory answers for an address.
//!
//! Every simulated memory occupies its own range of one physical address space, as
//! host DRAM and a GPU's video memory (behind its PCI BAR) do on a real machine. A
//! translation that ends in a physical address is resolved here to the memory that
//! holds the bytes, and the registry also answers "which memory is device `D`'s" for a
//! format whose entries name the memory by aperture rather than by address.

use crate::lock;
use crate::memory::SimMemory;
use gmem_core::{DeviceId, PhysAddr};
use std::fmt;
use std::sync::{Arc, Mutex};

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
#[derive(Default)]
pub struct MemoryMap {
    entries: Mutex<Vec<(DeviceId, Arc<SimMemory>)>>,
}

impl MemoryMap {
    /// An empty map.
    pub fn new() -> Arc<MemoryMap> {
        Arc::new(MemoryMap::default())
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
        Ok(())
    }

    /// Remove device `id`'s memory (when the device is destroyed).
    pub fn remove(&self, id: DeviceId) -> Option<Arc<SimMemory>> {
        let mut e = lock(&self.entries);
        let i = e.iter().position(|(d, _)| *d == id)?;
        Some(e.remove(i).1)
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
        map.add(gpu, vram.clone()).unwrap();
        assert_eq!(map.at(PhysAddr::new(0x5123)).map(|(d, _)| d), Some(host));
        assert_eq!(
            map.at(PhysAddr::new((1 << 30) + 8)).map(|(d, _)| d),
            Some(gpu)
        );
        assert!(map.at(PhysAddr::new(0x10_0000)).is_none());
        assert!(Arc::ptr_eq(&map.of(gpu).unwrap(), &vram));
        assert!(map.remove(gpu).is_some());
        assert!(map.at(PhysAddr::new(1 << 30)).is_none());
    }
}
