//! The kernel's memory: the heap, the page-table frame pool and the core's view of RAM.
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

use alloc::format;
use alloc::string::String;
use gmem_core::{DeviceMemory, FrameSource, MemError, PhysAddr, PAGE_SIZE};
use intrusive_collections::singly_linked_list::Link;
use intrusive_collections::{intrusive_adapter, SinglyLinkedList, UnsafeRef};
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
