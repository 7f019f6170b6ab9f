//! The time model: its parameters, where they come from, and three timelines (the CPU,
//! the GPU's copy engine, the GPU's compute) so that overlap is computed, not assumed.
//!
//! **Calibration.** One parameter is calibrated, once, against a published figure: the
//! bus bandwidth is PCI Express 2.0 ×16 (the interconnect of the paper's era, its
//! NVIDIA GTX 285-class GPUs): 5 GT/s per lane with 8b/10b encoding is 500 MB/s per
//! lane and direction (PCI-SIG, *PCI Express Base Specification 2.0*, 2007), ×16 lanes
//! = 8 GB/s. The device memory bandwidth is the GTX 285's published 159 GB/s (NVIDIA's
//! product specification). The other parameters are stated assumptions of the model,
//! not fits: a DMA's setup cost (driver call, descriptor, doorbell), a CPU fault
//! delivered to the runtime's handler and returned from (a user-level SIGSEGV round
//! trip), a protection change (an `mprotect` call with its TLB shootdown), a kernel
//! launch, and the rate at which the CPU produces or consumes the bytes of a workload.
//! The same parameters serve every protocol and the explicit-copy baseline; nothing is
//! tuned per protocol or workload.
//!
//! **What feeds it.** Bytes and DMA counts come from the GPU's copy engine
//! ([`gmem_sim::DmaEngine`] stats, before and after each transfer); kernel bytes from
//! the GPU port's load/store counters; CPU bytes from the accesses a program makes.
//!
//! **Timelines.** `cpu`, `dma` and `gpu` are the instants at which each is free. A
//! synchronous DMA starts when both the CPU and the engine are free and blocks the CPU
//! until it ends; an asynchronous one (rolling's eager flush) starts when both are free
//! but leaves the CPU running; a kernel starts when the CPU has called it and the
//! engine has finished every transfer issued before; `sync` waits for the kernel.

/// The model's parameters.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct TimeModel {
    /// Host↔device bus bandwidth, bytes/s (calibrated: PCIe 2.0 ×16, 8 GB/s).
    pub bus_bytes_per_s: f64,
    /// Setup cost of one DMA, ns (assumption).
    pub dma_setup_ns: f64,
    /// A CPU fault delivered to the runtime and returned from, ns (assumption).
    pub fault_ns: f64,
    /// One protection change, ns (assumption).
    pub protect_ns: f64,
    /// Kernel launch overhead, ns (assumption).
    pub launch_ns: f64,
    /// Device memory bandwidth seen by kernels, bytes/s (GTX 285: 159 GB/s).
    pub device_bytes_per_s: f64,
    /// Bytes the CPU produces or consumes per second in the workloads' loops
    /// (assumption).
    pub cpu_bytes_per_s: f64,
}

impl Default for TimeModel {
    fn default() -> Self {
        TimeModel {
            bus_bytes_per_s: 8.0e9,
            dma_setup_ns: 10_000.0,
            fault_ns: 5_000.0,
            protect_ns: 2_000.0,
            launch_ns: 5_000.0,
            device_bytes_per_s: 159.0e9,
            cpu_bytes_per_s: 2.0e9,
        }
    }
}

impl TimeModel {
    /// The parameters, one per line, with their provenance.
    pub fn describe(&self) -> String {
        format!(
            "bus bandwidth       {:.1} GB/s  (calibrated: PCIe 2.0 x16, 500 MB/s/lane/direction x 16, PCI-SIG)\n\
             DMA setup           {:.1} us    (assumption)\n\
             CPU fault           {:.1} us    (assumption: SIGSEGV to handler and back)\n\
             protection change   {:.1} us    (assumption: mprotect + TLB shootdown)\n\
             kernel launch       {:.1} us    (assumption)\n\
             device memory       {:.1} GB/s  (GTX 285 specification)\n\
             CPU produce/consume {:.1} GB/s  (assumption)\n",
            self.bus_bytes_per_s / 1e9,
            self.dma_setup_ns / 1e3,
            self.fault_ns / 1e3,
            self.protect_ns / 1e3,
            self.launch_ns / 1e3,
            self.device_bytes_per_s / 1e9,
            self.cpu_bytes_per_s / 1e9,
        )
    }
}

/// Where the modelled time went, ns. `cpu_work + faults + protect + waits` is the
/// CPU's timeline; DMA and kernel time may overlap it.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Breakdown {
    /// CPU producing and consuming data.
    pub cpu_work: f64,
    /// CPU faults handled by the runtime.
    pub faults: f64,
    /// Protection changes.
    pub protect: f64,
    /// Copy-engine busy time towards the device.
    pub dma_h2d: f64,
    /// Copy-engine busy time towards the host.
    pub dma_d2h: f64,
    /// GPU busy time (launch and kernels).
    pub kernel: f64,
    /// CPU blocked on a transfer or a kernel.
    pub cpu_wait: f64,
}

/// The three timelines of one run.
#[derive(Clone, Copy, Debug, Default)]
pub struct Timeline {
    model: TimeModel,
    cpu: f64,
    dma: f64,
    gpu: f64,
    breakdown: Breakdown,
}

/// Which way a transfer went.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Way {
    /// Host to device.
    ToDevice,
    /// Device to host.
    ToHost,
}

impl Timeline {
    /// Empty timelines under `model`.
    pub fn new(model: TimeModel) -> Timeline {
        Timeline {
            model,
            ..Timeline::default()
        }
    }

    /// The parameters.
    pub fn model(&self) -> &TimeModel {
        &self.model
    }

    /// Start again at zero (same parameters).
    pub fn reset(&mut self) {
        *self = Timeline::new(self.model);
    }

    /// The CPU's clock, ns.
    pub fn cpu_now(&self) -> f64 {
        self.cpu
    }

    /// The CPU produced or consumed `bytes`.
    pub fn cpu_work(&mut self, bytes: u64) {
        let t = bytes as f64 / self.model.cpu_bytes_per_s * 1e9;
        self.cpu += t;
        self.breakdown.cpu_work += t;
    }

    /// `n` CPU faults handled by the runtime.
    pub fn faults(&mut self, n: u64) {
        let t = n as f64 * self.model.fault_ns;
        self.cpu += t;
        self.breakdown.faults += t;
    }

    /// One protection change.
    pub fn protect(&mut self) {
        self.cpu += self.model.protect_ns;
        self.breakdown.protect += self.model.protect_ns;
    }

    fn dma_time(&self, bytes: u64, dmas: u64) -> f64 {
        dmas as f64 * self.model.dma_setup_ns + bytes as f64 / self.model.bus_bytes_per_s * 1e9
    }

    fn account(&mut self, way: Way, t: f64) {
        match way {
            Way::ToDevice => self.breakdown.dma_h2d += t,
            Way::ToHost => self.breakdown.dma_d2h += t,
        }
    }

    /// A transfer of `bytes` in `dmas` DMAs (as the engine counted them) that the CPU
    /// waits for. Returns when it ends.
    pub fn dma_sync(&mut self, way: Way, bytes: u64, dmas: u64) -> f64 {
        let end = self.dma_async(way, bytes, dmas);
        self.wait_until(end);
        end
    }

    /// A transfer the CPU does not wait for. Returns when it ends.
    pub fn dma_async(&mut self, way: Way, bytes: u64, dmas: u64) -> f64 {
        if dmas == 0 && bytes == 0 {
            return self.cpu.max(self.dma);
        }
        let t = self.dma_time(bytes, dmas);
        let start = self.cpu.max(self.dma);
        self.dma = start + t;
        self.account(way, t);
        self.dma
    }

    /// The CPU waits until instant `t`.
    pub fn wait_until(&mut self, t: f64) {
        if t > self.cpu {
            self.breakdown.cpu_wait += t - self.cpu;
            self.cpu = t;
        }
    }

    /// A kernel that moved `bytes` through device memory was called now.
    pub fn kernel(&mut self, bytes: u64) {
        let t = self.model.launch_ns + bytes as f64 / self.model.device_bytes_per_s * 1e9;
        let start = self.cpu.max(self.dma).max(self.gpu);
        self.gpu = start + t;
        self.breakdown.kernel += t;
    }

    /// The CPU waits for the kernel.
    pub fn wait_gpu(&mut self) {
        self.wait_until(self.gpu);
    }

    /// The run's time: when the last of the three is done, ns.
    pub fn total(&self) -> f64 {
        self.cpu.max(self.dma).max(self.gpu)
    }

    /// Where the time went.
    pub fn breakdown(&self) -> Breakdown {
        self.breakdown
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn async_transfers_overlap_the_cpu_and_sync_ones_block_it() {
        let m = TimeModel::default();
        let mut t = Timeline::new(m);
        let end = t.dma_async(Way::ToDevice, 8_000, 1); // 10 us + 1 us
        assert!((end - 11_000.0).abs() < 1e-6);
        t.cpu_work(20_000); // 10 us on the CPU meanwhile
        assert!((t.cpu_now() - 10_000.0).abs() < 1e-6);
        t.dma_sync(Way::ToHost, 0, 1); // queued behind the first: 11..21 us
        assert!((t.cpu_now() - 21_000.0).abs() < 1e-6);
        assert!((t.breakdown().cpu_wait - 11_000.0).abs() < 1e-6);
        t.kernel(0);
        t.wait_gpu();
        assert!((t.total() - 26_000.0).abs() < 1e-6);
    }
}
