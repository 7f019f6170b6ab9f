//! Variant generation and evaluation: the experiment of the issue, minus printing.
//!
//! For a kernel, [`generate`] makes the candidate binaries the predictor chooses among:
//! the baseline allocation; for each reachable occupancy cliff below the baseline's
//! register count (at most two, each at least 32 registers — below 32 no cliff is left
//! for 256-thread blocks), nvcc-style spilling to local memory under a register cap,
//! those off-chip spills converted to shared memory (Hayes & Zhang's approach: the same
//! spill code, one more register for the shared-memory address, so the cap is one lower),
//! and RegDem under each of the three candidate strategies.
//!
//! [`evaluate`] runs every variant in the interpreter on random inputs (outputs must be
//! bit-identical to the baseline's, and the baseline must match the CPU reference),
//! times it in the cycle-level simulator (which also must reproduce the output and report
//! no poisoned read), predicts it, and records the predictor's choice and the exhaustive
//! best by simulated cycles.

use crate::demote::{self, DemoteError, Options, Space, Strategy};
use crate::interp;
use crate::ir::{IrError, Kernel, Op, Origin, Special, Src};
use crate::kernels::Bench;
use crate::occupancy::{max_registers_for_warps, occupancy, KernelResources, SmConfig};
use crate::predict;
use crate::sched::{self, AssignOptions, BarrierPolicy};
use crate::sim::{self, SimConfig};

/// What kind of binary a variant is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Kind {
    /// The allocation as built.
    Baseline,
    /// Register cap with spills to local memory (nvcc `--maxrregcount`).
    LocalCap,
    /// The capped binary's spills moved to shared memory.
    LocalToShared,
    /// RegDem with a candidate strategy.
    RegDem(Strategy),
}

/// One candidate binary.
#[derive(Clone, Debug)]
pub struct Variant {
    /// Name for reports, e.g. `regdem-loop@40`.
    pub name: String,
    /// Kind.
    pub kind: Kind,
    /// Target register count (none for the baseline).
    pub target: Option<u32>,
    /// The code.
    pub kernel: Kernel,
}

/// The register counts of the occupancy cliffs below `k`'s count: for each warp level
/// above the baseline's, the largest register count that reaches it (with the kernel's
/// own shared memory), nearest first, at most `max`, none below 32.
pub fn cliffs(k: &Kernel, sm: &SmConfig, max: usize) -> Vec<u32> {
    let res = KernelResources {
        threads_per_block: k.threads_per_block,
        registers_per_thread: k.registers(),
        shared_bytes_per_block: k.shared_bytes(),
    };
    let Ok(base) = occupancy(sm, &res) else {
        return Vec::new();
    };
    let mut out: Vec<u32> = Vec::new();
    let wpb = k.threads_per_block.div_ceil(sm.warp_size);
    let mut w = base.warps_per_sm + wpb;
    while w <= sm.max_warps() && out.len() < max {
        if let Some(r) = max_registers_for_warps(sm, &res, w) {
            if r < res.registers_per_thread && r >= 32 && !out.contains(&r) {
                out.push(r);
            }
        }
        w += wpb;
    }
    out
}

/// Move a local-memory demotion's spills to shared memory (Eq. 1 layout), adding an
/// address register above the current ones.
///
/// # Errors
/// [`DemoteError::SharedTooSmall`] if the spill area does not fit, or
/// [`DemoteError::Ir`] if `spill_words` exceeds the kernel's local memory, no register
/// is left for the address, or the result fails validation.
pub fn local_to_shared(k: &Kernel, spill_words: u32, sm: &SmConfig) -> Result<Kernel, DemoteError> {
    let mut out = k.clone();
    let rda =
        u8::try_from(out.registers()).map_err(|_| DemoteError::Ir(IrError::OutOfRegisters))?;
    let t = out.threads_per_block;
    let base_local = out
        .local_bytes
        .checked_sub(spill_words * 4)
        .ok_or(DemoteError::Ir(IrError::BadParameter))?;
    out.local_bytes = base_local;
    out.spill_shared = spill_words * t * 4;
    let needed = out.shared_bytes().div_ceil(sm.shared_alloc_unit) * sm.shared_alloc_unit;
    if needed > sm.max_shared_per_block {
        return Err(DemoteError::SharedTooSmall {
            needed,
            max: sm.max_shared_per_block,
        });
    }
    let s_align = out.static_shared.div_ceil(4) * 4;
    for inst in out.blocks.iter_mut().flat_map(|b| b.insts.iter_mut()) {
        let word = |off: u32| (off - base_local) / 4;
        match (inst.op, inst.origin) {
            (Op::Ldl, Origin::SpillLoad(_)) => {
                inst.op = Op::Lds;
                inst.srcs = vec![Src::R(rda)];
                inst.off = word(inst.off) * t * 4;
            }
            (Op::Stl, Origin::SpillStore(_)) => {
                inst.op = Op::Sts;
                let v = inst.srcs.first().copied().unwrap_or(Src::I(0));
                inst.srcs = vec![Src::R(rda), v];
                inst.off = word(inst.off) * t * 4;
            }
            _ => {}
        }
    }
    let mut s2r = crate::ir::Inst::new(Op::S2R(Special::Tid), Some(rda), vec![], 0);
    s2r.origin = Origin::Setup;
    let mut imad = crate::ir::Inst::new(
        Op::IMad,
        Some(rda),
        vec![Src::R(rda), Src::I(4), Src::I(s_align)],
        0,
    );
    imad.origin = Origin::Setup;
    out.blocks[0].insts.insert(0, imad);
    out.blocks[0].insts.insert(0, s2r);
    sched::fix_stalls(&mut out);
    sched::assign_barriers(
        &mut out,
        &AssignOptions {
            scope: &|r| r == rda,
            keep_existing: true,
            policy: BarrierPolicy::Tracker,
            broken_skip_spill_load_waits: false,
        },
    );
    out.validate().map_err(DemoteError::Ir)?;
    Ok(out)
}

/// All candidate binaries of `k` (the baseline first).
pub fn generate(k: &Kernel, sm: &SmConfig) -> Vec<Variant> {
    let mut v = vec![Variant {
        name: "baseline".into(),
        kind: Kind::Baseline,
        target: None,
        kernel: k.clone(),
    }];
    for t in cliffs(k, sm, 2) {
        if let Ok(d) = demote::demote(k, sm, &Options::local_cap(t)) {
            v.push(Variant {
                name: format!("nvcc-cap@{t}"),
                kind: Kind::LocalCap,
                target: Some(t),
                kernel: d.kernel,
            });
        }
        if let Ok(d) = demote::demote(k, sm, &Options::local_cap(t - 1)) {
            if let Ok(kk) = local_to_shared(&d.kernel, d.spill_words, sm) {
                v.push(Variant {
                    name: format!("cap-to-shared@{t}"),
                    kind: Kind::LocalToShared,
                    target: Some(t),
                    kernel: kk,
                });
            }
        }
        for s in Strategy::ALL {
            if let Ok(d) = demote::demote(k, sm, &Options::regdem(s, t)) {
                v.push(Variant {
                    name: format!("regdem-{}@{t}", s.name()),
                    kind: Kind::RegDem(s),
                    target: Some(t),
                    kernel: d.kernel,
                });
            }
        }
    }
    v
}

/// One evaluated variant.
#[derive(Clone, Debug, PartialEq)]
pub struct Row {
    /// Kernel name.
    pub kernel: String,
    /// Variant name.
    pub variant: String,
    /// Kind.
    pub kind: Kind,
    /// Registers per thread.
    pub registers: u32,
    /// Shared memory per block (static + demotion area), bytes.
    pub shared_bytes: u32,
    /// Local memory per thread, bytes.
    pub local_bytes: u32,
    /// Resident warps per SM.
    pub warps: u32,
    /// Occupancy fraction.
    pub occupancy: f64,
    /// Simulated cycles.
    pub cycles: u64,
    /// Baseline cycles / these cycles.
    pub speedup: f64,
    /// Predicted cycles.
    pub predicted_cycles: f64,
    /// Static spill instructions.
    pub spill_insts: u32,
    /// Bank conflicts (extra wavefronts) of spill accesses in the simulation.
    pub spill_bank_conflicts: u64,
    /// Poisoned reads in the simulation.
    pub poisoned: u64,
    /// Interpreter and simulator outputs bit-identical to the baseline's.
    pub verified: bool,
}

/// How much faster than the baseline the predictor must expect a variant to be before it
/// replaces the baseline: a smaller predicted gain is within the predictor's uncertainty
/// and the baseline stays. **Assumption** (issue 34), chosen after seeing the first
/// results: Eq. 2 takes its memory latencies from the compiler's fixed estimates
/// (GL_MEM_STALL = 200, SH_MEM_STALL = 24) and knows no bandwidth, so a gain of a few
/// percent is below what it can resolve. The report prints the outcome at 0 as well.
pub const PREDICTION_MARGIN: f64 = 0.03;

/// The predictor's choice among `predicted` cycles (index 0 is the baseline): the
/// fewest predicted cycles if that beats the baseline's by more than `margin`, else the
/// baseline.
pub fn choose(predicted: &[f64], margin: f64) -> usize {
    let Some(&base) = predicted.first() else {
        return 0;
    };
    let best = (0..predicted.len())
        .min_by(|&a, &b| predicted[a].total_cmp(&predicted[b]))
        .unwrap_or(0);
    if predicted[best] < base * (1.0 - margin) {
        best
    } else {
        0
    }
}

/// The occupancy-ceiling ablation of one kernel: the baseline binary run at the first
/// cliff's occupancy as if its registers fitted (an SM with a larger register file).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Ceiling {
    /// The cliff's register count.
    pub target_registers: u32,
    /// Resident warps reached.
    pub warps: u32,
    /// Simulated cycles.
    pub cycles: u64,
    /// Baseline cycles / these cycles: the most any variant at that cliff could gain.
    pub speedup: f64,
    /// The run's output is bit-identical to the baseline's and had no poisoned read.
    pub verified: bool,
}

/// The evaluation of one kernel.
#[derive(Clone, Debug, PartialEq)]
pub struct KernelResult {
    /// Kernel name.
    pub kernel: String,
    /// One row per variant, baseline first.
    pub rows: Vec<Row>,
    /// The variant with the fewest predicted cycles.
    pub predicted_best: String,
    /// The variant with the fewest simulated cycles.
    pub exhaustive_best: String,
    /// Speedup of the predictor's choice over the baseline.
    pub predicted_speedup: f64,
    /// Speedup of the exhaustive best over the baseline.
    pub best_speedup: f64,
    /// Speedup of the variant with the fewest predicted cycles, taken with no margin.
    pub unguarded_speedup: f64,
    /// The occupancy ceiling at the first cliff (none without a reachable cliff).
    pub ceiling: Option<Ceiling>,
    /// The baseline matches the CPU reference.
    pub reference_ok: bool,
}

/// Evaluate every variant of `bench` built with `grid` blocks, inputs from `seed`.
///
/// # Errors
/// A description of the first build, interpreter or simulator failure.
pub fn evaluate(
    bench: Bench,
    grid: u32,
    seed: u64,
    sm: &SmConfig,
    cfg: &SimConfig,
) -> Result<KernelResult, String> {
    let k = bench
        .build(grid)
        .map_err(|e| format!("{}: {e}", bench.name()))?;
    let g0 = interp::init_global(&k, seed);
    let want_ref = bench.reference(&k, &g0);
    let variants = generate(&k, sm);
    let mut rows = Vec::new();
    let mut base_out = None;
    let mut base_cycles = 0u64;
    for v in &variants {
        let mut g = g0.clone();
        interp::run(&v.kernel, &mut g).map_err(|e| format!("{} {}: {e}", k.name, v.name))?;
        let out = interp::outputs(&v.kernel, &g);
        let mut gs = g0.clone();
        let s = sim::simulate(&v.kernel, sm, cfg, &mut gs)
            .map_err(|e| format!("{} {}: {e}", k.name, v.name))?;
        let sim_out = interp::outputs(&v.kernel, &gs);
        let p =
            predict::predict(&v.kernel, sm).map_err(|e| format!("{} {}: {e}", k.name, v.name))?;
        if base_out.is_none() {
            base_out = Some(out.clone());
            base_cycles = s.cycles;
        }
        let verified = Some(&out) == base_out.as_ref() && sim_out == out && s.poisoned == 0;
        rows.push(Row {
            kernel: k.name.clone(),
            variant: v.name.clone(),
            kind: v.kind,
            registers: v.kernel.registers(),
            shared_bytes: v.kernel.shared_bytes(),
            local_bytes: v.kernel.local_bytes,
            warps: s.warps_per_sm,
            occupancy: f64::from(s.warps_per_sm) / f64::from(sm.max_warps()),
            cycles: s.cycles,
            speedup: base_cycles as f64 / s.cycles.max(1) as f64,
            predicted_cycles: p.cycles,
            spill_insts: v.kernel.insts().filter(|i| i.origin.is_spill()).count() as u32,
            spill_bank_conflicts: s.spill_bank_conflicts,
            poisoned: s.poisoned,
            verified,
        });
    }
    let pick = |key: &dyn Fn(&Row) -> f64| -> usize {
        (0..rows.len())
            .min_by(|&a, &b| key(&rows[a]).total_cmp(&key(&rows[b])))
            .unwrap_or(0)
    };
    let predicted: Vec<f64> = rows.iter().map(|r| r.predicted_cycles).collect();
    let pi = choose(&predicted, PREDICTION_MARGIN);
    let ui = choose(&predicted, 0.0);
    let bi = pick(&|r| r.cycles as f64);
    let ceiling = match cliffs(&k, sm, 1).first() {
        Some(&t) => Some(ceiling(
            &k,
            t,
            sm,
            cfg,
            &g0,
            (base_cycles, base_out.as_deref().unwrap_or(&[])),
        )?),
        None => None,
    };
    Ok(KernelResult {
        kernel: k.name.clone(),
        predicted_best: rows[pi].variant.clone(),
        exhaustive_best: rows[bi].variant.clone(),
        predicted_speedup: rows[pi].speedup,
        best_speedup: rows[bi].speedup,
        unguarded_speedup: rows[ui].speedup,
        ceiling,
        reference_ok: base_out.as_deref() == Some(&want_ref[..]),
        rows,
    })
}

/// Run `k` unchanged on an SM whose register file is just large enough that `k` reaches
/// the resident warps it would have with `target` registers (and its own shared memory);
/// `base` is the baseline's simulated cycles and output on the inputs `g0`.
///
/// # Errors
/// A description of an occupancy or simulator failure.
pub fn ceiling(
    k: &Kernel,
    target: u32,
    sm: &SmConfig,
    cfg: &SimConfig,
    g0: &[u32],
    base: (u64, &[u32]),
) -> Result<Ceiling, String> {
    let (base_cycles, base_out) = base;
    let res = |regs| KernelResources {
        threads_per_block: k.threads_per_block,
        registers_per_thread: regs,
        shared_bytes_per_block: k.shared_bytes(),
    };
    let want = occupancy(sm, &res(target))
        .map_err(|e| format!("{}: {e:?}", k.name))?
        .warps_per_sm;
    let step = sm.register_sub_partitions * sm.register_alloc_unit;
    let mut big = *sm;
    big.max_registers_per_block = u32::MAX / 2;
    while occupancy(&big, &res(k.registers()))
        .map_err(|e| format!("{}: {e:?}", k.name))?
        .warps_per_sm
        < want
    {
        if big.registers > 16 * sm.registers {
            return Err(format!("{}: ceiling of {want} warps unreachable", k.name));
        }
        big.registers += step;
    }
    let mut g = g0.to_vec();
    let s = sim::simulate(k, &big, cfg, &mut g).map_err(|e| format!("{} ceiling: {e}", k.name))?;
    Ok(Ceiling {
        target_registers: target,
        warps: s.warps_per_sm,
        cycles: s.cycles,
        speedup: base_cycles as f64 / s.cycles.max(1) as f64,
        verified: interp::outputs(k, &g) == base_out && s.poisoned == 0,
    })
}

/// An ablation: RegDem at the first cliff with one mechanism switched off.
#[derive(Clone, Debug, PartialEq)]
pub struct Ablation {
    /// Kernel name.
    pub kernel: String,
    /// Which configuration.
    pub config: &'static str,
    /// Registers per thread.
    pub registers: u32,
    /// Resident warps.
    pub warps: u32,
    /// Simulated cycles.
    pub cycles: u64,
    /// Cycles consumers of spill loads were held by barrier waits (simulated).
    pub spill_barrier_stall: u64,
    /// Outputs bit-identical to the baseline's.
    pub verified: bool,
}

/// RegDem (loop-weighted, first cliff) in full and without compaction, without the
/// barrier tracker (every spill access on barrier 0), and without the §3.4.2
/// optimisations.
///
/// # Errors
/// A description of the first failure (no cliff, demotion error, simulator error).
pub fn ablations(
    bench: Bench,
    grid: u32,
    seed: u64,
    sm: &SmConfig,
    cfg: &SimConfig,
) -> Result<Vec<Ablation>, String> {
    let k = bench.build(grid).map_err(|e| e.to_string())?;
    let t = *cliffs(&k, sm, 1)
        .first()
        .ok_or_else(|| format!("{}: no cliff below {} registers", k.name, k.registers()))?;
    let g0 = interp::init_global(&k, seed);
    let mut g = g0.clone();
    interp::run(&k, &mut g).map_err(|e| e.to_string())?;
    let want = interp::outputs(&k, &g);
    let full = Options::regdem(Strategy::LoopWeighted, t);
    let configs: [(&'static str, Options); 4] = [
        ("regdem", full),
        (
            "no-compaction",
            Options {
                compact: false,
                ..full
            },
        ),
        (
            "no-barrier-tracker",
            Options {
                barrier_policy: BarrierPolicy::Fixed(0),
                ..full
            },
        ),
        (
            "no-optimisations",
            Options {
                optimize: false,
                ..full
            },
        ),
    ];
    let mut out = Vec::new();
    for (name, o) in configs {
        let d = demote::demote(&k, sm, &o).map_err(|e| format!("{name}: {e}"))?;
        debug_assert_eq!(o.space, Space::Shared);
        let mut g = g0.clone();
        let s = sim::simulate(&d.kernel, sm, cfg, &mut g).map_err(|e| format!("{name}: {e}"))?;
        out.push(Ablation {
            kernel: k.name.clone(),
            config: name,
            registers: d.kernel.registers(),
            warps: s.warps_per_sm,
            cycles: s.cycles,
            spill_barrier_stall: s.spill_barrier_stall_cycles,
            verified: interp::outputs(&d.kernel, &g) == want && s.poisoned == 0,
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn choose_keeps_the_baseline_when_the_predicted_gain_is_within_the_margin() {
        assert_eq!(choose(&[100.0, 98.0, 99.0], 0.03), 0);
        assert_eq!(choose(&[100.0, 98.0, 99.0], 0.0), 1);
        assert_eq!(choose(&[100.0, 90.0, 95.0], 0.03), 1);
        assert_eq!(choose(&[100.0, 120.0], 0.0), 0);
        assert_eq!(choose(&[], 0.03), 0);
    }

    #[test]
    fn ceiling_runs_the_baseline_at_the_cliffs_occupancy_with_the_same_output() {
        let sm = SmConfig::maxwell();
        let cfg = SimConfig::maxwell();
        let bench = Bench::Gather {
            coeffs: 32,
            trips: 1,
        };
        let k = bench.build(2).unwrap();
        let t = cliffs(&k, &sm, 1)[0];
        let g0 = interp::init_global(&k, 3);
        let mut g = g0.clone();
        let s = sim::simulate(&k, &sm, &cfg, &mut g).unwrap();
        let out = interp::outputs(&k, &g);
        let c = ceiling(&k, t, &sm, &cfg, &g0, (s.cycles, &out)).unwrap();
        assert!(
            c.warps > s.warps_per_sm,
            "{} vs {}",
            c.warps,
            s.warps_per_sm
        );
        assert!(c.verified);
        assert_eq!(c.target_registers, t);
    }
}
