//! A complete (tiny) driver: the MMU functions and the data mover of a device whose page
//! table is a map in memory, attached to a space next to the CPU, serving a fault.
//!
//! Run: `cargo run -p gmem-core --example driver`

use gmem_core::*;
use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};

/// One page table: virtual page -> (frame, protection).
type Table = BTreeMap<u64, (u64, Prot)>;

/// The driver's MMU: page tables keyed by root (a real one would also own a TLB to
/// invalidate on request).
#[derive(Default)]
struct ToyMmu {
    tables: Mutex<HashMap<u64, Table>>,
    next_root: Mutex<u64>,
}

impl Mmu for ToyMmu {
    fn format(&self) -> PageTableFormat {
        PageTableFormat(0x70)
    }
    fn page_sizes(&self) -> PageSizes {
        PageSizes::S4K
    }
    fn create_page_table(&self) -> Result<PageTableRoot, MmuError> {
        let mut n = self.next_root.lock().unwrap();
        *n += 1;
        self.tables.lock().unwrap().insert(*n, BTreeMap::new());
        Ok(PageTableRoot(*n))
    }
    fn destroy_page_table(&self, root: PageTableRoot) {
        self.tables.lock().unwrap().remove(&root.0);
    }
    fn map(&self, root: PageTableRoot, run: &MapRun) -> Result<(), MmuError> {
        let mut t = self.tables.lock().unwrap();
        let table = t.get_mut(&root.0).ok_or(MmuError::Hardware(1))?;
        for k in 0..run.len / PAGE_SIZE {
            table.insert(run.va.vpn().0 + k, (run.pa.pfn().0 + k, run.prot));
        }
        Ok(())
    }
    fn unmap(&self, root: PageTableRoot, range: VaRange) {
        if let Some(table) = self.tables.lock().unwrap().get_mut(&root.0) {
            let first = range.first_vpn().0;
            table.retain(|v, _| *v < first || *v >= first + range.pages());
        }
    }
    fn protect(&self, root: PageTableRoot, range: VaRange, prot: Prot) -> Result<(), MmuError> {
        if let Some(table) = self.tables.lock().unwrap().get_mut(&root.0) {
            let first = range.first_vpn().0;
            for (_, e) in table.range_mut(first..first + range.pages()) {
                e.1 = prot;
            }
        }
        Ok(())
    }
    fn invalidate(&self, _root: PageTableRoot, _ranges: &[VaRange]) {}
    fn invalidate_all(&self, _root: PageTableRoot) {}
    fn activate(&self, _root: Option<PageTableRoot>) {}
}

/// The device's memory: bytes in a vector.
struct ToyMemory(Mutex<Vec<u8>>);

impl DeviceMemory for ToyMemory {
    fn zero(&self, pa: PhysAddr, len: u64) -> Result<(), MemError> {
        let mut m = self.0.lock().unwrap();
        let r = m
            .get_mut(pa.as_u64() as usize..(pa.as_u64() + len) as usize)
            .ok_or(MemError::OutOfRange { pa })?;
        r.fill(0);
        Ok(())
    }
    fn read(&self, pa: PhysAddr, buf: &mut [u8]) -> Result<(), MemError> {
        let m = self.0.lock().unwrap();
        let r = m
            .get(pa.as_u64() as usize..pa.as_u64() as usize + buf.len())
            .ok_or(MemError::OutOfRange { pa })?;
        buf.copy_from_slice(r);
        Ok(())
    }
    fn write(&self, pa: PhysAddr, buf: &[u8]) -> Result<(), MemError> {
        let mut m = self.0.lock().unwrap();
        let r = m
            .get_mut(pa.as_u64() as usize..pa.as_u64() as usize + buf.len())
            .ok_or(MemError::OutOfRange { pa })?;
        r.copy_from_slice(buf);
        Ok(())
    }
}

fn main() {
    // The kernel creates the instance with its CPU device and registers host memory.
    let cpu_mem = Arc::new(ToyMemory(Mutex::new(vec![0; 1 << 20])));
    let gm = Gmem::new(
        Arc::new(SingleCpu),
        DeviceDesc {
            name: "cpu".into(),
            mmu: Arc::new(ToyMmu::default()),
            memory: Some(cpu_mem),
            caps: DevCaps::FAULTABLE,
            data: None,
        },
    )
    .unwrap();
    gm.dev_register_physmem(gm.host(), PhysAddr::new(0), PhysAddr::new(1 << 20))
        .unwrap();

    // The driver creates its device and registers its local memory.
    let mmu = Arc::new(ToyMmu::default());
    let vram = Arc::new(ToyMemory(Mutex::new(vec![0; 1 << 20])));
    let gpu = gm
        .dev_create(DeviceDesc {
            name: "toy-gpu".into(),
            mmu: mmu.clone(),
            memory: Some(vram.clone()),
            caps: DevCaps::FAULTABLE,
            data: None,
        })
        .unwrap();
    gm.dev_register_physmem(gpu, PhysAddr::new(0), PhysAddr::new(1 << 20))
        .unwrap();

    // One address space shared by the CPU and the device.
    let space = gm
        .as_create(
            VirtAddr::new(1 << 30),
            VirtAddr::new(2 << 30),
            AllocPolicy::empty(),
        )
        .unwrap();
    gm.as_attach(space, gm.host(), MmuMode::Coherent, Activation::Switch)
        .unwrap();
    gm.as_attach(space, gpu, MmuMode::Coherent, Activation::Switch)
        .unwrap();
    let buf = gm
        .as_alloc(space, AllocRequest::new(16 * PAGE_SIZE))
        .unwrap();

    // The device touches the buffer: its MMU misses, the driver reports the fault, the
    // core allocates device memory, zero-fills it and calls the driver's `map`.
    let va = VirtAddr::new(buf.start.as_u64() + 3 * PAGE_SIZE);
    let fixed = gm.dev_fault(gpu, va, Prot::WRITE).unwrap();
    println!("fault at {va}: {:?}, the driver retries", fixed.kind);
    let (pfn, prot) = mmu
        .tables
        .lock()
        .unwrap()
        .values()
        .find_map(|t| t.get(&va.vpn().0).copied())
        .unwrap();
    println!(
        "device PTE: vpn {:#x} -> frame {pfn:#x} ({prot:?})",
        va.vpn().0
    );
    println!("{:?}", gm.stats());
    gm.check_invariants(space).unwrap();
}
