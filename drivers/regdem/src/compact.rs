//! Register compaction (§3.3) with bank awareness (§3.4.1).
//!
//! After demotion the remaining registers leave gaps, and a kernel's register count is
//! its highest register number plus one, so the gaps must be squeezed out. The
//! *relocation space* has one slot per physical register; an aligned pair occupies two
//! slots as one unit (its halves never separate — breaking the alias would change what
//! the FP64 instructions read). Scanning upwards, every gap is filled by *shifting* the
//! next unit above it down. A pair cannot move to an odd gap; then it is *swapped* with
//! the single register just below the gap (the swap window grows downward from the gap
//! by the pair's size): the pair takes `gap-1, gap` and the single moves to `gap+1`.
//! Gaps therefore only remain at the end, and the register count reaches the number of
//! slots in use — the bound for any renaming, which is within alignment padding of the
//! maximum number of live registers for a tight allocation (the tests check both).
//!
//! Bank awareness: register `Rn` is in bank `n % 4`. When a single register fills a gap,
//! the scan prefers, among the next four units above the gap (a window the size of the
//! bank count), a single that was already in the gap's bank, so operand bank conflicts
//! the original schedule avoided are not reintroduced.

use crate::ir::{Kernel, Reg};

/// The outcome of compaction.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Compaction {
    /// `map[old] = new` for every register in use.
    pub map: Vec<Option<Reg>>,
    /// Registers per thread after compaction.
    pub registers: u32,
    /// Units moved by a shift.
    pub shifts: u32,
    /// Pair swaps performed.
    pub swaps: u32,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Unit {
    old: Reg,
    width: u8,
}

/// Compact the registers of `k` in place.
pub fn compact(k: &mut Kernel, bank_aware: bool) -> Compaction {
    let mut used = [false; 256];
    let mut pair = [false; 256];
    for i in k.insts() {
        for r in i.reads().into_iter().chain(i.writes()) {
            used[usize::from(r)] = true;
        }
        for r in i.pair_bases() {
            pair[usize::from(r)] = true;
        }
    }
    // Units in slot order.
    let mut slots: Vec<Option<usize>> = vec![None; 256];
    let mut units = Vec::new();
    let mut r = 0usize;
    while r < 255 {
        if pair[r] {
            units.push(Unit {
                old: r as Reg,
                width: 2,
            });
            slots[r] = Some(units.len() - 1);
            slots[r + 1] = Some(units.len() - 1);
            r += 2;
        } else {
            if used[r] {
                units.push(Unit {
                    old: r as Reg,
                    width: 1,
                });
                slots[r] = Some(units.len() - 1);
            }
            r += 1;
        }
    }
    let (mut shifts, mut swaps) = (0, 0);
    let mut g = 0usize;
    loop {
        while g < 256 && slots[g].is_some() {
            g += 1;
        }
        // Units strictly above the gap, in slot order (each once).
        let mut above = Vec::new();
        let mut j = g + 1;
        while j < 256 {
            if let Some(u) = slots[j] {
                above.push((j, u));
                j += usize::from(units[u].width);
            } else {
                j += 1;
            }
            if above.len() >= 4 {
                break;
            }
        }
        let Some(&(j0, u0)) = above.first() else {
            break;
        };
        let (j, u) = if bank_aware && units[u0].width == 1 {
            above
                .iter()
                .copied()
                .find(|&(_, u)| units[u].width == 1 && usize::from(units[u].old) % 4 == g % 4)
                .unwrap_or((j0, u0))
        } else {
            (j0, u0)
        };
        let w = usize::from(units[u].width);
        for s in slots.iter_mut().skip(j).take(w) {
            *s = None;
        }
        if w == 1 || g % 2 == 0 {
            for s in slots.iter_mut().skip(g).take(w) {
                *s = Some(u);
            }
            shifts += 1;
        } else {
            // Swap: the pair takes g-1..=g, the single below the gap moves to g+1.
            let single = slots[g - 1];
            slots[g - 1] = Some(u);
            slots[g] = Some(u);
            slots[g + 1] = single;
            swaps += 1;
        }
    }
    let mut map = vec![None; 256];
    let mut top = 0u32;
    let mut s = 0usize;
    while s < 256 {
        if let Some(u) = slots[s] {
            let unit = units[u];
            for k2 in 0..usize::from(unit.width) {
                map[usize::from(unit.old) + k2] = Some((s + k2) as Reg);
            }
            top = top.max((s + usize::from(unit.width)) as u32);
            s += usize::from(unit.width);
        } else {
            s += 1;
        }
    }
    let m = map.clone();
    for blk in &mut k.blocks {
        for inst in &mut blk.insts {
            inst.rename(&|r| m[usize::from(r)].unwrap_or(r));
        }
    }
    Compaction {
        map,
        registers: top,
        shifts,
        swaps,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ir::{Block, InputKind, Inst, Op, Src};

    fn kernel(insts: Vec<Inst>) -> Kernel {
        Kernel {
            name: "t".into(),
            blocks: vec![Block { insts }],
            threads_per_block: 32,
            grid_blocks: 1,
            static_shared: 0,
            spill_shared: 0,
            local_bytes: 0,
            global_words: 0,
            inputs: vec![],
            outputs: vec![],
            input_kind: InputKind::F32,
        }
    }

    #[test]
    fn shift_and_swap_close_every_gap_keeping_pairs_aligned() {
        // Used: R1 (single), R4:R5 (pair), R9 (single), R12:R13 (pair). Bound: 6.
        let mut k = kernel(vec![
            Inst::new(Op::Mov, Some(1), vec![Src::I(0)], 0),
            Inst::new(Op::DAdd, Some(4), vec![Src::R(12), Src::R(12)], 0),
            Inst::new(Op::Mov, Some(9), vec![Src::R(1)], 0),
        ]);
        let c = compact(&mut k, false);
        assert_eq!(c.registers, 6);
        assert_eq!(k.registers(), 6);
        k.validate().unwrap();
        // R1 -> R0 (shift), pair R4 -> odd gap 1 -> swap: pair at R0:R1, single at R2.
        assert!(c.swaps >= 1);
        for r in [4usize, 12] {
            assert_eq!(c.map[r].unwrap() % 2, 0);
        }
    }
}
