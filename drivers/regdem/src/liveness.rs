//! Register liveness: backward dataflow over the blocks of a kernel.
//!
//! Works on any naming (physical registers here, virtual registers in the builder's
//! allocator): a [`Flow`] lists, per block and instruction, the names read and written.
//! A write kills a name; the result gives live-in/live-out sets per block, the names live
//! after every instruction, and the maximum number live at once — the lower bound on
//! registers that compaction (§3.3) aims at.

use crate::ir::Kernel;

/// A set of names as a bit vector.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Set(Vec<u64>);

impl Set {
    /// An empty set over `n` names.
    pub fn new(n: usize) -> Set {
        Set(vec![0; n.div_ceil(64)])
    }
    /// Insert `i`.
    pub fn insert(&mut self, i: usize) {
        self.0[i / 64] |= 1 << (i % 64);
    }
    /// Remove `i`.
    pub fn remove(&mut self, i: usize) {
        self.0[i / 64] &= !(1 << (i % 64));
    }
    /// Whether `i` is in the set.
    pub fn contains(&self, i: usize) -> bool {
        self.0.get(i / 64).is_some_and(|w| w & (1 << (i % 64)) != 0)
    }
    /// `self |= other`; returns whether anything changed.
    pub fn union(&mut self, other: &Set) -> bool {
        let mut changed = false;
        for (a, b) in self.0.iter_mut().zip(&other.0) {
            let n = *a | b;
            changed |= n != *a;
            *a = n;
        }
        changed
    }
    /// Number of members.
    pub fn len(&self) -> usize {
        self.0.iter().map(|w| w.count_ones() as usize).sum()
    }
    /// Whether the set is empty.
    pub fn is_empty(&self) -> bool {
        self.0.iter().all(|&w| w == 0)
    }
    /// Members in increasing order.
    pub fn iter(&self) -> impl Iterator<Item = usize> + '_ {
        self.0.iter().enumerate().flat_map(|(k, &w)| {
            (0..64)
                .filter(move |b| w & (1 << b) != 0)
                .map(move |b| k * 64 + b)
        })
    }
}

/// The reads and writes of a program, per block and instruction, plus its edges.
#[derive(Clone, Debug, Default)]
pub struct Flow {
    /// Number of names.
    pub names: usize,
    /// `blocks[b][i] = (reads, writes)`.
    pub blocks: Vec<Vec<(Vec<usize>, Vec<usize>)>>,
    /// Successors of each block.
    pub succs: Vec<Vec<usize>>,
}

impl Flow {
    /// The flow of a kernel over its physical registers (256 names).
    pub fn of_kernel(k: &Kernel) -> Flow {
        Flow {
            names: 256,
            blocks: k
                .blocks
                .iter()
                .map(|b| {
                    b.insts
                        .iter()
                        .map(|i| {
                            (
                                i.reads().into_iter().map(usize::from).collect(),
                                i.writes().into_iter().map(usize::from).collect(),
                            )
                        })
                        .collect()
                })
                .collect(),
            succs: (0..k.blocks.len()).map(|b| k.successors(b)).collect(),
        }
    }
}

/// The result of the analysis.
#[derive(Clone, Debug)]
pub struct Liveness {
    /// Live on entry to each block.
    pub live_in: Vec<Set>,
    /// Live on exit from each block.
    pub live_out: Vec<Set>,
    /// `live_after[b][i]`: live just after instruction `i` of block `b`.
    pub live_after: Vec<Vec<Set>>,
}

impl Liveness {
    /// Solve the dataflow equations for `f`.
    pub fn analyze(f: &Flow) -> Liveness {
        let nb = f.blocks.len();
        let mut live_in = vec![Set::new(f.names); nb];
        let mut live_out = vec![Set::new(f.names); nb];
        let mut changed = true;
        while changed {
            changed = false;
            for b in (0..nb).rev() {
                let mut out = Set::new(f.names);
                for &s in &f.succs[b] {
                    out.union(&live_in[s]);
                }
                let mut cur = out.clone();
                for (reads, writes) in f.blocks[b].iter().rev() {
                    for &w in writes {
                        cur.remove(w);
                    }
                    for &r in reads {
                        cur.insert(r);
                    }
                }
                changed |= live_out[b].union(&out);
                changed |= live_in[b].union(&cur);
            }
        }
        let live_after = (0..nb)
            .map(|b| {
                let mut cur = live_out[b].clone();
                let mut v = vec![Set::new(f.names); f.blocks[b].len()];
                for (i, (reads, writes)) in f.blocks[b].iter().enumerate().rev() {
                    v[i] = cur.clone();
                    for &w in writes {
                        cur.remove(w);
                    }
                    for &r in reads {
                        cur.insert(r);
                    }
                }
                v
            })
            .collect();
        Liveness {
            live_in,
            live_out,
            live_after,
        }
    }

    /// The most names live at once: at any block entry or just after any instruction,
    /// counting an instruction's destinations as live at its own position (a value is
    /// written even when never read).
    pub fn max_live(&self, f: &Flow) -> usize {
        let mut m = self.live_in.iter().map(Set::len).max().unwrap_or(0);
        for (b, blk) in f.blocks.iter().enumerate() {
            for (i, (_, writes)) in blk.iter().enumerate() {
                let mut s = self.live_after[b][i].clone();
                for &w in writes {
                    s.insert(w);
                }
                m = m.max(s.len());
            }
        }
        m
    }
}

/// The most physical registers of `k` live at once.
pub fn max_live(k: &Kernel) -> usize {
    let f = Flow::of_kernel(k);
    Liveness::analyze(&f).max_live(&f)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loop_carried_value_is_live_around_the_back_edge() {
        // b0: w0 ; b1: r0 w1 ; r1 w0 -> back to b1 ; b2: r0
        let f = Flow {
            names: 4,
            blocks: vec![
                vec![(vec![], vec![0])],
                vec![(vec![0], vec![1]), (vec![1], vec![0])],
                vec![(vec![0], vec![])],
            ],
            succs: vec![vec![1], vec![2, 1], vec![]],
        };
        let l = Liveness::analyze(&f);
        assert!(l.live_in[1].contains(0));
        assert!(l.live_out[1].contains(0));
        assert!(!l.live_in[1].contains(1));
        assert!(l.live_after[1][0].contains(1));
        assert!(!l.live_after[1][0].contains(0));
        assert_eq!(l.max_live(&f), 1);
    }
}
