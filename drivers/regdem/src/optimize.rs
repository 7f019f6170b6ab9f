//! Post-spilling optimisations (§3.4.2), applied per basic block to the spill code the
//! demotion pass inserted (the pass is conservative: a load before every read, a store
//! after every write).
//!
//! 1. **Redundant demoted loads.** Track which demoted word each value register holds;
//!    a load of a word the register already holds is dropped.
//! 2. **Redundant demoted stores.** A store is dropped when the same word is stored again
//!    later in the block with no load of it in between.
//! 3. **Value-register substitution.** Registers that are dead throughout a block (by
//!    liveness) and in use elsewhere in the kernel serve as extra value registers there:
//!    each value's lifetime in the block gets the next register round-robin, so several
//!    demoted values can be in flight without raising the register count. (Single-word
//!    value registers only; an RDV pair stays as it is.)
//! 4. **Hoisting.** Each demoted load moves up as far as its value register is free and
//!    no store of the same word intervenes, so its latency overlaps earlier work; the
//!    barrier repair that follows then places its barrier and wait.

use crate::ir::{Kernel, Origin, Reg};
use crate::liveness::{Flow, Liveness};

/// Statistics of one optimisation run.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct OptStats {
    /// Loads removed.
    pub loads_removed: u32,
    /// Stores removed.
    pub stores_removed: u32,
    /// Value lifetimes moved to a substitute register.
    pub substituted: u32,
    /// Instructions the loads moved over in total.
    pub hoisted_over: u32,
}

/// Run all four optimisations on `k`; `value_regs` are the RDV registers and `rda` the
/// address register. Returns the substitute registers used (callers repair hazards on
/// them too).
pub fn optimize(k: &mut Kernel, value_regs: &[Reg], rda: Option<Reg>) -> Vec<Reg> {
    let mut st = OptStats::default();
    optimize_with_stats(k, value_regs, rda, &mut st)
}

/// [`optimize`], also reporting what it did.
pub fn optimize_with_stats(
    k: &mut Kernel,
    value_regs: &[Reg],
    rda: Option<Reg>,
    st: &mut OptStats,
) -> Vec<Reg> {
    remove_redundant_loads(k, value_regs, st);
    remove_redundant_stores(k, st);
    let temps = if value_regs.len() == 1 {
        substitute(k, value_regs[0], rda, st)
    } else {
        Vec::new()
    };
    hoist(k, st);
    temps
}

fn remove_redundant_loads(k: &mut Kernel, value_regs: &[Reg], st: &mut OptStats) {
    for blk in &mut k.blocks {
        let mut holds: Vec<(Reg, u16)> = Vec::new();
        let mut keep = Vec::with_capacity(blk.insts.len());
        for inst in blk.insts.drain(..) {
            match inst.origin {
                Origin::SpillLoad(w) => {
                    let v = inst.dst.unwrap_or(0);
                    if holds.contains(&(v, w)) {
                        st.loads_removed += 1;
                        continue;
                    }
                    holds.retain(|&(r, _)| r != v);
                    holds.push((v, w));
                }
                Origin::SpillStore(w) => {
                    let v = inst.reads().last().copied().unwrap_or(0);
                    holds.retain(|&(r, x)| x != w && r != v);
                    holds.push((v, w));
                }
                _ => {
                    for wr in inst.writes() {
                        if value_regs.contains(&wr) {
                            holds.retain(|&(r, _)| r != wr);
                        }
                    }
                }
            }
            keep.push(inst);
        }
        blk.insts = keep;
    }
}

fn remove_redundant_stores(k: &mut Kernel, st: &mut OptStats) {
    for blk in &mut k.blocks {
        let n = blk.insts.len();
        let mut drop = vec![false; n];
        for (p, d) in drop.iter_mut().enumerate() {
            let Origin::SpillStore(w) = blk.insts[p].origin else {
                continue;
            };
            for later in &blk.insts[p + 1..] {
                match later.origin {
                    Origin::SpillLoad(x) if x == w => break,
                    Origin::SpillStore(x) if x == w => {
                        *d = true;
                        break;
                    }
                    _ => {}
                }
            }
        }
        let mut i = 0;
        blk.insts.retain(|_| {
            let d = drop[i];
            i += 1;
            !d
        });
        st.stores_removed += drop.iter().filter(|&&d| d).count() as u32;
    }
}

fn substitute(k: &mut Kernel, rdv: Reg, rda: Option<Reg>, st: &mut OptStats) -> Vec<Reg> {
    let flow = Flow::of_kernel(k);
    let live = Liveness::analyze(&flow);
    let mut used = [false; 256];
    for i in k.insts() {
        for r in i.reads().into_iter().chain(i.writes()) {
            used[usize::from(r)] = true;
        }
    }
    let mut all_temps = Vec::new();
    for (b, blk) in k.blocks.iter_mut().enumerate() {
        let mut here = [false; 256];
        for i in &blk.insts {
            for r in i.reads().into_iter().chain(i.writes()) {
                here[usize::from(r)] = true;
            }
        }
        let temps: Vec<Reg> = (0..255u8)
            .filter(|&r| {
                let u = usize::from(r);
                used[u]
                    && !here[u]
                    && !live.live_in[b].contains(u)
                    && !live.live_out[b].contains(u)
                    && Some(r) != rda
                    && r != rdv
            })
            .take(3)
            .collect();
        if temps.is_empty() || !blk.insts.iter().any(|i| i.origin.is_spill()) {
            continue;
        }
        let pool: Vec<Reg> = std::iter::once(rdv).chain(temps.iter().copied()).collect();
        let mut next = 0usize;
        let mut current = rdv;
        for inst in &mut blk.insts {
            let reads_v = inst.reads().contains(&rdv);
            let writes_v = inst.dst == Some(rdv);
            if !reads_v && !writes_v {
                continue;
            }
            // Reads see the current lifetime's register; a write opens a new lifetime.
            let cur = current;
            let mut d = inst.dst;
            inst.dst = None;
            inst.rename(&|r| if r == rdv { cur } else { r });
            if writes_v {
                next = (next + 1) % pool.len();
                current = pool[next];
                if current != rdv {
                    st.substituted += 1;
                }
                d = Some(current);
            }
            inst.dst = d;
        }
        for t in temps {
            if !all_temps.contains(&t) {
                all_temps.push(t);
            }
        }
    }
    all_temps
}

fn hoist(k: &mut Kernel, st: &mut OptStats) {
    for blk in &mut k.blocks {
        let n = blk.insts.len();
        for p in 0..n {
            let Origin::SpillLoad(w) = blk.insts[p].origin else {
                continue;
            };
            let v = blk.insts[p].writes();
            let reads = blk.insts[p].reads();
            let mut q = p;
            while q > 0 {
                let above = &blk.insts[q - 1];
                let touches_v = above
                    .reads()
                    .into_iter()
                    .chain(above.writes())
                    .any(|r| v.contains(&r));
                let writes_addr = above.writes().iter().any(|r| reads.contains(r));
                let same_word = matches!(above.origin, Origin::SpillStore(x) if x == w);
                if touches_v || writes_addr || same_word || above.origin == Origin::Setup {
                    break;
                }
                q -= 1;
            }
            if q < p {
                let inst = blk.insts.remove(p);
                blk.insts.insert(q, inst);
                st.hoisted_over += (p - q) as u32;
            }
        }
    }
}
