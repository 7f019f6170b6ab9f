//! The kernel's memory: where everything lives, the heap, the page-table frame pool
//! and the core's view of RAM.
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
use alloc::format;
use alloc::string::String;
use gmem_core::{DeviceMemory, FrameSource, MemError, PhysAddr, PAGE_SIZE};
use intrusive_collections::singly_linked_list::Link;
use intrusive_collections::{intrusive_adapter, SinglyLinkedList, UnsafeRef};
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

/// A pool of 4 KiB frames for page tables: a bump pointer and a free list threaded
/// through the free frames themselves (an `intrusive-collections` `SinglyLinkedList`
/// whose link is written at the start of each free frame: no memory of its own, no
/// allocation). It measured even with the hand-threaded list it replaced (the next
/// address in a free frame's first word): `cargo bench -p gmem-sim --bench intrusive`,
/// `frame_pool`, figures in README's dependency notes.
pub struct FramePool {
    state: spin::Mutex<PoolState>,
}

/// What a free frame of the pool holds at its start: the free list's link.
struct FreeFrame {
    link: Link,
}

intrusive_adapter!(FreeAdapter = UnsafeRef<FreeFrame>: FreeFrame { link: Link });

struct PoolState {
    next: u64,
    end: u64,
    start: u64,
    free: SinglyLinkedList<FreeAdapter>,
    in_use: u64,
}

// SAFETY: the list's `UnsafeRef`s are not `Send` because a `FreeFrame` (a `Cell` link)
// is not `Sync`: two threads could touch one frame's link. Here a free frame is reached
// only through this state: the pool holds the sole reference to each frame on its
// list (a holder gave the frame up in `free_frame`, and `alloc_frame` hands it out only
// after taking it off), and the state itself is only reached under the pool's lock. So
// moving the state moves every reference to its frames with it.
unsafe impl Send for PoolState {}

impl Drop for PoolState {
    fn drop(&mut self) {
        // The free frames are the range's: forget them without writing to them.
        self.free.fast_clear();
    }
}

impl FramePool {
    /// A pool over `[start, end)`.
    ///
    /// # Safety
    /// The range is page aligned, identity mapped (or paging is off) for as long as the
    /// pool is used, and used by nothing else.
    pub unsafe fn new(start: u64, end: u64) -> FramePool {
        FramePool {
            state: spin::Mutex::new(PoolState {
                next: start,
                end,
                start,
                free: SinglyLinkedList::new(FreeAdapter::NEW),
                in_use: 0,
            }),
        }
    }

    /// Frames handed out and not given back.
    pub fn in_use(&self) -> u64 {
        self.state.lock().in_use
    }

    /// Check the free list on real frames before anything else uses the pool: two
    /// frames filled with patterns and freed come back last-freed first, zeroed (the
    /// link the list wrote into them included), and the count of frames in use returns
    /// to where it was. Returns a line for the boot log.
    ///
    /// # Errors
    /// What went wrong: no frame, a different frame, a byte not zero, a wrong count.
    pub fn check_reuse(&self) -> Result<String, String> {
        let before = self.in_use();
        let take = || {
            self.alloc_frame()
                .ok_or_else(|| String::from("frame pool: no frame to check with"))
        };
        let (a, b) = (take()?, take()?);
        for (f, byte) in [(a, 0xa5u8), (b, 0x5a)] {
            // SAFETY: `f` was just handed out by this pool: identity mapped (`new`'s
            // contract) and ours until freed below.
            unsafe { core::ptr::write_bytes(f.as_u64() as *mut u8, byte, PAGE_SIZE as usize) };
        }
        self.free_frame(a);
        self.free_frame(b);
        let (b2, a2) = (take()?, take()?);
        if (a2, b2) != (a, b) {
            return Err(format!(
                "frame pool: freed {a} then {b}, got back {b2} then {a2} (not last-freed first)"
            ));
        }
        for f in [a2, b2] {
            // SAFETY: as above: a frame of this pool, handed out to us.
            let bytes =
                unsafe { core::slice::from_raw_parts(f.as_u64() as *const u8, PAGE_SIZE as usize) };
            if let Some(i) = bytes.iter().position(|&x| x != 0) {
                return Err(format!(
                    "frame pool: reused frame {f} holds {:#x} at byte {i}, not zero",
                    bytes[i]
                ));
            }
        }
        self.free_frame(a2);
        self.free_frame(b2);
        let after = self.in_use();
        if after != before {
            return Err(format!(
                "frame pool: {after} frames in use after the check, {before} before"
            ));
        }
        Ok(format!(
            "frame pool: 2 frames written, freed and handed out again last-freed first, \
             {} bytes verified zero, {before} in use before and after",
            2 * PAGE_SIZE
        ))
    }
}

// SAFETY: the pool's range is exclusively its own and identity mapped (`new`'s
// contract); a frame leaves the free list or the bump range once, zeroed, and comes back
// only through `free_frame`.
unsafe impl FrameSource for FramePool {
    fn alloc_frame(&self) -> Option<PhysAddr> {
        let mut s = self.state.lock();
        let f = if let Some(f) = s.free.pop_front() {
            UnsafeRef::into_raw(f) as u64
        } else if s.next < s.end {
            s.next += PAGE_SIZE;
            s.next - PAGE_SIZE
        } else {
            return None;
        };
        // SAFETY: `f` is a pool frame just taken off the free list or the bump range:
        // nobody else holds it, and it is identity mapped.
        unsafe { core::ptr::write_bytes(f as *mut u8, 0, PAGE_SIZE as usize) };
        s.in_use += 1;
        Some(PhysAddr::new(f))
    }

    fn free_frame(&self, frame: PhysAddr) {
        let f = frame.as_u64();
        let mut s = self.state.lock();
        if f < s.start || f >= s.next || !frame.is_page_aligned() {
            crate::println!("frame pool: ignoring free of foreign frame {frame}");
            return;
        }
        let p = f as *mut FreeFrame;
        // SAFETY: `f` is a page-aligned frame of the pool (identity mapped, `new`'s
        // contract) given back by its holder: it becomes the pool's, an unlinked
        // `FreeFrame` is written at its start, and it stays there, untouched by anyone
        // else, until `alloc_frame` takes it off the list.
        unsafe {
            core::ptr::write(p, FreeFrame { link: Link::new() });
            s.free.push_front(UnsafeRef::from_raw(p));
        }
        s.in_use -= 1;
    }
}

/// The core's view of RAM: direct access to the identity-mapped range it manages.
pub struct DirectRam {
    start: u64,
    end: u64,
}

impl DirectRam {
    /// Direct access to `[start, end)`.
    ///
    /// # Safety
    /// The range is identity mapped (or paging is off) whenever the core calls it, and
    /// only the core (through mappings it installs) uses that memory.
    pub const unsafe fn new(start: u64, end: u64) -> DirectRam {
        DirectRam { start, end }
    }

    fn check(&self, pa: PhysAddr, len: u64) -> Result<*mut u8, MemError> {
        let a = pa.as_u64();
        match a.checked_add(len) {
            Some(e) if a >= self.start && e <= self.end => Ok(a as *mut u8),
            _ => Err(MemError::OutOfRange { pa }),
        }
    }
}

impl DeviceMemory for DirectRam {
    fn zero(&self, pa: PhysAddr, len: u64) -> Result<(), MemError> {
        let p = self.check(pa, len)?;
        // SAFETY: `check` keeps `[pa, pa + len)` inside the managed range, which `new`'s
        // contract makes identity mapped and the core's alone.
        unsafe { core::ptr::write_bytes(p, 0, len as usize) };
        Ok(())
    }

    fn read(&self, pa: PhysAddr, buf: &mut [u8]) -> Result<(), MemError> {
        let p = self.check(pa, buf.len() as u64)?;
        // SAFETY: as in `zero`; `buf` is ordinary kernel memory, disjoint from the range.
        unsafe { core::ptr::copy_nonoverlapping(p, buf.as_mut_ptr(), buf.len()) };
        Ok(())
    }

    fn write(&self, pa: PhysAddr, buf: &[u8]) -> Result<(), MemError> {
        let p = self.check(pa, buf.len() as u64)?;
        // SAFETY: as in `read`.
        unsafe { core::ptr::copy_nonoverlapping(buf.as_ptr(), p, buf.len()) };
        Ok(())
    }
}
