//! Generational handles for devices, address spaces, regions and mapping sets.
//!
//! The KPI hands out small `Copy` handles instead of references. Each handle carries
//! the generation of its slot, so a handle that outlived what it named (a destroyed
//! device, a deallocated region, a destroyed space) is recognised and answered with a
//! typed error instead of silently naming whatever reused the slot.

use crate::addr::VirtAddr;
use alloc::vec::Vec;
use core::fmt;

macro_rules! handle {
    ($(#[$doc:meta])* $name:ident, $tag:literal) => {
        $(#[$doc])*
        #[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub struct $name {
            pub(crate) index: u32,
            pub(crate) generation: u32,
        }

        impl $name {
            /// The slot index (stable while the object lives; reused after).
            pub fn index(self) -> u32 {
                self.index
            }

            /// A handle from raw parts, for drivers' unit tests that need one without
            /// a [`crate::Gmem`]; it names nothing in any instance.
            #[cfg(feature = "test-util")]
            pub fn from_raw(index: u32, generation: u32) -> Self {
                Self { index, generation }
            }
        }

        impl fmt::Debug for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, concat!($tag, "#{}.{}"), self.index, self.generation)
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, concat!($tag, "#{}"), self.index)
            }
        }
    };
}

handle!(
    /// A device (`gm_dev_t`).
    DeviceId,
    "dev"
);
handle!(
    /// An address space (`gm_as_t`).
    SpaceId,
    "as"
);
handle!(
    /// A mapping set of one address space (`gm_mapping_set_t`).
    MappingSetId,
    "set"
);

/// A generational slab: slots addressed by `(index, generation)`.
pub(crate) struct Slots<T> {
    slots: Vec<(u32, Option<T>)>,
    free: Vec<u32>,
    live: usize,
}

impl<T> Default for Slots<T> {
    fn default() -> Self {
        Slots {
            slots: Vec::new(),
            free: Vec::new(),
            live: 0,
        }
    }
}

impl<T> Slots<T> {
    /// Insert a value built from its `(index, generation)`.
    pub fn insert_with(&mut self, make: impl FnOnce(u32, u32) -> T) -> (u32, u32) {
        let index = match self.free.pop() {
            Some(i) => i,
            None => {
                self.slots.push((0, None));
                (self.slots.len() - 1) as u32
            }
        };
        let slot = &mut self.slots[index as usize];
        slot.0 = slot.0.wrapping_add(1);
        slot.1 = Some(make(index, slot.0));
        self.live += 1;
        (index, slot.0)
    }

    /// The value at `(index, generation)`, if it is still there.
    pub fn get(&self, index: u32, generation: u32) -> Option<&T> {
        match self.slots.get(index as usize) {
            Some((g, Some(v))) if *g == generation => Some(v),
            _ => None,
        }
    }

    /// Mutable access to the value at `(index, generation)`.
    pub fn get_mut(&mut self, index: u32, generation: u32) -> Option<&mut T> {
        match self.slots.get_mut(index as usize) {
            Some((g, Some(v))) if *g == generation => Some(v),
            _ => None,
        }
    }

    /// Remove and return the value at `(index, generation)`.
    pub fn remove(&mut self, index: u32, generation: u32) -> Option<T> {
        match self.slots.get_mut(index as usize) {
            Some((g, v @ Some(_))) if *g == generation => {
                self.free.push(index);
                self.live -= 1;
                v.take()
            }
            _ => None,
        }
    }

    /// Clones of every live value, in slot order.
    pub fn values(&self) -> Vec<T>
    where
        T: Clone,
    {
        self.slots.iter().filter_map(|(_, v)| v.clone()).collect()
    }

    /// Call `f` on every live value, in slot order.
    pub fn for_each(&self, mut f: impl FnMut(&T)) {
        self.slots
            .iter()
            .filter_map(|(_, v)| v.as_ref())
            .for_each(&mut f);
    }

    /// The `(index, generation)` of every live value.
    pub fn keys(&self) -> Vec<(u32, u32)> {
        self.slots
            .iter()
            .enumerate()
            .filter(|(_, (_, v))| v.is_some())
            .map(|(i, (g, _))| (i as u32, *g))
            .collect()
    }

    /// Number of live values.
    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.live
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stale_generation_is_not_found_after_reuse() {
        let mut s: Slots<&str> = Slots::default();
        let (i, g) = s.insert_with(|_, _| "a");
        assert_eq!(s.remove(i, g), Some("a"));
        assert_eq!(s.remove(i, g), None);
        let (i2, g2) = s.insert_with(|_, _| "b");
        assert_eq!(i2, i);
        assert_ne!(g2, g);
        assert!(s.get(i, g).is_none());
        assert_eq!(s.get(i2, g2), Some(&"b"));
        assert_eq!(s.len(), 1);
    }
}

/// A region handle: an allocated virtual range of a space (`gm_region_t`). `Copy`; a
/// handle that outlived its region is answered with [`crate::RegionError::StaleRegion`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Region {
    /// The space.
    pub space: SpaceId,
    /// First address.
    pub start: VirtAddr,
    pub(crate) id: u64,
}
