//! The kernel's memory: where everything lives and the heap. The page-table frame pool
//! and the core's view of RAM over these ranges are `gmem-kernel-support`'s
//! (`FramePool`, `DirectRam`), shared with the x86 kernel.
//!
//! ```text
//! 0x8000_0000  OpenSBI (2 MiB, not ours)
//! 0x8020_0000  kernel image, then .bss (boot stack, statics)
//! __kernel_end heap            HEAP_BYTES   the core's tables (vmem arenas, logical page table)
//!              page-table pool PT_FRAMES    frames the Sv39 driver builds page tables in
//!              (2 MiB aligned) gmem RAM      GMEM_BYTES   frames the core backs regions with
//!              second memory   SECOND_BYTES the four-hart stress run's second memory
//!                                           (a device's, to migrate pages between)
//! 0x8800_0000  end of RAM
//! ```
//!
//! All of RAM is identity-mapped by the driver's global mappings, so the kernel reaches
//! a physical address at the same virtual address before and after paging is on.

use crate::board::{RAM_BASE, RAM_END};
use gmem_core::PAGE_SIZE;
use linked_list_allocator::LockedHeap;

/// Bytes of kernel heap.
pub const HEAP_BYTES: u64 = 8 << 20;
/// Frames for page tables.
pub const PT_FRAMES: u64 = 256;
/// Bytes of RAM registered with the core.
pub const GMEM_BYTES: u64 = 16 << 20;
/// Bytes of RAM registered as a second memory (a memory device's) for migrations.
pub const SECOND_BYTES: u64 = 4 << 20;

#[global_allocator]
static HEAP: LockedHeap = LockedHeap::empty();

extern "C" {
    static __kernel_end: u8;
}

/// Where each part lives.
#[derive(Clone, Copy, Debug)]
pub struct Layout {
    /// Kernel image and statics end here.
    pub kernel_end: u64,
    /// The heap `[start, end)`.
    pub heap: (u64, u64),
    /// The page-table pool `[start, end)`.
    pub page_tables: (u64, u64),
    /// The RAM the core manages `[start, end)`.
    pub gmem: (u64, u64),
    /// The second memory `[start, end)`.
    pub second: (u64, u64),
}

const fn align_up(v: u64, a: u64) -> u64 {
    (v + a - 1) & !(a - 1)
}

impl Layout {
    /// The layout after the kernel image, or `None` if it does not fit in RAM.
    pub fn compute() -> Option<Layout> {
        // Only the address of the linker-defined symbol is taken; the byte is never read.
        let end = core::ptr::addr_of!(__kernel_end) as u64;
        let heap = (
            align_up(end, PAGE_SIZE),
            align_up(end, PAGE_SIZE) + HEAP_BYTES,
        );
        let page_tables = (heap.1, heap.1 + PT_FRAMES * PAGE_SIZE);
        let g = align_up(page_tables.1, 2 << 20);
        let gmem = (g, g + GMEM_BYTES);
        let second = (gmem.1, gmem.1 + SECOND_BYTES);
        (end >= RAM_BASE && second.1 <= RAM_END).then_some(Layout {
            kernel_end: end,
            heap,
            page_tables,
            gmem,
            second,
        })
    }

    /// Hand the heap range to the allocator.
    ///
    /// # Safety
    /// Called once, before any allocation, with a layout from [`Layout::compute`]
    /// (memory nothing else uses).
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
