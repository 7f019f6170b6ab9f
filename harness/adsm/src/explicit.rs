//! The baseline: the same workloads written with explicit copies — allocate twice (a
//! host buffer for the CPU, a device buffer for kernels), copy in, launch, copy out —
//! through the same copy engine and on the same time model as the ADSM runtime.
//!
//! The device buffer is a region whose pages have device-private frames and no CPU
//! access (a CPU touch of it faults and is an error, as a CUDA device pointer
//! dereferenced on the host would be); the host buffer is ordinary host memory the
//! CPU faults in. Copies are synchronous (`cudaMemcpy`).

use crate::dma::transfer_timed;
use crate::machine::{AdsmError, Machine};
use crate::model::{TimeModel, Timeline, Way};
use crate::program::{Buf, Kernel, Measured, Program, Window};
use gmem_core::{AllocRequest, MapFlags, MigrateScope, Prot, Region, VirtAddr, PAGE_SIZE};
use gmem_sim::Grid;
use std::collections::BTreeMap;

/// The explicit-copy baseline over a [`Machine`].
pub struct Explicit {
    m: Machine,
    tl: Timeline,
    bufs: BTreeMap<u64, (Region, Region)>,
    running: bool,
    window: Window,
}

impl Explicit {
    /// The baseline on `machine`, timed by `model`.
    pub fn new(machine: Machine, model: TimeModel) -> Explicit {
        let window = Window::open(&machine);
        Explicit {
            m: machine,
            tl: Timeline::new(model),
            bufs: BTreeMap::new(),
            running: false,
            window,
        }
    }

    fn alloc_pair(&mut self, len: u64) -> Result<(Region, Region), AdsmError> {
        let gm = &self.m.gm;
        let host = gm.as_alloc(self.m.space, AllocRequest::new(len))?;
        let dev = match gm.as_alloc(self.m.space, AllocRequest::new(len)) {
            Ok(d) => d,
            Err(e) => {
                let _ = gm.region_dealloc(host, MapFlags::empty(), None);
                return Err(e.into());
            }
        };
        let setup = || -> Result<(), AdsmError> {
            gm.region_migrate(host, gm.host(), MigrateScope::Prefetch)?;
            gm.region_alloc_private(dev, self.m.gpu_id)?;
            gm.region_protect(dev, Prot::empty())?;
            Ok(())
        };
        if let Err(e) = setup() {
            let _ = gm.region_dealloc(host, MapFlags::empty(), None);
            let _ = gm.region_dealloc(dev, MapFlags::empty(), None);
            return Err(e);
        }
        Ok((host, dev))
    }

    fn copy(&mut self, buf: Buf, way: Way) -> Result<(), AdsmError> {
        if !self.bufs.contains_key(&buf.host.as_u64()) {
            return Err(AdsmError::NotAnObject(buf.host));
        }
        let len = buf.len.div_ceil(PAGE_SIZE) * PAGE_SIZE;
        transfer_timed(&self.m, &mut self.tl, way, buf.host, buf.dev, len, true)?;
        Ok(())
    }
}

impl Program for Explicit {
    fn alloc(&mut self, len: u64) -> Result<Buf, AdsmError> {
        if len == 0 {
            return Err(AdsmError::BadArgument("zero-byte allocation"));
        }
        let (h, d) = self.alloc_pair(len.div_ceil(PAGE_SIZE) * PAGE_SIZE)?;
        self.bufs.insert(h.start.as_u64(), (h, d));
        Ok(Buf {
            host: h.start,
            dev: d.start,
            len,
        })
    }
    fn free(&mut self, buf: Buf) -> Result<(), AdsmError> {
        if self.running {
            return Err(AdsmError::KernelRunning);
        }
        let (h, d) = self
            .bufs
            .remove(&buf.host.as_u64())
            .ok_or(AdsmError::NotAnObject(buf.host))?;
        self.m.gm.region_dealloc(h, MapFlags::empty(), None)?;
        self.m.gm.region_dealloc(d, MapFlags::empty(), None)?;
        Ok(())
    }
    fn store(&mut self, at: VirtAddr, data: &[u8]) -> Result<(), AdsmError> {
        self.tl.cpu_work(data.len() as u64);
        Ok(self.m.cpu.store(&self.m.gm, at, data)?)
    }
    fn load(&mut self, at: VirtAddr, out: &mut [u8]) -> Result<(), AdsmError> {
        self.tl.cpu_work(out.len() as u64);
        Ok(self.m.cpu.load(&self.m.gm, at, out)?)
    }
    fn copy_in(&mut self, buf: Buf) -> Result<(), AdsmError> {
        self.copy(buf, Way::ToDevice)
    }
    fn copy_out(&mut self, buf: Buf) -> Result<(), AdsmError> {
        self.copy(buf, Way::ToHost)
    }
    fn call(&mut self, grid: Grid, kernel: Kernel<'_>) -> Result<(), AdsmError> {
        if self.running {
            return Err(AdsmError::KernelRunning);
        }
        self.m.launch(&mut self.tl, grid, kernel)?;
        self.running = true;
        Ok(())
    }
    fn sync(&mut self) -> Result<(), AdsmError> {
        if !self.running {
            return Err(AdsmError::NotRunning);
        }
        self.running = false;
        self.tl.wait_gpu();
        Ok(())
    }
    fn begin(&mut self) {
        self.tl.reset();
        self.window = Window::open(&self.m);
    }
    fn measure(&self) -> Measured {
        self.window.close(&self.m, &self.tl)
    }
    fn machine(&self) -> &Machine {
        &self.m
    }
}
