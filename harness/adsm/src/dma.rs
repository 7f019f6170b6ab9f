//! Transfers between an object's host frames and its device-private frames, through the
//! GPU's copy engine, charged to the time model with the engine's own counts.
//!
//! A transfer of a virtual range finds, page by page, the host frame the CPU's table
//! maps ([`gmem_core::Gmem::as_page_frame`]) and the GPU's private frame
//! ([`gmem_core::Gmem::as_private_frame`]), and issues one engine copy per run that is
//! contiguous on both sides (a DMA). The bytes and DMAs charged are the engine's
//! counters read before and after: the runtime keeps no byte counts of its own.

use crate::machine::{AdsmError, Machine};
use crate::model::{Timeline, Way};
use gmem_core::{PhysAddr, VirtAddr, PAGE_SIZE};
use gmem_sim::Direction;

/// What one transfer moved, as the copy engine counted it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Moved {
    /// Bytes.
    pub bytes: u64,
    /// DMAs (engine transfers).
    pub dmas: u64,
}

/// The `(host frame, device frame, bytes)` runs of `[host, host + len)` and
/// `[dev, dev + len)`, page aligned.
fn runs(
    m: &Machine,
    host: VirtAddr,
    dev: VirtAddr,
    len: u64,
) -> Result<Vec<(PhysAddr, PhysAddr, u64)>, AdsmError> {
    let mut out: Vec<(PhysAddr, PhysAddr, u64)> = Vec::new();
    let host_id = m.gm.host();
    for off in (0..len).step_by(PAGE_SIZE as usize) {
        let h = VirtAddr::new(host.as_u64() + off);
        let d = VirtAddr::new(dev.as_u64() + off);
        let hp = match m.gm.as_page_frame(m.space, h)? {
            Some((id, pa)) if id == host_id => pa,
            _ => return Err(AdsmError::NoFrame(h)),
        };
        let dp = match m.gm.as_private_frame(m.space, d, m.gpu_id)? {
            Some((_, pa)) => pa,
            None => return Err(AdsmError::NoFrame(d)),
        };
        match out.last_mut() {
            Some((lh, ld, n))
                if lh.as_u64() + *n == hp.as_u64() && ld.as_u64() + *n == dp.as_u64() =>
            {
                *n += PAGE_SIZE
            }
            _ => out.push((hp, dp, PAGE_SIZE)),
        }
    }
    Ok(out)
}

/// Copy `len` bytes (a page multiple) between the host frames of `host` and the
/// device-private frames of `dev` in direction `way`, through the GPU's copy engine.
/// Returns what the engine counted.
///
/// # Errors
/// [`AdsmError::NoFrame`] when a page lacks a host or private frame (nothing moved),
/// [`AdsmError::Dma`] when the engine rejects a run (the runs before it moved).
pub fn transfer(
    m: &Machine,
    way: Way,
    host: VirtAddr,
    dev: VirtAddr,
    len: u64,
) -> Result<Moved, AdsmError> {
    let runs = runs(m, host, dev, len)?;
    let engine = m.gpu.dma();
    let before = engine.stats();
    for (hp, dp, n) in runs {
        let dir = match way {
            Way::ToDevice => Direction::ToDevice,
            Way::ToHost => Direction::ToHost,
        };
        engine.copy(dir, dp, m.cpu.memory(), hp, n)?;
    }
    let after = engine.stats();
    let bytes = match way {
        Way::ToDevice => after.host_to_device - before.host_to_device,
        Way::ToHost => after.device_to_host - before.device_to_host,
    };
    Ok(Moved {
        bytes,
        dmas: after.transfers - before.transfers,
    })
}

/// [`transfer`], then charge it to `tl` as a transfer the CPU waits for (`sync`) or
/// one in the background; returns its end instant.
///
/// # Errors
/// As [`transfer`].
pub fn transfer_timed(
    m: &Machine,
    tl: &mut Timeline,
    way: Way,
    host: VirtAddr,
    dev: VirtAddr,
    len: u64,
    sync: bool,
) -> Result<f64, AdsmError> {
    let moved = transfer(m, way, host, dev, len)?;
    Ok(if sync {
        tl.dma_sync(way, moved.bytes, moved.dmas)
    } else {
        tl.dma_async(way, moved.bytes, moved.dmas)
    })
}
