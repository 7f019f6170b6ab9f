//! The kernel's memory: where everything lives, the heap and the DMA arena. The
//! page-table frame pool and the core's view of RAM over these ranges are
//! `gmem-kernel-support`'s (`FramePool`, `DirectRam`), shared with the RISC-V kernel.
//!
//! Everything lives in one block of conventional memory the kernel takes from UEFI's
//! boot services before it exits them (`boot::allocate_pages`, `LOADER_DATA`), below
//! 4 GiB, where the CPU driver's global mappings identity-map it:
//!
//! ```text
//! block        heap            HEAP_BYTES   the core's tables (vmem arenas, logical page tables)
//!              page-table pool PT_FRAMES    frames the CPU driver and the VT-d domains build tables in
//!              (2 MiB aligned) gmem RAM     GMEM_BYTES   frames the core backs regions with
//!              (2 MiB aligned) DMA memory   DMA_BYTES    buffers, queues and VT-d structures (the kernel's)
//! ```

use gmem_core::PAGE_SIZE;
use linked_list_allocator::LockedHeap;

/// Bytes of kernel heap.
pub const HEAP_BYTES: u64 = 8 << 20;
/// Frames for page tables (the CPU's and the IOMMU's).
pub const PT_FRAMES: u64 = 1024;
/// Bytes of RAM registered with the core.
pub const GMEM_BYTES: u64 = 16 << 20;
/// Bytes of DMA memory the kernel keeps for itself (outside the core's RAM).
pub const DMA_BYTES: u64 = 12 << 20;
/// Bytes to ask UEFI for: the parts and their alignment slack.
pub const BLOCK_BYTES: u64 =
    HEAP_BYTES + PT_FRAMES * PAGE_SIZE + GMEM_BYTES + DMA_BYTES + (6 << 20);

#[global_allocator]
static HEAP: LockedHeap = LockedHeap::empty();

/// Where each part lives.
#[derive(Clone, Copy, Debug)]
pub struct Layout {
    /// The heap `[start, end)`.
    pub heap: (u64, u64),
    /// The page-table pool `[start, end)`.
    pub page_tables: (u64, u64),
    /// The RAM the core manages `[start, end)`.
    pub gmem: (u64, u64),
    /// The kernel's DMA memory `[start, end)`.
    pub dma: (u64, u64),
}

const fn align_up(v: u64, a: u64) -> u64 {
    (v + a - 1) & !(a - 1)
}

impl Layout {
    /// The layout inside `[start, start + BLOCK_BYTES)`.
    pub fn within(start: u64) -> Layout {
        let heap = (
            align_up(start, PAGE_SIZE),
            align_up(start, PAGE_SIZE) + HEAP_BYTES,
        );
        let page_tables = (heap.1, heap.1 + PT_FRAMES * PAGE_SIZE);
        let g = align_up(page_tables.1, 2 << 20);
        let gmem = (g, g + GMEM_BYTES);
        let dma = (gmem.1, gmem.1 + DMA_BYTES);
        Layout {
            heap,
            page_tables,
            gmem,
            dma,
        }
    }

    /// Hand the heap range to the allocator.
    ///
    /// # Safety
    /// Called once, before any allocation, with a layout inside memory the kernel owns
    /// and nothing else uses.
    pub unsafe fn init_heap(&self) {
        // SAFETY: the caller guarantees the range is unused RAM, handed over once.
        unsafe {
            HEAP.lock()
                .init(self.heap.0 as *mut u8, (self.heap.1 - self.heap.0) as usize)
        };
    }
}

/// Bytes of heap in use.
pub fn heap_used() -> usize {
    HEAP.lock().used()
}

/// A bump allocator over the kernel's DMA memory: buffers and queues that stay the
/// kernel's (the core maps them for devices with `region_map`, never owns them).
pub struct DmaArena {
    next: u64,
    end: u64,
}

impl DmaArena {
    /// An arena over `[start, end)`.
    ///
    /// # Safety
    /// The range is identity mapped for as long as the arena and what it hands out are
    /// used, and nothing else uses it.
    pub const unsafe fn new(start: u64, end: u64) -> DmaArena {
        DmaArena { next: start, end }
    }

    /// `bytes` (rounded up to 4 KiB) aligned to `align`, zeroed; `None` when exhausted.
    pub fn take(&mut self, bytes: u64, align: u64) -> Option<u64> {
        let at = align_up(self.next, align.max(PAGE_SIZE));
        let end = at.checked_add(align_up(bytes, PAGE_SIZE))?;
        if end > self.end {
            return None;
        }
        self.next = end;
        // SAFETY: `[at, end)` is inside the arena (identity mapped, the kernel's alone,
        // `new`'s contract) and handed out once.
        unsafe { core::ptr::write_bytes(at as *mut u8, 0, (end - at) as usize) };
        Some(at)
    }
}
