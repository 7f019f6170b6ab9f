//! The one frame-allocation entry of the core, per device memory (FreeBSD's
//! `vm_page_alloc` → `vm_reserv` → `vm_phys`): [`SpaceState::frames`] takes a
//! [`FrameAsk`] — which pages, how many frames, how aligned, who asks, what may be done
//! under pressure — and gives a [`FrameRun`] or an error. Behind it:
//! - **placement**: the driver's [`crate::DeviceMemory::frame_request`] (a required or
//!   preferred constraint, with a fallback class) and `frame_class` (the page-group
//!   class), asked once per allocation (`frame_placement`);
//! - **reservations and page groups**: runs up to a reservation's size go through the
//!   memory's superpage reservations (`DeviceInner::alloc_pages`), larger aligned
//!   blocks are one aligned run (`DeviceInner::alloc_frames`); a memory managed in page
//!   groups takes its frames from groups of the class (`alloc_placed`);
//! - **pressure**: under [`Pressure::Relieve`], the memory's oldest reservation is
//!   broken before anything is evicted, then pages are evicted to host memory
//!   (`SpaceState::evict_from`) until the frames fit.
//!
//! The fault path (zero-fill, migration), prefetch, migration of runs and eviction to
//! host memory all come here. Three allocations keep their own way, for a stated
//! reason: promotion's gather (`large`: it lands pages on their own reserved frames),
//! private frames (`private`: wired, placed by no driver request) and compaction
//! (`compact`: inside given frame windows).

use super::{SpaceInner, SpaceState};
use crate::addr::Vpn;
use crate::device::{DeviceInner, FrameRun};
use crate::error::MoveError;
use crate::flags::DevCaps;
use crate::handle::{DeviceId, SpaceId};
use crate::mmu::{Attrs, FramePlacement, FrameRequest};
use crate::physmem::{RunRequest, RESERVATION_PAGES};
use crate::space::Ctx;
use crate::stats::Counters;
use crate::sync::Arc;

/// Who asks for frames of some pages: what a [`crate::FrameRequest`] carries besides the
/// pages themselves.
#[derive(Clone, Copy)]
pub(crate) struct Requester {
    /// The faulting device; `None` for a KPI call or an eviction.
    pub device: Option<DeviceId>,
    /// The pages' attributes.
    pub attrs: Attrs,
}

/// What one call of [`SpaceState::frames`] asks for: `pages` frames aligned to
/// `align` pages for the pages of `space` from `vpn`, for `asker`, and what may be
/// done when none are free.
#[derive(Clone, Copy)]
pub(crate) struct FrameAsk {
    /// The space whose pages the frames back.
    pub space: SpaceId,
    /// The first of those pages.
    pub vpn: Vpn,
    /// Frames wanted.
    pub pages: u64,
    /// Their alignment, in pages (1, or `pages` for an aligned block).
    pub align: u64,
    /// Who asks (what the driver's [`FrameRequest`] names besides the pages).
    pub asker: Requester,
    /// What happens when no frames fit.
    pub pressure: Pressure,
}

impl FrameAsk {
    /// One frame for page `vpn`, relieving memory pressure to get it.
    #[inline(always)]
    pub(crate) fn page(space: SpaceId, vpn: Vpn, asker: Requester) -> FrameAsk {
        FrameAsk {
            space,
            vpn,
            pages: 1,
            align: 1,
            asker,
            pressure: Pressure::Relieve,
        }
    }

    /// A run of `pages` frames aligned to `align` pages, or nothing at once when none
    /// is free (the caller falls back to fewer pages).
    #[inline(always)]
    pub(crate) fn run(
        space: SpaceId,
        vpn: Vpn,
        pages: u64,
        align: u64,
        asker: Requester,
    ) -> FrameAsk {
        FrameAsk {
            space,
            vpn,
            pages,
            align,
            asker,
            pressure: Pressure::Fail,
        }
    }
}

/// What [`SpaceState::frames`] does when no frames fit.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Pressure {
    /// Fail at once: the caller has a fallback (a smaller run, pages one by one).
    Fail,
    /// Break the memory's oldest reservations, then evict pages to host memory,
    /// until the frames fit.
    Relieve,
}

impl SpaceState {
    /// The one frame-allocation entry of the core (FreeBSD's `vm_page_alloc` →
    /// `vm_reserv` → `vm_phys`): the frames `ask` wants in `dev`'s memory, placed where
    /// the driver says ([`crate::DeviceMemory::frame_request`] and `frame_class`),
    /// through the memory's superpage reservations or page groups, and — when
    /// `ask.pressure` is [`Pressure::Relieve`] — with the memory's oldest reservations
    /// broken and pages of `evict_in` evicted to host memory until they fit (`None`:
    /// nothing is evicted; host memory is never evicted from).
    ///
    /// The common case — one page, any frame will do, one is free — is inlined into
    /// the caller; everything else (another placement, a run, memory pressure)
    /// continues out of line, without repeating the attempt made here.
    ///
    /// # Errors
    /// [`MoveError::OutOfMemory`] when no frames fit (at once under
    /// [`Pressure::Fail`]); what eviction met otherwise.
    #[inline(always)]
    pub(crate) fn frames<'d>(
        &mut self,
        cx: &Ctx<'_>,
        evict_in: Option<&SpaceInner>,
        dev: &'d Arc<DeviceInner>,
        ask: FrameAsk,
    ) -> Result<FrameRun<'d>, MoveError> {
        if ask.pages == 1 && ask.pressure == Pressure::Relieve {
            let placed = frame_placement(dev, ask.space, ask.vpn, 1, ask.asker);
            let tried = matches!(placed.placement, FramePlacement::Any);
            if tried {
                // Any frame (the common answer): what `alloc_placed` does for it,
                // without passing the answer down.
                let req = RunRequest::page(ask.space, ask.vpn, None, placed.class);
                if let Some(run) = dev.alloc_pages(req) {
                    return Ok(run);
                }
            }
            return self.frames_placed(cx, evict_in, dev, ask, Some(placed));
        }
        self.frames_placed(cx, evict_in, dev, ask, None)
    }

    /// [`SpaceState::frames`] past its common case: `first` is the driver's answer
    /// when the common case asked already (it made the first attempt, and that
    /// failed, when the answer was [`FramePlacement::Any`]).
    #[inline(never)]
    fn frames_placed<'d>(
        &mut self,
        cx: &Ctx<'_>,
        evict_in: Option<&SpaceInner>,
        dev: &'d Arc<DeviceInner>,
        ask: FrameAsk,
        first: Option<Placed>,
    ) -> Result<FrameRun<'d>, MoveError> {
        let (placed, mut tried) = match first {
            Some(p) => (p, matches!(p.placement, FramePlacement::Any)),
            None => (
                frame_placement(dev, ask.space, ask.vpn, ask.pages, ask.asker),
                false,
            ),
        };
        loop {
            if !tried {
                let run = alloc_placed(
                    dev,
                    ask.pages,
                    ask.align,
                    ask.space,
                    ask.vpn,
                    placed,
                    cx.counters,
                );
                if let Some(run) = run {
                    return Ok(run);
                }
            }
            tried = false;
            if ask.pressure == Pressure::Fail {
                return Err(MoveError::OutOfMemory(dev.id));
            }
            // Memory pressure: break the oldest reservation before evicting anything.
            if dev.phys.lock().break_oldest_reservation() {
                Counters::add(&cx.counters.reservations_broken, 1);
                continue;
            }
            // Then the read copies the memory holds (`duplicate`): no write-back.
            if self.drop_oldest_copy_in(cx.counters, dev.id) {
                continue;
            }
            let Some(space) = evict_in else {
                return Err(MoveError::OutOfMemory(dev.id));
            };
            if dev.caps.contains(DevCaps::HOST) || !self.evict_from(cx, space, dev, ask.vpn)? {
                return Err(MoveError::OutOfMemory(dev.id));
            }
        }
    }
}

/// Where `dev`'s driver places the frames backing `pages` pages of `space` from
/// `vpn`, and their page-group class.
#[inline(always)]
pub(super) fn frame_placement(
    dev: &DeviceInner,
    space: SpaceId,
    vpn: Vpn,
    pages: u64,
    asker: Requester,
) -> Placed {
    let Some(memory) = dev.memory.as_ref() else {
        return Placed::default();
    };
    let request = FrameRequest {
        space,
        va: vpn.addr(),
        pages,
        attrs: asker.attrs,
        device: asker.device,
    };
    Placed {
        placement: memory.frame_request(&request),
        class: memory.frame_class(&request),
    }
}

/// A driver's answers for one allocation.
#[derive(Clone, Copy, Default)]
pub(super) struct Placed {
    pub placement: FramePlacement,
    pub class: u32,
}

/// `pages` frames of `dev` aligned to `align` pages, placed as the driver said: a
/// requirement is the only place, a preference is tried first and then any frame (of
/// the fallback class, for [`FramePlacement::PreferOrClass`]); a fallback is counted.
fn alloc_placed<'d>(
    dev: &'d Arc<DeviceInner>,
    pages: u64,
    align: u64,
    space: SpaceId,
    vpn: Vpn,
    placed: Placed,
    stats: &Counters,
) -> Option<FrameRun<'d>> {
    // Runs up to a reservation's size (unaligned, or aligned to themselves) go through
    // the memory's superpage reservations; larger aligned blocks are one aligned run.
    let reserved = pages <= RESERVATION_PAGES && (align == 1 || align == pages);
    let get = |limit: Option<crate::mmu::FrameConstraint>, class: u32| {
        let req = RunRequest {
            pages,
            align,
            space,
            vpn,
            limit,
            class,
        };
        if reserved {
            dev.alloc_pages(req)
        } else {
            dev.alloc_frames(req)
        }
    };
    let class = placed.class;
    let (prefer, otherwise) = match placed.placement {
        FramePlacement::Any => return get(None, class),
        FramePlacement::Require(c) => return get(Some(c), class),
        FramePlacement::Prefer(c) => (c, class),
        FramePlacement::PreferOrClass { prefer, class } => (prefer, class),
    };
    if let Some(run) = get(Some(prefer), class) {
        return Some(run);
    }
    let run = get(None, otherwise)?;
    Counters::add(&stats.placement_fallbacks, 1);
    Some(run)
}
