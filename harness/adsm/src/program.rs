//! What a workload sees: one interface over the ADSM runtime and the explicit-copy
//! baseline, and what a run measured.
//!
//! A workload allocates [`Buf`]s, produces and consumes them on the CPU with
//! [`Program::store`] / [`Program::load`], launches kernels with [`Program::call`] and
//! waits with [`Program::sync`]. The explicit copies of the baseline are
//! [`Program::copy_in`] / [`Program::copy_out`]: the ADSM runtime ignores them (that
//! is the point of ADSM), the baseline does them with its copy engine. A kernel uses
//! [`Buf::dev`]; the CPU uses [`Buf::host`] (the same address under ADSM's `alloc`).

use crate::machine::{AdsmError, Machine};
use crate::model::{Breakdown, Timeline};
use gmem_core::VirtAddr;
use gmem_sim::{AccessError, DmaStats, Grid, PortStats, WorkItem};

/// A shared buffer: its CPU address, its device address, its size in bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Buf {
    /// The address the CPU uses.
    pub host: VirtAddr,
    /// The address kernels use.
    pub dev: VirtAddr,
    /// Bytes.
    pub len: u64,
}

impl Buf {
    /// The CPU address `off` bytes in.
    pub fn host_at(&self, off: u64) -> VirtAddr {
        VirtAddr::new(self.host.as_u64() + off)
    }
    /// The device address `off` bytes in.
    pub fn dev_at(&self, off: u64) -> VirtAddr {
        VirtAddr::new(self.dev.as_u64() + off)
    }
}

/// A kernel: run once per work-item.
pub type Kernel<'a> = &'a mut dyn FnMut(&WorkItem<'_>) -> Result<(), AccessError>;

/// What one measured window of a run did. Bytes and DMAs are the GPU copy engine's
/// counters, faults the CPU and GPU ports' counters, time the [`Timeline`]'s.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Measured {
    /// Bytes host → device.
    pub bytes_h2d: u64,
    /// Bytes device → host.
    pub bytes_d2h: u64,
    /// DMAs.
    pub dmas: u64,
    /// Bytes the engine zero-filled (allocation is outside the window: expected 0).
    pub zeroed: u64,
    /// CPU faults the runtime handled (faults the core answered with an error, i.e.
    /// delivered to the program as a signal).
    pub cpu_faults: u64,
    /// Faults the GPU took (a GPU that cannot fault must take none).
    pub gpu_faults: u64,
    /// Modelled time, ns.
    pub time_ns: f64,
    /// Its breakdown.
    pub breakdown: Breakdown,
    /// Largest length the dirty FIFO reached (rolling; 0 otherwise).
    pub max_fifo: usize,
    /// Blocks flushed early because the FIFO overflowed (rolling).
    pub eager_flushes: u64,
}

/// Counter snapshots at the start of a measured window.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Window {
    dma: DmaStats,
    cpu: PortStats,
    gpu: PortStats,
}

impl Window {
    pub(crate) fn open(m: &Machine) -> Window {
        Window {
            dma: m.gpu.dma().stats(),
            cpu: m.cpu.stats().port,
            gpu: m.gpu.stats().port,
        }
    }

    pub(crate) fn close(&self, m: &Machine, tl: &Timeline) -> Measured {
        let dma = m.gpu.dma().stats();
        let cpu = m.cpu.stats().port;
        let gpu = m.gpu.stats().port;
        Measured {
            bytes_h2d: dma.host_to_device - self.dma.host_to_device,
            bytes_d2h: dma.device_to_host - self.dma.device_to_host,
            dmas: dma.transfers - self.dma.transfers,
            zeroed: dma.zeroed - self.dma.zeroed,
            cpu_faults: cpu.failed_faults - self.cpu.failed_faults,
            gpu_faults: gpu.faults - self.gpu.faults,
            time_ns: tl.total(),
            breakdown: tl.breakdown(),
            max_fifo: 0,
            eager_flushes: 0,
        }
    }
}

/// The interface a workload is written against.
pub trait Program {
    /// A buffer of `len` bytes shared by the CPU and the device.
    ///
    /// # Errors
    /// [`AdsmError`] when memory runs out or the size is zero.
    fn alloc(&mut self, len: u64) -> Result<Buf, AdsmError>;
    /// Release a buffer.
    ///
    /// # Errors
    /// [`AdsmError::NotAnObject`] for an unknown buffer, [`AdsmError::KernelRunning`].
    fn free(&mut self, buf: Buf) -> Result<(), AdsmError>;
    /// The CPU stores `data` at `at`.
    ///
    /// # Errors
    /// [`AdsmError::KernelRunning`] on a shared object between `call` and `sync`; an
    /// access the runtime does not handle.
    fn store(&mut self, at: VirtAddr, data: &[u8]) -> Result<(), AdsmError>;
    /// The CPU loads `out.len()` bytes at `at`.
    ///
    /// # Errors
    /// As [`Program::store`].
    fn load(&mut self, at: VirtAddr, out: &mut [u8]) -> Result<(), AdsmError>;
    /// Explicit copy of the whole buffer to the device (the baseline's; ADSM: nothing).
    ///
    /// # Errors
    /// A transfer failure.
    fn copy_in(&mut self, buf: Buf) -> Result<(), AdsmError>;
    /// Explicit copy of the whole buffer to the host (the baseline's; ADSM: nothing).
    ///
    /// # Errors
    /// A transfer failure.
    fn copy_out(&mut self, buf: Buf) -> Result<(), AdsmError>;
    /// Launch `kernel` over `grid` on the device.
    ///
    /// # Errors
    /// [`AdsmError::KernelRunning`] if one is; a release transfer or the kernel failed.
    fn call(&mut self, grid: Grid, kernel: Kernel<'_>) -> Result<(), AdsmError>;
    /// Wait for the kernel.
    ///
    /// # Errors
    /// [`AdsmError::NotRunning`] without a call; an acquire transfer failed.
    fn sync(&mut self) -> Result<(), AdsmError>;
    /// Start the measured window (after the allocations): counters and timelines.
    fn begin(&mut self);
    /// What the window measured so far.
    fn measure(&self) -> Measured;
    /// The machine.
    fn machine(&self) -> &Machine;
}

/// Store `v` as little-endian `f32`s at `at`.
///
/// # Errors
/// As [`Program::store`].
pub fn store_f32s(p: &mut dyn Program, at: VirtAddr, v: &[f32]) -> Result<(), AdsmError> {
    let bytes: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
    p.store(at, &bytes)
}

/// Load `n` little-endian `f32`s at `at`.
///
/// # Errors
/// As [`Program::load`].
pub fn load_f32s(p: &mut dyn Program, at: VirtAddr, n: usize) -> Result<Vec<f32>, AdsmError> {
    let mut b = vec![0u8; n * 4];
    p.load(at, &mut b)?;
    Ok(b.chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect())
}
