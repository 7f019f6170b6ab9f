//! A copy (DMA) engine in front of a device's memory: the device's data mover.
//!
//! The core moves a page between memories by reading it from the source memory's
//! [`DeviceMemory`] and writing it to the destination's, and prepares pages with
//! [`DeviceMemory::zero`]. A discrete device gives the core a [`DmaEngine`] over its
//! video memory as that data mover: every byte written *into* the device memory through
//! it is traffic towards the device (host → device), every byte read *out of* it is
//! traffic towards the host (device → host), and zero-fills are done by the engine in
//! place. These are the three columns of the GMEM paper's Table 4. Device loads and
//! stores by compute units do not go through the engine (they access the memory
//! directly), so the counters are exactly the data mover's traffic.
//!
//! [`DmaEngine::copy`] is an explicit transfer between two memories, counted by
//! direction.

use crate::memory::{BoundsError, SimMemory};
use gmem_core::{DeviceMemory, MemError, PhysAddr};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// Traffic of a [`DmaEngine`], in bytes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DmaStats {
    /// Bytes moved into the device memory.
    pub host_to_device: u64,
    /// Bytes moved out of the device memory.
    pub device_to_host: u64,
    /// Bytes of device memory zero-filled.
    pub zeroed: u64,
    /// Transfers (calls that moved or zeroed at least one byte).
    pub transfers: u64,
}

/// The copy engine of one device memory.
pub struct DmaEngine {
    memory: Arc<SimMemory>,
    h2d: AtomicU64,
    d2h: AtomicU64,
    zeroed: AtomicU64,
    transfers: AtomicU64,
}

/// Which way an explicit [`DmaEngine::copy`] goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Direction {
    /// From the other memory into the device memory.
    ToDevice,
    /// From the device memory into the other memory.
    ToHost,
}

impl DmaEngine {
    /// The engine of `memory` (the device's local memory).
    pub fn new(memory: Arc<SimMemory>) -> DmaEngine {
        DmaEngine {
            memory,
            h2d: AtomicU64::new(0),
            d2h: AtomicU64::new(0),
            zeroed: AtomicU64::new(0),
            transfers: AtomicU64::new(0),
        }
    }

    /// The device memory behind the engine.
    pub fn memory(&self) -> &Arc<SimMemory> {
        &self.memory
    }

    /// A snapshot of the counters.
    pub fn stats(&self) -> DmaStats {
        DmaStats {
            host_to_device: self.h2d.load(Ordering::Relaxed),
            device_to_host: self.d2h.load(Ordering::Relaxed),
            zeroed: self.zeroed.load(Ordering::Relaxed),
            transfers: self.transfers.load(Ordering::Relaxed),
        }
    }

    /// `n` bytes came into the device memory by a copy another memory made.
    pub(crate) fn copied_in(&self, n: u64) {
        self.count(&self.h2d, n);
    }

    fn count(&self, c: &AtomicU64, n: u64) {
        if n > 0 {
            c.fetch_add(n, Ordering::Relaxed);
            self.transfers.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Copy `len` bytes between `other` at `other_pa` and the device memory at
    /// `device_pa`, in `direction`. Both ranges are checked before a byte moves.
    ///
    /// # Errors
    /// [`BoundsError::OutOfRange`] if either range is not inside its memory; nothing is
    /// copied or counted.
    pub fn copy(
        &self,
        direction: Direction,
        device_pa: PhysAddr,
        other: &SimMemory,
        other_pa: PhysAddr,
        len: u64,
    ) -> Result<(), BoundsError> {
        let mut buf = vec![0u8; len as usize];
        match direction {
            Direction::ToDevice => {
                self.memory.read(device_pa, &mut buf)?; // bounds check of the target
                other.read(other_pa, &mut buf)?;
                self.memory.write(device_pa, &buf)?;
                self.count(&self.h2d, len);
            }
            Direction::ToHost => {
                other.read(other_pa, &mut buf)?; // bounds check of the target
                self.memory.read(device_pa, &mut buf)?;
                other.write(other_pa, &buf)?;
                self.count(&self.d2h, len);
            }
        }
        Ok(())
    }
}

impl DeviceMemory for DmaEngine {
    /// One transfer out of the device memory, counted device → host, when `to` is a
    /// simulated memory or another engine (whose memory then counts it host → device);
    /// the bounce-buffer default otherwise.
    fn copy(
        &self,
        src: PhysAddr,
        to: &dyn DeviceMemory,
        dst: PhysAddr,
        len: u64,
    ) -> Result<(), MemError> {
        let any = to.as_any();
        if let Some(m) = any.and_then(|a| a.downcast_ref::<SimMemory>()) {
            self.memory.copy_to(src, m, dst, len)?;
        } else if let Some(e) = any.and_then(|a| a.downcast_ref::<DmaEngine>()) {
            self.memory.copy_to(src, &e.memory, dst, len)?;
            e.count(&e.h2d, len);
        } else {
            return gmem_core::bounce_copy(self, src, to, dst, len);
        }
        self.count(&self.d2h, len);
        Ok(())
    }
    fn as_any(&self) -> Option<&dyn std::any::Any> {
        Some(self)
    }
    fn zero(&self, pa: PhysAddr, len: u64) -> Result<(), MemError> {
        self.memory.zero(pa, len)?;
        self.count(&self.zeroed, len);
        Ok(())
    }
    fn read(&self, pa: PhysAddr, buf: &mut [u8]) -> Result<(), MemError> {
        self.memory.read(pa, buf)?;
        self.count(&self.d2h, buf.len() as u64);
        Ok(())
    }
    fn write(&self, pa: PhysAddr, buf: &[u8]) -> Result<(), MemError> {
        self.memory.write(pa, buf)?;
        self.count(&self.h2d, buf.len() as u64);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gmem_core::PAGE_SIZE;

    #[test]
    fn the_engine_counts_each_direction_and_zero_fills_separately() {
        let vram =
            Arc::new(SimMemory::new("vram", PhysAddr::new(0x10_0000), 4 * PAGE_SIZE).unwrap());
        let host = SimMemory::new("host", PhysAddr::new(0), 4 * PAGE_SIZE).unwrap();
        let dma = DmaEngine::new(vram.clone());
        host.write(PhysAddr::new(0x1000), &[5; 4096]).unwrap();
        dma.copy(
            Direction::ToDevice,
            PhysAddr::new(0x10_2000),
            &host,
            PhysAddr::new(0x1000),
            4096,
        )
        .unwrap();
        assert_eq!(
            vram.read_u64(PhysAddr::new(0x10_2ff8)).unwrap(),
            0x0505_0505_0505_0505
        );
        dma.copy(
            Direction::ToHost,
            PhysAddr::new(0x10_2000),
            &host,
            PhysAddr::new(0x3000),
            100,
        )
        .unwrap();
        DeviceMemory::zero(&dma, PhysAddr::new(0x10_0000), 2 * PAGE_SIZE).unwrap();
        let mut b = [0u8; 10];
        DeviceMemory::read(&dma, PhysAddr::new(0x10_2000), &mut b).unwrap();
        DeviceMemory::write(&dma, PhysAddr::new(0x10_3000), &b).unwrap();
        assert_eq!(
            dma.stats(),
            DmaStats {
                host_to_device: 4096 + 10,
                device_to_host: 100 + 10,
                zeroed: 2 * PAGE_SIZE,
                transfers: 5
            }
        );
    }

    #[test]
    fn a_copy_with_a_bad_range_moves_nothing() {
        let vram = Arc::new(SimMemory::new("vram", PhysAddr::new(0x10_0000), PAGE_SIZE).unwrap());
        let host = SimMemory::new("host", PhysAddr::new(0), PAGE_SIZE).unwrap();
        host.write(PhysAddr::new(0), &[1; 8]).unwrap();
        let dma = DmaEngine::new(vram.clone());
        assert!(dma
            .copy(
                Direction::ToDevice,
                PhysAddr::new(0x10_0ffc),
                &host,
                PhysAddr::new(0),
                8
            )
            .is_err());
        assert!(dma
            .copy(
                Direction::ToHost,
                PhysAddr::new(0x10_0000),
                &host,
                PhysAddr::new(0xffc),
                8
            )
            .is_err());
        assert_eq!(dma.stats(), DmaStats::default());
        assert_eq!(vram.stats().bytes_written, 0);
        assert!(DeviceMemory::write(&dma, PhysAddr::new(0), &[0]).is_err());
    }
}
