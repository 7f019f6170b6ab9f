//! The graph workloads: BFS and PageRank over CSR graphs, uniform (every vertex the
//! same out-degree, random targets) or R-MAT (skewed degrees), each verified against a
//! CPU reference. A block owns [`crate::workloads::THREADS`] consecutive vertices; the
//! row offsets are indexed by an affine expression, the edge lists and the per-vertex
//! data gathered through them depend on the input — their descriptor is a profile
//! taken on *another* graph of the same kind ([`Workload::other_input`]).

use crate::exec::Exec;
use crate::machine::{HbmMachine, MachineError};
use crate::memory::Requester;
use crate::placement::AffineIndex;
use crate::workloads::{Class, Descriptor, Object, Rng, Workload, THREADS};
use std::boxed::Box;
use std::string::String;
use std::vec;
use std::vec::Vec;

/// A graph's shape.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GraphKind {
    /// Every vertex `degree` random out-edges.
    Uniform,
    /// R-MAT (a, b, c = 0.57, 0.19, 0.19).
    Rmat,
}

/// A CSR graph.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Csr {
    /// `n + 1` offsets into `cols`.
    pub offsets: Vec<u32>,
    /// Edge targets.
    pub cols: Vec<u32>,
}

impl Csr {
    /// A graph of `n` vertices (at least one; a power of two for R-MAT) and
    /// `degree × n` edges.
    pub fn generate(kind: GraphKind, n: u32, degree: u32, seed: u64) -> Csr {
        let n = n.max(1);
        let mut r = Rng(seed);
        let mut edges: Vec<(u32, u32)> = Vec::with_capacity((n * degree) as usize);
        match kind {
            GraphKind::Uniform => {
                for v in 0..n {
                    for _ in 0..degree {
                        edges.push((v, (r.next_u64() % u64::from(n)) as u32));
                    }
                }
            }
            GraphKind::Rmat => {
                let bits = 32 - (n.max(2) - 1).leading_zeros();
                for _ in 0..n * degree {
                    let (mut s, mut d) = (0u32, 0u32);
                    for _ in 0..bits {
                        let p = r.f32();
                        let (a, b) = match p {
                            p if p < 0.57 => (0, 0),
                            p if p < 0.76 => (0, 1),
                            p if p < 0.95 => (1, 0),
                            _ => (1, 1),
                        };
                        s = s << 1 | a;
                        d = d << 1 | b;
                    }
                    edges.push((s % n, d % n));
                }
                edges.sort_unstable();
            }
        }
        let mut offsets = vec![0u32; n as usize + 1];
        for &(s, _) in &edges {
            offsets[s as usize + 1] += 1;
        }
        for i in 0..n as usize {
            offsets[i + 1] += offsets[i];
        }
        Csr {
            offsets,
            cols: edges.into_iter().map(|(_, d)| d).collect(),
        }
    }

    /// Vertices.
    pub fn n(&self) -> u64 {
        self.offsets.len() as u64 - 1
    }
}

/// Which algorithm.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Algo {
    /// Level-synchronous BFS from vertex 0.
    Bfs,
    /// Pull PageRank (the edges are in-edges), this many iterations.
    PageRank(u32),
}

/// A graph workload.
pub struct GraphWork {
    /// The algorithm.
    pub algo: Algo,
    /// The graph's kind.
    pub kind: GraphKind,
    /// Vertices.
    pub n: u32,
    /// Edges per vertex (average).
    pub degree: u32,
    /// The input's seed.
    pub seed: u64,
    graph: Csr,
}

const UNVISITED: u32 = u32::MAX;
const HOST: Requester = Requester::Host;

impl GraphWork {
    /// The workload on a freshly generated graph (at least one vertex).
    pub fn new(algo: Algo, kind: GraphKind, n: u32, degree: u32, seed: u64) -> GraphWork {
        let n = n.max(1);
        GraphWork {
            algo,
            kind,
            n,
            degree,
            seed,
            graph: Csr::generate(kind, n, degree, seed),
        }
    }

    fn bfs_ref(&self) -> Vec<u32> {
        let g = &self.graph;
        let mut level = vec![UNVISITED; g.n() as usize];
        level[0] = 0;
        let mut cur = 0;
        loop {
            let mut changed = false;
            for v in 0..g.n() as usize {
                if level[v] != cur {
                    continue;
                }
                for &u in &g.cols[g.offsets[v] as usize..g.offsets[v + 1] as usize] {
                    if level[u as usize] == UNVISITED {
                        level[u as usize] = cur + 1;
                        changed = true;
                    }
                }
            }
            if !changed {
                return level;
            }
            cur += 1;
        }
    }

    fn out_degrees(&self) -> Vec<u32> {
        let mut d = vec![0u32; self.graph.n() as usize];
        for &u in &self.graph.cols {
            d[u as usize] += 1;
        }
        d
    }

    fn contrib(rank: f32, deg: u32) -> f32 {
        if deg == 0 {
            0.0
        } else {
            rank / deg as f32
        }
    }

    fn pr_ref(&self, iters: u32) -> Vec<f32> {
        let g = &self.graph;
        let n = g.n() as usize;
        let deg = self.out_degrees();
        let mut rank = vec![1.0 / n as f32; n];
        for _ in 0..iters {
            let c: Vec<f32> = rank
                .iter()
                .zip(&deg)
                .map(|(&r, &d)| Self::contrib(r, d))
                .collect();
            rank = (0..n)
                .map(|v| {
                    let s: f32 = g.cols[g.offsets[v] as usize..g.offsets[v + 1] as usize]
                        .iter()
                        .map(|&u| c[u as usize])
                        .sum();
                    0.15 / n as f32 + 0.85 * s
                })
                .collect();
        }
        rank
    }
}

fn per_vertex(n: u64) -> Descriptor {
    Descriptor::Affine(
        AffineIndex {
            block_coeff: THREADS as i64,
            thread_coeff: 1,
            loop_coeff: 0,
            loop_len: 1,
            elem_bytes: 4,
        },
        THREADS.min(n),
    )
}

impl Workload for GraphWork {
    fn name(&self) -> String {
        let a = match self.algo {
            Algo::Bfs => "bfs",
            Algo::PageRank(_) => "pagerank",
        };
        let k = match self.kind {
            GraphKind::Uniform => "uniform",
            GraphKind::Rmat => "rmat",
        };
        std::format!("{a}-{k}")
    }
    fn class(&self) -> Class {
        Class::Graph
    }
    fn objects(&self) -> Vec<Object> {
        let n = self.graph.n();
        let m = self.graph.cols.len() as u64;
        let mut o = vec![
            Object {
                name: "offsets",
                bytes: (n + 1) * 4,
                descriptor: per_vertex(n),
            },
            Object {
                name: "edges",
                bytes: m.max(1) * 4,
                descriptor: Descriptor::Profile,
            },
        ];
        match self.algo {
            Algo::Bfs => o.push(Object {
                name: "level",
                bytes: n * 4,
                descriptor: Descriptor::Profile,
            }),
            Algo::PageRank(_) => {
                o.push(Object {
                    name: "degree",
                    bytes: n * 4,
                    descriptor: per_vertex(n),
                });
                o.push(Object {
                    name: "contrib",
                    bytes: n * 4,
                    descriptor: Descriptor::Profile,
                });
                o.push(Object {
                    name: "rank",
                    bytes: n * 4,
                    descriptor: per_vertex(n),
                });
            }
        }
        o
    }
    fn init(&self, m: &HbmMachine, base: &[u64]) -> Result<(), MachineError> {
        let n = self.graph.n() as usize;
        m.store_u32s(HOST, base[0], &self.graph.offsets)?;
        m.store_u32s(HOST, base[1], &self.graph.cols)?;
        match self.algo {
            Algo::Bfs => {
                let mut level = vec![UNVISITED; n];
                level[0] = 0;
                m.store_u32s(HOST, base[2], &level)
            }
            Algo::PageRank(_) => {
                m.store_u32s(HOST, base[2], &self.out_degrees())?;
                m.store_f32s(HOST, base[4], &vec![1.0 / n as f32; n])
            }
        }
    }
    fn run(&self, x: &mut Exec<'_>, base: &[u64]) -> Result<(), MachineError> {
        let n = self.graph.n();
        let blocks = n.div_ceil(THREADS);
        match self.algo {
            Algo::Bfs => {
                let mut cur = 0u32;
                loop {
                    let mut changed = false;
                    x.launch(blocks, |c| {
                        let v0 = c.block() * THREADS;
                        let k = THREADS.min(n - v0) as usize;
                        let lv = c.load_u32s(base[2] + v0 * 4, k)?;
                        c.alu(k as u64); // compare each level with the frontier
                        for (i, &l) in lv.iter().enumerate() {
                            if l != cur {
                                continue;
                            }
                            let v = v0 + i as u64;
                            let off = c.load_u32s(base[0] + v * 4, 2)?;
                            let deg = (off[1] - off[0]) as usize;
                            let nbrs = c.load_u32s(base[1] + u64::from(off[0]) * 4, deg)?;
                            c.alu(nbrs.len() as u64); // compare each neighbour's level
                            for u in nbrs {
                                let at = base[2] + u64::from(u) * 4;
                                if c.load_u32(at)? == UNVISITED {
                                    c.store_u32s(at, &[cur + 1])?;
                                    changed = true;
                                }
                            }
                        }
                        Ok(())
                    })?;
                    if !changed {
                        return Ok(());
                    }
                    cur += 1;
                }
            }
            Algo::PageRank(iters) => {
                for _ in 0..iters {
                    x.launch(blocks, |c| {
                        let v0 = c.block() * THREADS;
                        let k = THREADS.min(n - v0) as usize;
                        let r = c.load_f32s(base[4] + v0 * 4, k)?;
                        let d = c.load_u32s(base[2] + v0 * 4, k)?;
                        let out: Vec<f32> = r
                            .iter()
                            .zip(&d)
                            .map(|(&r, &d)| Self::contrib(r, d))
                            .collect();
                        c.alu(k as u64); // one division per vertex
                        c.store_f32s(base[3] + v0 * 4, &out)
                    })?;
                    x.launch(blocks, |c| {
                        let v0 = c.block() * THREADS;
                        let k = THREADS.min(n - v0) as usize;
                        let off = c.load_u32s(base[0] + v0 * 4, k + 1)?;
                        let mut out = Vec::with_capacity(k);
                        for i in 0..k {
                            let deg = (off[i + 1] - off[i]) as usize;
                            let nbrs = c.load_u32s(base[1] + u64::from(off[i]) * 4, deg)?;
                            let mut s = 0f32;
                            for u in nbrs {
                                s += c.load_f32(base[3] + u64::from(u) * 4)?;
                            }
                            c.alu(deg as u64 + 2); // an add per edge, the damping
                            out.push(0.15 / n as f32 + 0.85 * s);
                        }
                        c.store_f32s(base[4] + v0 * 4, &out)
                    })?;
                }
                Ok(())
            }
        }
    }
    fn verify(&self, m: &HbmMachine, base: &[u64]) -> Result<bool, MachineError> {
        let n = self.graph.n() as usize;
        Ok(match self.algo {
            Algo::Bfs => m.load_u32s(HOST, base[2], n)? == self.bfs_ref(),
            Algo::PageRank(iters) => m.load_f32s(HOST, base[4], n)? == self.pr_ref(iters),
        })
    }
    fn other_input(&self) -> Option<Box<dyn Workload>> {
        Some(Box::new(GraphWork::new(
            self.algo,
            self.kind,
            self.n,
            self.degree,
            self.seed ^ 0x9e37_79b9,
        )))
    }
}
