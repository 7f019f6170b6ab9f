//! DMA through the core: VT-d brought up, each DMA device created in the core with its
//! own domain's [`IoMmu`], its buffers mapped bus_dma-style (`as_alloc` + `region_map`
//! onto the kernel's DMA memory) and unmapped strictly or asynchronously.

use crate::edu::{Edu, EDU_BUFFER, EDU_CHUNK, EDU_DMA_LIMIT};
use crate::memory::DmaArena;
use crate::vtd::{DmaFault, VtdDomain, VtdUnit};
use crate::{check, println};
use alloc::format;
use alloc::string::String;
use alloc::sync::Arc;
use alloc::vec::Vec;
use gmem_core::PageTableFormat;
use gmem_core::{
    Activation, AllocPolicy, AllocRequest, DevCaps, DeviceDesc, DeviceId, Gmem, MapFlags,
    MapRequest, MmuMode, PhysAddr, Prot, Region, SpaceId, VirtAddr, PAGE_SIZE,
};
use gmem_ptengine::{Codec, Entry, Run};
use gmem_x86pt::{PagedConfig, PagedMmu, VtdCodec};

/// A device's IOMMU driver: the shared driver over the VT-d format and its domain.
pub type IoMmu = PagedMmu<DeviceCodec, VtdDomain>;

/// The format the kernel gives a domain's driver: [`VtdCodec`], with `wrong_bits` forced
/// into every leaf the hardware sees (0 but in the negative test, where a reserved bit
/// must make the unit fault). The driver's own walks decode the entries without them.
#[derive(Clone, Copy, Debug)]
pub struct DeviceCodec {
    inner: VtdCodec,
    wrong_bits: u64,
}

impl Codec for DeviceCodec {
    fn format(&self) -> PageTableFormat {
        self.inner.format()
    }
    fn levels(&self) -> u32 {
        self.inner.levels()
    }
    fn va_ok(&self, va: u64, len: u64) -> bool {
        self.inner.va_ok(va, len)
    }
    fn large_levels(&self) -> u32 {
        self.inner.large_levels()
    }
    fn table(&self, table: PhysAddr) -> Option<u64> {
        self.inner.table(table)
    }
    fn leaf(&self, frame: PhysAddr, level: u32, run: &Run) -> Option<u64> {
        self.inner
            .leaf(frame, level, run)
            .map(|raw| raw | self.wrong_bits)
    }
    fn decode(&self, raw: u64, level: u32) -> Entry {
        self.inner.decode(raw & !self.wrong_bits, level)
    }
    fn with_prot(&self, raw: u64, prot: Prot, level: u32) -> Option<u64> {
        self.inner.with_prot(raw, prot, level)
    }
    fn split(&self, raw: u64, level: u32, i: u64) -> u64 {
        self.inner.split(raw, level, i)
    }
}

/// A DMA device in the core.
pub struct DmaDevice {
    /// The core's id.
    pub id: DeviceId,
    /// Its IOMMU driver.
    pub mmu: Arc<IoMmu>,
    /// Its I/O virtual address space, attached and active.
    pub space: SpaceId,
}

impl DmaDevice {
    /// Create `name` (PCI `bdf`) in the core behind `unit` in domain `did`, with the
    /// I/O virtual address space `[begin, end)`: 3-level tables when it fits 39 bits,
    /// 4-level ones (the CPU's depth) above.
    ///
    /// # Errors
    /// A description of the driver's or the core's refusal.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        gm: &Gmem,
        unit: &Arc<VtdUnit>,
        frames: Arc<dyn gmem_core::FrameSource>,
        name: &str,
        bdf: crate::board::Bdf,
        did: u16,
        (begin, end): (u64, u64),
        wrong_bits: u64,
    ) -> Result<DmaDevice, String> {
        let wide = end > 1 << 39;
        let inner = unit
            .codec(wide)
            .filter(|c| end <= 1 << c.address_bits())
            .ok_or_else(|| {
                format!("{name}: the unit has no second-level tables reaching {end:#x}")
            })?;
        let domain = VtdDomain::new(unit.clone(), bdf, did, &inner);
        let codec = DeviceCodec { inner, wrong_bits };
        // SAFETY: the pool's frames are identity mapped and the drivers' alone; an
        // IOMMU domain has no global mappings.
        let mmu = Arc::new(
            unsafe { PagedMmu::new(codec, domain, frames, PagedConfig::default(), &[]) }
                .map_err(|e| format!("{name}: IOMMU driver: {e}"))?,
        );
        let id = gm
            .dev_create(DeviceDesc {
                name: name.into(),
                mmu: mmu.clone(),
                memory: None,
                caps: DevCaps::empty(),
                data: None,
            })
            .map_err(|e| format!("{name}: dev_create: {e}"))?;
        let space = gm
            .as_create(
                VirtAddr::new(begin),
                VirtAddr::new(end),
                AllocPolicy::empty(),
            )
            .map_err(|e| format!("{name}: as_create: {e}"))?;
        gm.as_attach(space, id, MmuMode::Coherent, Activation::Switch)
            .map_err(|e| format!("{name}: as_attach: {e}"))?;
        Ok(DmaDevice { id, mmu, space })
    }

    /// Map `len` bytes of the kernel's memory at `pa` for DMA with `prot` (`align`:
    /// the IOVA's alignment, 2 MiB to get superpages).
    ///
    /// # Errors
    /// A description of the core's refusal; nothing stays allocated.
    pub fn map(
        &self,
        gm: &Gmem,
        host: DeviceId,
        pa: u64,
        len: u64,
        align: u64,
        prot: Prot,
    ) -> Result<Region, String> {
        let frames: Vec<PhysAddr> = (0..len / PAGE_SIZE)
            .map(|k| PhysAddr::new(pa + k * PAGE_SIZE))
            .collect();
        let mut req = AllocRequest::new(len);
        req.align = align.max(PAGE_SIZE);
        let region = gm
            .as_alloc(self.space, req)
            .map_err(|e| format!("as_alloc: {e}"))?;
        if let Err(e) = gm.region_map(region, MapRequest::new(&frames, host).prot(prot)) {
            let _ = gm.region_dealloc(region, MapFlags::empty(), None);
            return Err(format!("region_map: {e}"));
        }
        Ok(region)
    }
}

/// Print a fault the unit recorded.
fn report(f: &DmaFault) {
    println!(
        "vtd: dma fault recorded: reason {:#x} ({}), source {:02x}:{:02x}.{}, IOVA {:#x}, {}",
        f.reason,
        f.reason_name(),
        f.source >> 8,
        (f.source >> 3) & 0x1f,
        f.source & 7,
        f.address,
        if f.read { "read" } else { "write" }
    );
}

fn fill(pa: u64, len: u64, seed: u64) {
    for w in 0..len / 8 {
        // SAFETY: `[pa, pa + len)` is a buffer of the kernel's DMA memory (identity
        // mapped, no device is transferring to it now).
        unsafe { core::ptr::write_volatile((pa + 8 * w) as *mut u64, (pa + 8 * w) ^ seed) };
    }
}

fn differs(a: u64, b: u64, len: u64) -> Option<u64> {
    (0..len / 8).find(|w| {
        // SAFETY: two buffers of the kernel's DMA memory, no transfer in flight.
        unsafe {
            core::ptr::read_volatile((a + 8 * w) as *const u64)
                != core::ptr::read_volatile((b + 8 * w) as *const u64)
        }
    })
}

/// Edu: a 4 KiB buffer to the device and back through the IOMMU, every byte verified;
/// then a DMA from an IOVA just unmapped, which the unit must block and record.
///
/// # Errors
/// A description of the first check that failed.
pub fn edu(
    gm: &Gmem,
    host: DeviceId,
    unit: &Arc<VtdUnit>,
    frames: Arc<dyn gmem_core::FrameSource>,
    arena: &mut DmaArena,
    wrong_bits: u64,
) -> Result<(), String> {
    let edu = Edu::find()?;
    let b = edu.bdf;
    let iova = (0x10_0000, EDU_DMA_LIMIT);
    let dev = DmaDevice::new(gm, unit, frames, "edu", b, 1, iova, wrong_bits)?;
    let len = PAGE_SIZE;
    let src = arena.take(len, PAGE_SIZE).ok_or("no DMA memory")?;
    let dst = arena.take(len, PAGE_SIZE).ok_or("no DMA memory")?;
    fill(src, len, 0x6564_7531);
    let rs = dev.map(gm, host, src, len, PAGE_SIZE, Prot::READ)?;
    let rd = dev.map(gm, host, dst, len, PAGE_SIZE, Prot::WRITE)?;
    let (is, id) = (rs.start.as_u64(), rd.start.as_u64());
    for off in (0..len).step_by(EDU_CHUNK as usize) {
        edu.dma(is + off, EDU_BUFFER, EDU_CHUNK, false)?;
        edu.dma(EDU_BUFFER, id + off, EDU_CHUNK, true)?;
    }
    let faults = unit.take_faults();
    for f in &faults {
        report(f);
    }
    check(faults.is_empty(), || {
        format!("{} DMA fault(s) on mapped buffers", faults.len())
    })?;
    if let Some(w) = differs(src, dst, len) {
        return Err(format!("edu: word {w} differs after RAM -> edu -> RAM"));
    }
    println!(
        "edu: dma verified: {len} bytes ({} transfers each way) RAM {src:#x} (IOVA {is:#x}, read-only) -> edu {:02x}:{:02x}.{} -> RAM {dst:#x} (IOVA {id:#x}, write-only) through VT-d domain 1 ({}-level tables), every byte equal",
        len / EDU_CHUNK,
        b.bus,
        b.dev,
        b.func,
        dev.mmu.codec().levels()
    );
    // Unmap the source strictly (the IOTLB invalidation completes first), then let the
    // device read it again: the unit must block the read and record it.
    gm.region_dealloc(rs, MapFlags::empty(), None)
        .map_err(|e| format!("region_dealloc: {e}"))?;
    edu.dma(is, EDU_BUFFER, EDU_CHUNK, false)?;
    let faults = unit.take_faults();
    let f = faults
        .first()
        .ok_or("a DMA from an unmapped IOVA was not recorded as a fault")?;
    check(
        f.address == is && f.source == b.source_id() && f.read,
        || format!("unexpected fault record {f:?}"),
    )?;
    report(f);
    gm.region_dealloc(rd, MapFlags::empty(), None)
        .map_err(|e| format!("region_dealloc: {e}"))?;
    let s = dev.mmu.stats();
    check(gm.dev_active(dev.id) == Ok(Some(dev.space)), || {
        "edu is not active in its space".into()
    })?;
    println!(
        "edu domain: pages mapped {}, unmapped {}, tables allocated {} / freed {}, range invalidations {}, whole-domain {}, context loads {}",
        s.pages_mapped, s.pages_unmapped, s.tables_allocated, s.tables_freed, s.invalidations_ranged, s.invalidations_all, s.activations
    );
    Ok(())
}

/// Buffers per churn run (GMEM's Table 3 counts per 1000 received buffers).
pub const CHURN_BUFFERS: u64 = 1000;
/// Physical receive buffers the churn cycles through.
const CHURN_RING: u64 = 16;
const BLOCK_2M: u64 = 2 << 20;

/// What [`nvme`] measured.
pub struct NvmeReport {
    /// IOTLB invalidation descriptors during the strict churn run.
    pub strict: u64,
    /// IOTLB invalidation descriptors during the asynchronous churn run.
    pub asynchronous: u64,
    /// Wait descriptors (completed invalidation batches) during the strict run.
    pub strict_waits: u64,
    /// Wait descriptors during the asynchronous run.
    pub async_waits: u64,
}

fn take(arena: &mut DmaArena, bytes: u64, align: u64) -> Result<u64, String> {
    arena
        .take(bytes, align)
        .ok_or_else(|| String::from("no DMA memory left"))
}

/// NVMe: queues mapped through VT-d, a 2 MiB buffer written to the disk and read back
/// into another, both mapped by one 2 MiB superpage each, every byte verified; then the
/// receive churn, strict and asynchronous.
///
/// # Errors
/// A description of the first check that failed.
pub fn nvme(
    gm: &Gmem,
    host: DeviceId,
    unit: &Arc<VtdUnit>,
    frames: Arc<dyn gmem_core::FrameSource>,
    arena: &mut DmaArena,
    (bdf, bar): (crate::board::Bdf, u64),
) -> Result<NvmeReport, String> {
    use crate::nvme::{Buffer, Nvme, QUEUE_BYTES};
    let dev = DmaDevice::new(gm, unit, frames, "nvme", bdf, 2, (0x10_0000, 1 << 40), 0)?;
    let mut buffer = |bytes: u64, prot: Prot| -> Result<Buffer, String> {
        let pa = take(arena, bytes, PAGE_SIZE)?;
        let r = dev.map(
            gm,
            host,
            pa,
            bytes.div_ceil(PAGE_SIZE) * PAGE_SIZE,
            PAGE_SIZE,
            prot,
        )?;
        Ok(Buffer {
            pa,
            iova: r.start.as_u64(),
        })
    };
    let admin = (
        buffer(QUEUE_BYTES, Prot::READ)?,
        buffer(QUEUE_BYTES, Prot::WRITE)?,
    );
    let io = (
        buffer(QUEUE_BYTES, Prot::READ)?,
        buffer(QUEUE_BYTES, Prot::WRITE)?,
    );
    let prp_list = buffer(PAGE_SIZE, Prot::READ)?;
    let identify = buffer(PAGE_SIZE, Prot::WRITE)?;
    // SAFETY: `bar` is the controller's BAR0 (`nvme::find`), identity mapped; the
    // queues and the PRP list are the kernel's DMA memory, mapped for the controller
    // just above.
    let mut n = unsafe { Nvme::init(bar, admin, io, prp_list) }?;
    let (blocks, block) = n.identify_namespace(identify)?;
    check(blocks * block >= 2 * BLOCK_2M && block <= PAGE_SIZE, || {
        format!("nvme: namespace 1 has {blocks} blocks of {block} bytes; 4 MiB needed")
    })?;
    println!(
        "nvme: controller {:02x}:{:02x}.{} behind VT-d domain 2 ({}-level tables, 48-bit IOVAs): admin and I/O queues at IOVAs {:#x}/{:#x}, {:#x}/{:#x}; namespace 1: {blocks} blocks of {block} bytes",
        bdf.bus, bdf.dev, bdf.func, dev.mmu.codec().levels(), admin.0.iova, admin.1.iova, io.0.iova, io.1.iova
    );

    // 2 MiB out and back, each buffer one superpage.
    let w = take(arena, BLOCK_2M, BLOCK_2M)?;
    let r = take(arena, BLOCK_2M, BLOCK_2M)?;
    fill(w, BLOCK_2M, 0x6e76_6d65);
    let rw = dev.map(gm, host, w, BLOCK_2M, BLOCK_2M, Prot::READ)?;
    let rr = dev.map(gm, host, r, BLOCK_2M, BLOCK_2M, Prot::WRITE)?;
    let root = dev
        .mmu
        .active_root()
        .ok_or("the NVMe domain has no active table")?;
    let tw = dev
        .mmu
        .translate(root, rw.start)
        .ok_or("the write buffer is not mapped")?;
    let tr = dev
        .mmu
        .translate(root, rr.start)
        .ok_or("the read buffer is not mapped")?;
    n.io(true, 0, block, rw.start.as_u64(), BLOCK_2M)?;
    n.io(false, 0, block, rr.start.as_u64(), BLOCK_2M)?;
    let faults = unit.take_faults();
    for f in &faults {
        report(f);
    }
    check(faults.is_empty(), || {
        format!("{} DMA faults during NVMe I/O", faults.len())
    })?;
    if let Some(k) = differs(w, r, BLOCK_2M) {
        return Err(format!("nvme: word {k} of the 2 MiB read back differs"));
    }
    println!(
        "nvme: 2 MiB verified: written from IOVA {:#x} ({:?} leaf -> {:#x}) and read back into IOVA {:#x} ({:?} leaf -> {:#x}), one command each with a PRP list, {BLOCK_2M} bytes equal",
        rw.start.as_u64(),
        tw.page_size,
        tw.pa.as_u64(),
        rr.start.as_u64(),
        tr.page_size,
        tr.pa.as_u64()
    );
    check(
        tw.page_size == gmem_core::PageSize::Size2M && tr.page_size == gmem_core::PageSize::Size2M,
        || "the 2 MiB buffers were not mapped by superpages".into(),
    )?;
    for region in [rw, rr] {
        gm.region_dealloc(region, MapFlags::empty(), None)
            .map_err(|e| format!("region_dealloc: {e}"))?;
    }

    // Receive churn: map a 4 KiB buffer, read a block of the data above into it,
    // verify, unmap; strict then asynchronous.
    let ring: Vec<u64> = (0..CHURN_RING)
        .map(|_| take(arena, PAGE_SIZE, PAGE_SIZE))
        .collect::<Result<_, _>>()?;
    let waits = || {
        unit.counters
            .wait
            .load(core::sync::atomic::Ordering::Relaxed)
    };
    let mut churn = |flags: MapFlags| -> Result<(u64, u64), String> {
        let before = (unit.counters.iotlb(), waits());
        for i in 0..CHURN_BUFFERS {
            let buf = ring[(i % CHURN_RING) as usize];
            let page = i % (BLOCK_2M / PAGE_SIZE);
            let region = dev.map(gm, host, buf, PAGE_SIZE, PAGE_SIZE, Prot::WRITE)?;
            n.io(
                false,
                page * PAGE_SIZE / block,
                block,
                region.start.as_u64(),
                PAGE_SIZE,
            )?;
            if let Some(k) = differs(buf, w + page * PAGE_SIZE, PAGE_SIZE) {
                return Err(format!(
                    "churn buffer {i}: word {k} differs from the disk's data"
                ));
            }
            gm.region_dealloc(region, flags, None)
                .map_err(|e| format!("region_dealloc: {e}"))?;
        }
        gm.as_synchronize(dev.space)
            .map_err(|e| format!("as_synchronize: {e}"))?;
        Ok((unit.counters.iotlb() - before.0, waits() - before.1))
    };
    let (strict, strict_waits) = churn(MapFlags::empty())?;
    let (asynchronous, async_waits) = churn(MapFlags::ASYNC)?;
    let faults = unit.take_faults();
    check(faults.is_empty(), || {
        format!("{} DMA faults during the churn", faults.len())
    })?;
    println!(
        "nvme: churn: {CHURN_BUFFERS} buffers mapped, read into by the controller, verified and unmapped, twice; {} commands in all",
        n.commands
    );
    check(asynchronous < strict, || {
        format!("asynchronous unmaps took {asynchronous} IOTLB invalidations, strict ones {strict}")
    })?;
    Ok(NvmeReport {
        strict,
        asynchronous,
        strict_waits,
        async_waits,
    })
}
