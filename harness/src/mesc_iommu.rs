//! MESC in the IOMMU: a storage-style DMA stream of 2 MiB transfers into large,
//! long-lived buffers, with and without subregion IOTLB entries.
//!
//! A DMA device sits behind the IOMMU driver (`gmem-iommu`, locked tables, which keep
//! MESC's contiguity bits inside every edit: [`gmem_iommu::IoTables::with_mesc`]). The
//! driver maps `buffers` buffers of 2 MiB once through the core's bus_dma path (IOVA
//! from the space's vmem arena); the frames are a pool of host memory the core does
//! not manage, reserved by the driver at boot, one physically contiguous range (as a
//! storage driver's DMA pool is). Then the device streams `transfers` transfers, each
//! writing a whole 2 MiB buffer (round robin), and the host reads every buffer back.
//! Three IOTLB organisations, same stream: the stock IOTLB ([`gmem_iommu::iotlb`]), and
//! the MESC paper's design code ([`gmem_simt::mesc`]) with the stock geometry (1 queue:
//! a 32-entry L1, a 256-entry 8-way IOTLB, 16-entry paging-structure cache) as the
//! 4 KiB baseline and as MESC (subregion entries in ways 4–7, a 512-entry MSC).
//!
//! A DMA write through a cached entry whose page is still clean walks to set the
//! table's dirty bit (as a CPU store does), so the first write of each page walks even
//! when the IOTLB holds it: with MESC the stream's walks fall to the pages' first
//! writes, not to zero.

use gmem_core::{AllocPolicy, MapFlags, PhysAddr, Prot, SingleCpu, VirtAddr, PAGE_SIZE};
use gmem_host_cpu::{HostCpu, HostCpuConfig};
use gmem_iommu::{Discipline, InvalidationLatency, IoTables, Iommu, IommuConfig};
use gmem_ptengine::TableMemory;
use gmem_sim::{Replacement, TlbConfig, TranslationCaches};
use gmem_simt::mesc::{Design, DesignCaches, Geometry, MescTables};
use gmem_x86pt::X86Codec;
use std::sync::Arc;

/// One organisation's run.
#[derive(Clone, Debug, serde::Serialize)]
pub struct IommuRow {
    /// `stock`, `base` or `mesc`.
    pub iotlb: String,
    /// 2 MiB transfers streamed.
    pub transfers: u64,
    /// Translation requests (4 KiB pages).
    pub translations: u64,
    /// Shared IOTLB hit ratio.
    pub iotlb_hit: f64,
    /// Walks per 1000 translations.
    pub walks_per_kilo_access: f64,
    /// Table entries read per 1000 translations (MESC's extra reads included).
    pub reads_per_kilo_access: f64,
    /// Alg. 1 found no stale bit; every buffer read back as written.
    pub verified: bool,
}

/// The IOMMU's tables as MESC's walker reads them.
struct IoView(Arc<IoTables>);

impl MescTables for IoView {
    type Format = X86Codec;
    fn codec(&self) -> &X86Codec {
        self.0.codec()
    }
    fn entries(&self) -> &dyn TableMemory {
        self.0.memory()
    }
}

fn geometry() -> Geometry {
    Geometry {
        units: 1,
        l1_entries: 32,
        l2_sets: 32,
        l2_ways: 8,
        subregion_from: 4,
        msc: (64, 8),
        walk_cache: TlbConfig::new(1, 16, Replacement::Lru),
        colt_group: 4,
    }
}

fn run_one(which: &str, buffers: u64, transfers: u64) -> Result<IommuRow, String> {
    let e = |x: &dyn std::fmt::Debug| format!("{x:?}");
    let pool = buffers * (2 << 20);
    let cpu = HostCpu::new(HostCpuConfig {
        memory_bytes: (64 << 20) + pool,
        ..HostCpuConfig::default()
    })
    .map_err(|x| e(&x))?;
    let gm = gmem_core::Gmem::new(Arc::new(SingleCpu), cpu.device_desc()).map_err(|x| e(&x))?;
    cpu.port().bind(gm.host()).map_err(|x| e(&x))?;
    cpu.memory_map()
        .add(gm.host(), cpu.memory().clone())
        .map_err(|x| e(&x))?;
    let pool_base = (cpu.memory().end().as_u64() - pool) & !((2 << 20) - 1);
    gm.dev_register_physmem(
        gm.host(),
        PhysAddr::new(cpu.memory().base().as_u64() + (8 << 20)),
        PhysAddr::new(pool_base),
    )
    .map_err(|x| e(&x))?;
    let config = IommuConfig {
        discipline: Discipline::Locked,
        latency: InvalidationLatency::accounted(2000),
        table_frames: 2048,
        ..Default::default()
    };
    let iommu = match which {
        "stock" => Iommu::new(config, cpu.memory_map().clone()),
        _ => {
            let design = if which == "mesc" {
                Design::Mesc
            } else {
                Design::Base
            };
            Iommu::with_mesc(
                config,
                cpu.memory_map().clone(),
                Arc::new(move |t: &Arc<IoTables>, _queues: usize| {
                    let view = Arc::new(IoView(t.clone()));
                    DesignCaches::new(design, geometry(), view)
                        .map(|c| Box::new(c) as Box<dyn TranslationCaches>)
                }),
            )
        }
    }
    .map_err(|x| e(&x))?;
    let dev = iommu.create_device(&gm, "storage").map_err(|x| e(&x))?;
    let space = dev
        .create_space(
            &gm,
            VirtAddr::new(1 << 30),
            VirtAddr::new(1 << 40),
            AllocPolicy::empty(),
        )
        .map_err(|x| e(&x))?;
    let mut regions = Vec::new();
    for b in 0..buffers {
        let frames: Vec<PhysAddr> = (0..512)
            .map(|p| PhysAddr::new(pool_base + b * (2 << 20) + p * PAGE_SIZE))
            .collect();
        regions.push(
            dev.map_buffer_region(&gm, space, &frames, gm.host(), Prot::READ | Prot::WRITE)
                .map_err(|x| e(&x))?,
        );
    }
    let mut last = vec![0u64; buffers as usize];
    let mut data = vec![0u8; 2 << 20];
    for t in 0..transfers {
        let b = (t % buffers) as usize;
        for (i, chunk) in data.chunks_mut(8).enumerate() {
            chunk.copy_from_slice(&(t << 32 | i as u64).to_le_bytes());
        }
        dev.write(0, regions[b].start, &data).map_err(|x| e(&x))?;
        last[b] = t;
    }
    let mut verified = true;
    let mut got = vec![0u8; 2 << 20];
    for (b, &t) in last.iter().enumerate() {
        cpu.memory()
            .read(PhysAddr::new(pool_base + b as u64 * (2 << 20)), &mut got)
            .map_err(|x| e(&x))?;
        verified &= got
            .chunks(8)
            .enumerate()
            .all(|(i, c)| c == (t << 32 | i as u64).to_le_bytes());
    }
    let root = dev.mmu().active_root().ok_or("device not active")?;
    let tables = iommu.tables();
    if tables.codec().config.mesc {
        let scan = gmem_x86pt::mesc::scan(tables.codec(), tables.memory(), root.0, false);
        verified &= scan.stale == 0;
    }
    let s = dev.stats().mmu.sim;
    let translations = s.caches.l1.hits + s.caches.l1.misses;
    for r in regions {
        dev.unmap_buffer_region(&gm, r, MapFlags::empty(), None)
            .map_err(|x| e(&x))?;
    }
    let k = |n: u64| 1000.0 * n as f64 / translations.max(1) as f64;
    Ok(IommuRow {
        iotlb: which.into(),
        transfers,
        translations,
        iotlb_hit: s.caches.l2.hit_ratio(),
        walks_per_kilo_access: k(s.caches.walks),
        reads_per_kilo_access: k(s.caches.walk_reads),
        verified,
    })
}

/// Run the stream through the three IOTLB organisations.
///
/// # Errors
/// A machine, the IOMMU or a DMA failed.
pub fn run(quick: bool) -> Result<Vec<IommuRow>, String> {
    let (buffers, transfers) = if quick { (8, 32) } else { (32, 256) };
    ["stock", "base", "mesc"]
        .iter()
        .map(|w| run_one(w, buffers, transfers))
        .collect()
}

/// The rows as a table.
pub fn table(rows: &[IommuRow]) -> String {
    let mut s = String::from(
        "IOMMU, storage-style DMA stream (2 MiB transfers into long-lived 2 MiB buffers):\niotlb  transfers translations IOTLB-hit walks/1k reads/1k verified\n",
    );
    for r in rows {
        s += &format!(
            "{:<6} {:<9} {:<12} {:<9.3} {:<7.1} {:<8.1} {}\n",
            r.iotlb,
            r.transfers,
            r.translations,
            r.iotlb_hit,
            r.walks_per_kilo_access,
            r.reads_per_kilo_access,
            r.verified
        );
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn subregion_iotlb_entries_serve_the_stream_and_every_buffer_reads_back() {
        let stock = run_one("stock", 4, 8).unwrap();
        let base = run_one("base", 4, 8).unwrap();
        let mesc = run_one("mesc", 4, 8).unwrap();
        assert!(stock.verified && base.verified && mesc.verified);
        assert_eq!(stock.translations, mesc.translations);
        assert!(mesc.iotlb_hit > base.iotlb_hit + 0.5, "{base:?} {mesc:?}");
        assert!(
            mesc.walks_per_kilo_access < 0.6 * stock.walks_per_kilo_access,
            "{stock:?} {base:?} {mesc:?}"
        );
    }

    #[test]
    fn mesc_tables_need_the_locked_discipline() {
        let cpu = HostCpu::new(HostCpuConfig::default()).unwrap();
        let config = IommuConfig::default(); // reader-writer
        let f: gmem_iommu::CachesFn = Arc::new(|t: &Arc<IoTables>, _| {
            let view = Arc::new(IoView(t.clone()));
            DesignCaches::new(Design::Mesc, geometry(), view)
                .map(|c| Box::new(c) as Box<dyn TranslationCaches>)
        });
        assert!(matches!(
            Iommu::with_mesc(config, cpu.memory_map().clone(), f),
            Err(gmem_iommu::IommuError::MescNeedsLocked(Discipline::Rw))
        ));
    }
}
