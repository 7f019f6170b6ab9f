//! The configurations the experiment compares (CODA §6) and one run of a workload
//! under one of them.
//!
//! | config | placement | schedule |
//! |---|---|---|
//! | `fgp` | every object fine grain | round robin |
//! | `cgp` | every object coarse grain, 4 KiB pages round robin over the stacks | round robin |
//! | `fgp+aff` | fine grain | affinity |
//! | `ft-migrate` | fine grain, each page moved to the first SM's stack on its first near-data touch | affinity |
//! | `ft-oracle` | each page allocated in the stack of its first near-data toucher, known from a previous run of *this* input (an oracle, labelled so) | affinity |
//! | `coda` | the descriptor: affine stride or a profile of another input ([`plan`]) | affinity |
//!
//! Every configuration runs on a machine built from the same [`HbmConfig`] (so the
//! same bandwidths and SM model) and is priced by the same model ([`crate::cost`]).
//!
//! ## Why `ft-migrate` is triggered by the executor, not by the core's hint
//! The first-touch migration is triggered by the executor seeing an SM's first touch
//! of a page, and moved by [`HbmMachine::migrate_page`] (attributes + unmap through
//! the core, the next touch re-places the page). The core's remote-access hint
//! (`PlacementMode::RemoteAccess`: a second fault from an attached device that already
//! maps a page whose frame is not in its own memory migrates the page) cannot drive
//! it here without changing what the core means by "remote", for three reasons:
//! 1. **Locality is per chunk, the core's is per frame.** The core calls a mapping
//!    remote when the frame's registered memory is not the faulting device's. A
//!    fine-grain frame lives in all four stacks at once (128-byte chunks), so no
//!    split of the stacks into per-device memories makes that test true for exactly
//!    the accesses that cross the remote network.
//! 2. **A page group spans the stacks.** A group is four consecutive frames, one per
//!    stack (coarse: frame `i` wholly in stack `i`; fine: interleaved over all); the
//!    core keeps a group inside one registered memory with one class. Registering each
//!    stack as its own device memory would put every group across four memories,
//!    which the core's page groups (and the granularity rule "all frames free before
//!    a class change") do not allow.
//! 3. **The shared table removes the second fault.** The host and the SMs share one
//!    table (§4.2, the shared mode): once any unit maps a page, no SM faults on
//!    it again, so the "fault from a device that already maps it" never happens. The
//!    hint needs per-device (coherent) tables, and even then a mapped page only
//!    re-faults if the driver withdraws the mapping on purpose (an access counter the
//!    core has no interface for).
//!
//! Making it work would take a per-chunk notion of remoteness and page groups across
//! memories in `gmem-core` — a change of core semantics other drivers rely on — so the
//! trigger stays in the driver, and the report says so.

use crate::attrs::CodaAttrs;
use crate::config::HbmConfig;
use crate::exec::{blocks_per_stack, Exec, ExecOptions, ExecReport, Schedule};
use crate::machine::{HbmMachine, MachineError};
use crate::placement::{decide, decide_profiled, Launch, Profile};
use crate::workloads::{Descriptor, Object, Workload};
use gmem_core::{Region, PAGE_SIZE};
use std::collections::HashMap;
use std::vec::Vec;

/// A configuration of the experiment.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Config {
    /// Fine grain only.
    Fgp,
    /// Coarse grain only.
    Cgp,
    /// Fine grain with affinity scheduling.
    FgpAffinity,
    /// First touch by migration.
    FirstTouchMigrate,
    /// First-touch allocation, an oracle.
    FirstTouchOracle,
    /// CODA: descriptor placement + affinity scheduling.
    Coda,
}

impl Config {
    /// All, in report order.
    pub const ALL: [Config; 6] = [
        Config::Fgp,
        Config::Cgp,
        Config::FgpAffinity,
        Config::FirstTouchMigrate,
        Config::FirstTouchOracle,
        Config::Coda,
    ];

    /// The name in reports.
    pub fn name(self) -> &'static str {
        match self {
            Config::Fgp => "fgp",
            Config::Cgp => "cgp",
            Config::FgpAffinity => "fgp+aff",
            Config::FirstTouchMigrate => "ft-migrate",
            Config::FirstTouchOracle => "ft-oracle(oracle)",
            Config::Coda => "coda",
        }
    }

    /// The schedule of its near-data runs.
    pub fn schedule(self) -> Schedule {
        match self {
            Config::Fgp | Config::Cgp => Schedule::RoundRobin,
            _ => Schedule::Affinity,
        }
    }
}

/// The launch the placement descriptors are for.
pub fn launch_of(cfg: &HbmConfig, threads_per_block: u64) -> Launch {
    Launch {
        threads_per_block,
        blocks_per_stack: blocks_per_stack(cfg),
        stacks: cfg.stacks,
    }
}

/// CODA's placement of `objects` at `base`: from each object's descriptor only — the
/// affine expression, or for [`Descriptor::Profile`] the entry of `profiles` (taken on
/// another input); `None` there (no profile) means fine grain.
pub fn plan(
    cfg: &HbmConfig,
    objects: &[Object],
    base: &[u64],
    profiles: &[Option<Profile>],
) -> Vec<CodaAttrs> {
    objects
        .iter()
        .zip(base)
        .enumerate()
        .map(|(i, (o, &b))| match o.descriptor {
            Descriptor::Affine(ix, threads) => {
                decide(b, Some(ix.pattern(threads)), launch_of(cfg, threads))
            }
            Descriptor::Affine2(e1, t1, e2, t2) => {
                let x = decide(b, Some(e1.pattern(t1)), launch_of(cfg, t1));
                let y = decide(b, Some(e2.pattern(t2)), launch_of(cfg, t2));
                if x == y {
                    x
                } else {
                    CodaAttrs::FINE
                }
            }
            Descriptor::Shared => CodaAttrs::FINE,
            Descriptor::Profile => match profiles.get(i).and_then(|p| p.as_ref()) {
                Some(p) => decide_profiled(b, p, launch_of(cfg, 0)),
                None => CodaAttrs::FINE,
            },
        })
        .collect()
}

/// One run's result.
#[derive(Clone, Debug)]
pub struct RunResult {
    /// What the executor recorded.
    pub report: ExecReport,
    /// Whether the result matched the CPU reference.
    pub verified: bool,
    /// Coarse-grain frame requests that fell back to fine grain (the core's count).
    pub placement_fallbacks: u64,
    /// Page groups holding the objects' pages at the end, `(fine, coarse)`.
    pub groups: (u64, u64),
}

/// What a placement needs besides the workload.
#[derive(Clone, Debug, Default)]
pub struct Inputs {
    /// Per page number: the stack of its first near-data toucher (for the oracle).
    pub first_stack: HashMap<u64, u32>,
    /// Per object: a profile from another input (for CODA's profile descriptors).
    pub profiles: Vec<Option<Profile>>,
}

fn allocate(m: &HbmMachine, objects: &[Object]) -> Result<Vec<Region>, MachineError> {
    // Align each object to a whole round of chunks so that every run places alike.
    objects.iter().map(|o| m.alloc(o.bytes)).collect()
}

pub(crate) fn place_oracle(
    m: &HbmMachine,
    regions: &[Region],
    objects: &[Object],
    first: &HashMap<u64, u32>,
) -> Result<(), MachineError> {
    for (r, o) in regions.iter().zip(objects) {
        let start = r.start.as_u64() / PAGE_SIZE;
        let pages = o.bytes.div_ceil(PAGE_SIZE);
        let mut p = 0;
        while p < pages {
            let Some(&s) = first.get(&(start + p)) else {
                p += 1;
                continue;
            };
            let mut k = 1;
            while p + k < pages && first.get(&(start + p + k)) == Some(&s) {
                k += 1;
            }
            // Chunk of `k` pages whose grid puts this run in stack `s`.
            let va = (start + p) * PAGE_SIZE;
            let attrs = CodaAttrs::coarse(
                va - u64::from(s) * k * PAGE_SIZE,
                k * PAGE_SIZE,
                m.config().stacks,
            );
            if u64::from(attrs.chunk_pages) == k {
                m.set_attrs_range(*r, va, k * PAGE_SIZE, attrs)?;
            } else {
                for j in 0..k {
                    let at = va + j * PAGE_SIZE;
                    m.set_attrs_range(*r, at, PAGE_SIZE, m.page_in_stack(at, s))?;
                }
            }
            p += k;
        }
    }
    Ok(())
}

/// The page groups holding the objects' pages, by mode: `(fine, coarse)`.
fn groups_holding(m: &HbmMachine, regions: &[Region], objects: &[Object]) -> (u64, u64) {
    let mut fine = std::collections::HashSet::new();
    let mut coarse = std::collections::HashSet::new();
    let gb = m.config().group_bytes();
    for (r, o) in regions.iter().zip(objects) {
        for p in 0..o.bytes.div_ceil(PAGE_SIZE) {
            let Some(pa) = m.frame(r.start.as_u64() + p * PAGE_SIZE) else {
                continue;
            };
            match m.memory().granularity(pa) {
                Some(crate::decode::Granularity::Coarse) => coarse.insert(pa.as_u64() / gb),
                Some(crate::decode::Granularity::Fine) => fine.insert(pa.as_u64() / gb),
                None => false,
            };
        }
    }
    (fine.len() as u64, coarse.len() as u64)
}

/// Run `w` under `config` on a fresh machine of `cfg`; `host_side` runs the kernels
/// on the host instead of the SMs (same placement).
///
/// # Errors
/// A machine failure.
pub fn run(
    cfg: &HbmConfig,
    w: &dyn Workload,
    config: Config,
    host_side: bool,
    inputs: &Inputs,
) -> Result<RunResult, MachineError> {
    let m = HbmMachine::new(*cfg)?;
    let objects = w.objects();
    let regions = allocate(&m, &objects)?;
    let base: Vec<u64> = regions.iter().map(|r| r.start.as_u64()).collect();
    // The placement becomes the regions' attributes before the host's first touch.
    match config {
        Config::Fgp | Config::FgpAffinity | Config::FirstTouchMigrate => {}
        Config::Cgp => {
            for (r, &b) in regions.iter().zip(&base) {
                m.set_attrs(*r, CodaAttrs::coarse(b, PAGE_SIZE, cfg.stacks))?;
            }
        }
        Config::FirstTouchOracle => place_oracle(&m, &regions, &objects, &inputs.first_stack)?,
        Config::Coda => {
            for (r, a) in regions
                .iter()
                .zip(plan(cfg, &objects, &base, &inputs.profiles))
            {
                m.set_attrs(*r, a)?;
            }
        }
    }
    w.init(&m, &base)?;
    let opts = ExecOptions {
        schedule: if host_side {
            Schedule::Host
        } else {
            config.schedule()
        },
        migrate_on_first_touch: config == Config::FirstTouchMigrate && !host_side,
        profile: false,
    };
    let with_len: Vec<(Region, u64)> = regions
        .iter()
        .zip(&objects)
        .map(|(r, o)| (*r, o.bytes))
        .collect();
    let mut x = Exec::new(&m, opts, &with_len)?;
    w.run(&mut x, &base)?;
    let report = x.finish();
    let verified = w.verify(&m, &base)?;
    m.check_invariants()?;
    Ok(RunResult {
        report,
        verified,
        placement_fallbacks: m.stats().placement_fallbacks,
        groups: groups_holding(&m, &regions, &objects),
    })
}

/// Profiles of `w`'s objects taken on another input (fine grain, round robin): the
/// `(block, offset)` of every access, by object; `None` for objects that need none or
/// a workload without another input.
///
/// # Errors
/// A machine failure.
pub fn profiles(cfg: &HbmConfig, w: &dyn Workload) -> Result<Vec<Option<Profile>>, MachineError> {
    let objects = w.objects();
    let need = objects.iter().any(|o| o.descriptor == Descriptor::Profile);
    let Some(other) = w.other_input().filter(|_| need) else {
        return Ok(objects.iter().map(|_| None).collect());
    };
    let m = HbmMachine::new(*cfg)?;
    let oo = other.objects();
    let regions = allocate(&m, &oo)?;
    let base: Vec<u64> = regions.iter().map(|r| r.start.as_u64()).collect();
    other.init(&m, &base)?;
    let opts = ExecOptions {
        schedule: Schedule::RoundRobin,
        migrate_on_first_touch: false,
        profile: true,
    };
    let mut x = Exec::new(&m, opts, &[])?;
    other.run(&mut x, &base)?;
    let samples = x.finish().samples;
    Ok(oo
        .iter()
        .zip(&base)
        .map(|(o, &b)| {
            (o.descriptor == Descriptor::Profile).then(|| Profile {
                accesses: samples
                    .iter()
                    .filter(|&&(_, va)| va >= b && va < b + o.bytes)
                    .map(|&(blk, va)| (blk, va - b))
                    .collect(),
            })
        })
        .collect())
}
