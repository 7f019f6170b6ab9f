//! [`FramePool`]: the kernels' pool of 4 KiB page-table frames.
//!
//! A bump pointer over a range of identity-mapped RAM and a free list threaded through
//! the free frames themselves: an `intrusive-collections` `SinglyLinkedList` whose link
//! is written at the start of each free frame, so the pool needs no memory of its own
//! and never allocates. It measured even with the hand-threaded list it replaced (the
//! next address in a free frame's first word): `cargo bench -p gmem-sim --bench
//! intrusive`, `frame_pool`, figures in README's dependency notes.

use alloc::format;
use alloc::string::String;
use core::fmt;
use gmem_core::{FrameSource, PhysAddr, PAGE_SIZE};
use intrusive_collections::singly_linked_list::Link;
use intrusive_collections::{intrusive_adapter, SinglyLinkedList, UnsafeRef};

/// Where the pool reports a free it ignores (a frame that is not one it handed out):
/// the kernel's console, one line per call, without the newline.
pub type Log = fn(fmt::Arguments<'_>);

/// A pool of 4 KiB frames for page tables over one identity-mapped range: frames come
/// from the free list (last freed first) or, when it is empty, from the untouched rest
/// of the range; each is zeroed when handed out.
pub struct FramePool {
    state: spin::Mutex<PoolState>,
    log: Log,
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
    /// A pool over `[start, end)`; a free of a frame it did not hand out is ignored and
    /// reported to `log`.
    ///
    /// # Safety
    /// The range is page aligned, identity mapped (or paging is off) for as long as the
    /// pool is used, and used by nothing else.
    pub unsafe fn new(start: u64, end: u64, log: Log) -> FramePool {
        FramePool {
            state: spin::Mutex::new(PoolState {
                next: start,
                end,
                start,
                free: SinglyLinkedList::new(FreeAdapter::NEW),
                in_use: 0,
            }),
            log,
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
            drop(s);
            (self.log)(format_args!(
                "frame pool: ignoring free of foreign frame {frame}"
            ));
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tests::Buffer;
    use core::cell::RefCell;
    use std::string::ToString;
    use std::vec::Vec;

    std::thread_local! {
        static LOGGED: RefCell<Vec<String>> = const { RefCell::new(Vec::new()) };
    }

    fn record(args: fmt::Arguments<'_>) {
        LOGGED.with(|l| l.borrow_mut().push(args.to_string()));
    }

    fn logged() -> Vec<String> {
        LOGGED.with(|l| core::mem::take(&mut *l.borrow_mut()))
    }

    /// A pool over `frames` frames of `buf` (which must outlive it).
    fn pool(buf: &Buffer, frames: u64) -> FramePool {
        assert!(frames * PAGE_SIZE <= buf.len());
        // SAFETY: the buffer is page aligned, ours alone, and outlives the pool; its
        // addresses stand for physical ones (identity mapping).
        unsafe { FramePool::new(buf.addr(), buf.addr() + frames * PAGE_SIZE, record) }
    }

    #[test]
    fn bump_frames_come_zeroed_in_order_until_the_range_ends() {
        let buf = Buffer::filled(3, 0xff);
        let p = pool(&buf, 3);
        let got: Vec<u64> = (0..3).map(|_| p.alloc_frame().unwrap().as_u64()).collect();
        let want: Vec<u64> = (0..3).map(|i| buf.addr() + i * PAGE_SIZE).collect();
        assert_eq!(got, want);
        assert!(
            buf.bytes().iter().all(|&b| b == 0),
            "a handed-out frame kept 0xff"
        );
        assert_eq!(p.in_use(), 3);
        assert_eq!(p.alloc_frame(), None);
        assert_eq!(p.in_use(), 3);
    }

    #[test]
    fn freed_frames_come_back_last_freed_first_and_zeroed() {
        let buf = Buffer::filled(2, 0);
        let p = pool(&buf, 2);
        let (a, b) = (p.alloc_frame().unwrap(), p.alloc_frame().unwrap());
        buf.fill(0x77);
        p.free_frame(a);
        p.free_frame(b);
        assert_eq!(p.in_use(), 0);
        assert_eq!(p.alloc_frame(), Some(b));
        assert_eq!(p.alloc_frame(), Some(a));
        assert_eq!(p.alloc_frame(), None);
        assert!(
            buf.bytes().iter().all(|&x| x == 0),
            "a reused frame kept bytes"
        );
        assert!(logged().is_empty());
    }

    #[test]
    fn foreign_frees_are_ignored_and_reported() {
        let buf = Buffer::filled(4, 0);
        let p = pool(&buf, 3);
        let a = p.alloc_frame().unwrap();
        let foreign = [
            PhysAddr::new(buf.addr() - PAGE_SIZE),     // below the range
            PhysAddr::new(a.as_u64() + 8),             // inside a frame, not aligned
            PhysAddr::new(buf.addr() + PAGE_SIZE),     // in range, never handed out
            PhysAddr::new(buf.addr() + 3 * PAGE_SIZE), // past the range
        ];
        for f in foreign {
            p.free_frame(f);
        }
        let want: Vec<String> = foreign
            .iter()
            .map(|f| format!("frame pool: ignoring free of foreign frame {f}"))
            .collect();
        assert_eq!(logged(), want);
        assert_eq!(p.in_use(), 1);
        // Nothing joined the free list: the next frames are the bump range's.
        assert_eq!(p.alloc_frame().unwrap().as_u64(), buf.addr() + PAGE_SIZE);
        assert_eq!(
            p.alloc_frame().unwrap().as_u64(),
            buf.addr() + 2 * PAGE_SIZE
        );
        assert_eq!(p.alloc_frame(), None);
    }

    #[test]
    fn check_reuse_passes_and_leaves_the_count() {
        let buf = Buffer::filled(4, 0);
        let p = pool(&buf, 4);
        let held = p.alloc_frame().unwrap();
        assert_eq!(
            p.check_reuse(),
            Ok(String::from(
                "frame pool: 2 frames written, freed and handed out again last-freed first, \
                 8192 bytes verified zero, 1 in use before and after"
            ))
        );
        assert_eq!(p.in_use(), 1);
        p.free_frame(held);
        assert_eq!(p.in_use(), 0);
    }

    #[test]
    fn check_reuse_fails_without_two_frames() {
        let buf = Buffer::filled(1, 0);
        let p = pool(&buf, 1);
        assert_eq!(
            p.check_reuse(),
            Err(String::from("frame pool: no frame to check with"))
        );
    }

    #[test]
    fn threads_never_share_a_frame() {
        const FRAMES: u64 = 16;
        let buf = Buffer::filled(FRAMES, 0);
        let p = pool(&buf, FRAMES);
        std::thread::scope(|s| {
            for t in 1..=4u8 {
                let p = &p;
                s.spawn(move || {
                    for _ in 0..500 {
                        let f = p.alloc_frame().expect("4 threads hold at most 8 of 16");
                        let g = p.alloc_frame().expect("4 threads hold at most 8 of 16");
                        for x in [f, g] {
                            // SAFETY: the pool handed `x` to this thread alone.
                            let bytes = unsafe {
                                core::slice::from_raw_parts_mut(
                                    x.as_u64() as *mut u8,
                                    PAGE_SIZE as usize,
                                )
                            };
                            assert!(bytes.iter().all(|&b| b == 0), "handed out unzeroed");
                            bytes.fill(t);
                        }
                        std::thread::yield_now();
                        for x in [f, g] {
                            // SAFETY: as above; still this thread's.
                            let bytes = unsafe {
                                core::slice::from_raw_parts(
                                    x.as_u64() as *const u8,
                                    PAGE_SIZE as usize,
                                )
                            };
                            assert!(bytes.iter().all(|&b| b == t), "another thread wrote {x}");
                        }
                        p.free_frame(g);
                        p.free_frame(f);
                    }
                });
            }
        });
        assert_eq!(p.in_use(), 0);
        assert!(logged().is_empty());
    }
}
