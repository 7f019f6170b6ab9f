//! Graph workloads on seeded synthetic graphs: Rodinia-style level-synchronous BFS and
//! pull PageRank, on uniform random graphs and R-MAT graphs (a = 0.57, b = c = 0.19,
//! the Graph500 parameters).
//!
//! Both are data-dependent: a lane's next address comes from a value it loaded (its
//! edge range, then each neighbour), lanes of a warp have different degrees so the
//! warp runs until its longest lane is done with the others masked off. Those loads
//! block ([`Op::Load`]); the two ends of a node's edge range do not depend on each
//! other, so both issue before either is used ([`Op::LoadTo`], then [`Op::Wait`]).

use super::spec::{Affine, Spec, SpecKernel, MAX_OPS};
use super::{max_rel_error, Outcome, Size};
use crate::engine::RunStats;
use crate::kernel::{Kernel, Op, WarpIo, WarpProgram};
use crate::machine::SimtMachine;
use crate::occupancy::KernelResources;

/// A graph in compressed sparse rows.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Csr {
    /// `row[v]..row[v+1]` index `col` for node `v`.
    pub row: Vec<u32>,
    /// Neighbours.
    pub col: Vec<u32>,
}

impl Csr {
    /// Nodes.
    pub fn nodes(&self) -> usize {
        self.row.len() - 1
    }

    fn from_edges(n: usize, edges: &[(u32, u32)]) -> Csr {
        let mut row = vec![0u32; n + 1];
        for &(u, _) in edges {
            row[u as usize + 1] += 1;
        }
        for i in 0..n {
            row[i + 1] += row[i];
        }
        let mut fill = row.clone();
        let mut col = vec![0u32; edges.len()];
        for &(u, v) in edges {
            col[fill[u as usize] as usize] = v;
            fill[u as usize] += 1;
        }
        Csr { row, col }
    }

    /// The reversed graph.
    pub fn transpose(&self) -> Csr {
        let mut edges = Vec::with_capacity(self.col.len());
        for u in 0..self.nodes() {
            for e in self.row[u]..self.row[u + 1] {
                edges.push((self.col[e as usize], u as u32));
            }
        }
        Csr::from_edges(self.nodes(), &edges)
    }
}

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// A uniform random graph: `2^scale` nodes, `degree` random out-edges each.
pub fn uniform(scale: u32, degree: u32, seed: u64) -> Csr {
    let n = 1usize << scale;
    let mut r = Rng(seed | 1);
    let mut edges = Vec::with_capacity(n * degree as usize);
    for u in 0..n {
        for _ in 0..degree {
            edges.push((u as u32, (r.next() % n as u64) as u32));
        }
    }
    Csr::from_edges(n, &edges)
}

/// An R-MAT graph: `2^scale` nodes, `degree × 2^scale` edges.
pub fn rmat(scale: u32, degree: u32, seed: u64) -> Csr {
    let n = 1usize << scale;
    let mut r = Rng(seed | 1);
    let (a, b, c) = (0.57, 0.19, 0.19);
    let mut edges = Vec::with_capacity(n * degree as usize);
    for _ in 0..n * degree as usize {
        let (mut u, mut v) = (0u32, 0u32);
        for bit in (0..scale).rev() {
            let p = r.unit();
            let (du, dv) = if p < a {
                (0, 0)
            } else if p < a + b {
                (0, 1)
            } else if p < a + b + c {
                (1, 0)
            } else {
                (1, 1)
            };
            u |= du << bit;
            v |= dv << bit;
        }
        edges.push((u, v));
    }
    Csr::from_edges(n, &edges)
}

fn scale(size: Size) -> u32 {
    match size {
        Size::Quick => 14,
        Size::Medium => 16,
        Size::Full => 18,
    }
}

const DEGREE: u32 = 8;

/// Bytes a graph workload allocates at `size`.
pub fn bytes(size: Size) -> u64 {
    let n = 1u64 << scale(size);
    (2 * (n + 1) + 2 * n * u64::from(DEGREE) + 4 * n) * 4
}

const UNVISITED: u32 = u32::MAX;

#[derive(Clone, Copy)]
enum Mode {
    /// Expand nodes at this level.
    Bfs { level: u32, levels: u64, flag: u64 },
    /// Sum `contrib[u]` over in-neighbours, store `base + damping * sum`.
    Pull { contrib: u64, out: u64, base: f32 },
}

struct Gather {
    n: u64,
    row: u64,
    col: u64,
    mode: Mode,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Step {
    Level,
    Begin,
    End,
    EndsWait,
    Ends,
    Edge,
    Target,
    Visit,
    Flag,
    Store,
    Done,
}

struct GatherWarp {
    g: Gather,
    base: u64,
    live: u32,
    step: Step,
    beg: [u32; 32],
    end: [u32; 32],
    nbr: [u32; 32],
    acc: [f32; 32],
    hits: u32,
}

/// PageRank's damping factor.
pub const DAMPING: f32 = 0.85;

/// `1 / out-degree` of every node (0 without out-edges): PageRank's per-node factor.
pub fn inv_out_degree(g: &Csr) -> Vec<f32> {
    (0..g.nodes())
        .map(|u| {
            let d = g.row[u + 1] - g.row[u];
            if d == 0 {
                0.0
            } else {
                1.0 / d as f32
            }
        })
        .collect()
}

/// `iters` iterations of pull PageRank from rank `1/n` (the CPU reference): `t` is the
/// transposed graph (in-edges), `inv` is [`inv_out_degree`] of the graph; each
/// iteration sums `rank[u] · inv[u]` over in-edges in edge order.
pub fn pagerank_ref(t: &Csr, inv: &[f32], iters: u32) -> Vec<f32> {
    let n = t.nodes();
    let base = (1.0 - DAMPING) / n as f32;
    let mut rank = vec![1.0 / n as f32; n];
    for _ in 0..iters {
        let c: Vec<f32> = rank.iter().zip(inv).map(|(r, i)| r * i).collect();
        rank = (0..n)
            .map(|v| {
                let mut s = 0f32;
                for e in t.row[v]..t.row[v + 1] {
                    s += c[t.col[e as usize] as usize];
                }
                base + DAMPING * s
            })
            .collect();
    }
    rank
}

impl Kernel for Gather {
    type Warp = GatherWarp;
    fn blocks(&self) -> u64 {
        self.n.div_ceil(256)
    }
    fn resources(&self) -> KernelResources {
        KernelResources {
            threads_per_block: 256,
            registers_per_thread: 24,
            shared_bytes_per_block: 0,
        }
    }
    fn warp(&self, block: u64, warp: u32) -> GatherWarp {
        let base = block * 256 + u64::from(warp) * 32;
        let live = (0..32u32)
            .filter(|&l| base + u64::from(l) < self.n)
            .fold(0, |m, l| m | 1 << l);
        GatherWarp {
            g: Gather { ..*self },
            base,
            live,
            step: match self.mode {
                Mode::Bfs { .. } => Step::Level,
                Mode::Pull { .. } => Step::Begin,
            },
            beg: [0; 32],
            end: [0; 32],
            nbr: [0; 32],
            acc: [0.0; 32],
            hits: 0,
        }
    }
}

impl GatherWarp {
    fn pending(&self) -> u32 {
        (0..32)
            .filter(|&l| self.live & (1 << l) != 0 && self.beg[l] < self.end[l])
            .fold(0, |m, l| m | 1 << l)
    }
}

impl WarpProgram for GatherWarp {
    fn next(&mut self, io: &mut WarpIo) -> Op {
        let (g, base) = (&self.g, self.base);
        loop {
            match self.step {
                Step::Level => {
                    let Mode::Bfs { levels, .. } = g.mode else {
                        unreachable!("BFS step")
                    };
                    let live = self.live;
                    if !io
                        .lanes(|l| (live & (1 << l) != 0).then_some(levels + 4 * (base + l as u64)))
                    {
                        self.step = Step::Done;
                        continue;
                    }
                    self.step = Step::Begin;
                    return Op::Load;
                }
                Step::Begin => {
                    if let Mode::Bfs { level, .. } = g.mode {
                        // Keep the lanes whose node is on the frontier.
                        let mut keep = 0;
                        for l in 0..32 {
                            if io.active(l) && io.value[l] == level {
                                keep |= 1 << l;
                            }
                        }
                        self.live = keep;
                    }
                    let live = self.live;
                    if !io
                        .lanes(|l| (live & (1 << l) != 0).then_some(g.row + 4 * (base + l as u64)))
                    {
                        self.step = Step::Done;
                        continue;
                    }
                    self.step = Step::End;
                    return Op::LoadTo(0);
                }
                Step::End => {
                    let live = self.live;
                    io.lanes(|l| {
                        (live & (1 << l) != 0).then_some(g.row + 4 * (base + l as u64 + 1))
                    });
                    self.step = Step::EndsWait;
                    return Op::LoadTo(1);
                }
                Step::EndsWait => {
                    self.step = Step::Ends;
                    return Op::Wait;
                }
                Step::Ends => {
                    for l in 0..32 {
                        if self.live & (1 << l) != 0 {
                            self.beg[l] = io.regs[0][l];
                            self.end[l] = io.regs[1][l];
                        }
                    }
                    self.step = Step::Edge;
                }
                Step::Edge => {
                    let p = self.pending();
                    if p == 0 {
                        self.step = Step::Store;
                        continue;
                    }
                    let beg = self.beg;
                    io.lanes(|l| (p & (1 << l) != 0).then_some(g.col + 4 * u64::from(beg[l])));
                    self.step = Step::Target;
                    return Op::Load;
                }
                Step::Target => {
                    for l in 0..32 {
                        if io.active(l) {
                            self.nbr[l] = io.value[l];
                            self.beg[l] += 1;
                        }
                    }
                    let nbr = self.nbr;
                    let at = match g.mode {
                        Mode::Bfs { levels, .. } => levels,
                        Mode::Pull { contrib, .. } => contrib,
                    };
                    let mask = io.mask;
                    io.lanes(|l| (mask & (1 << l) != 0).then_some(at + 4 * u64::from(nbr[l])));
                    self.step = Step::Visit;
                    return Op::Load;
                }
                Step::Visit => {
                    match g.mode {
                        Mode::Bfs { level, .. } => {
                            let mut fresh = 0u32;
                            for l in 0..32 {
                                if io.active(l) && io.value[l] == UNVISITED {
                                    fresh |= 1 << l;
                                }
                            }
                            self.hits = fresh;
                            if fresh != 0 {
                                let Mode::Bfs { levels, .. } = g.mode else {
                                    unreachable!()
                                };
                                let nbr = self.nbr;
                                io.lanes(|l| {
                                    (fresh & (1 << l) != 0)
                                        .then_some(levels + 4 * u64::from(nbr[l]))
                                });
                                io.value = [level + 1; 32];
                                self.step = Step::Flag;
                                return Op::Store;
                            }
                        }
                        Mode::Pull { .. } => {
                            for l in 0..32 {
                                if io.active(l) {
                                    self.acc[l] += io.f32(l);
                                }
                            }
                        }
                    }
                    self.step = Step::Edge;
                    return Op::Compute(2);
                }
                Step::Flag => {
                    let Mode::Bfs { flag, .. } = g.mode else {
                        unreachable!()
                    };
                    let hits = self.hits;
                    io.lanes(|l| (hits & (1 << l) != 0).then_some(flag));
                    io.value = [1; 32];
                    io.mask = hits;
                    self.step = Step::Edge;
                    return Op::Store;
                }
                Step::Store => {
                    self.step = Step::Done;
                    if let Mode::Pull { out, base: b, .. } = g.mode {
                        let live = self.live;
                        io.lanes(|l| (live & (1 << l) != 0).then_some(out + 4 * (base + l as u64)));
                        for l in 0..32 {
                            io.value[l] = (b + DAMPING * self.acc[l]).to_bits();
                        }
                        return Op::Store;
                    }
                    continue;
                }
                Step::Done => return Op::Exit,
            }
        }
    }
}

/// `contrib[u] = rank[u] / outdeg[u]` (0 without out-edges).
struct Contrib {
    n: u64,
    rank: u64,
    inv_deg: u64,
    out: u64,
}

impl Spec for Contrib {
    fn threads(&self) -> u64 {
        self.n
    }
    fn steps(&self) -> u64 {
        1
    }
    fn operands(&self) -> usize {
        2
    }
    fn addr(&self, t: u64, _k: u64, op: usize) -> Option<u64> {
        Some(if op == 0 { self.rank } else { self.inv_deg } + 4 * t)
    }
    fn affine(&self, _k: u64, op: usize) -> Option<Affine> {
        Some(Affine {
            base: if op == 0 { self.rank } else { self.inv_deg },
            stride: 4,
        })
    }
    fn fold(&self, _t: u64, _k: u64, acc: &mut [f32; 4], v: &[f32; MAX_OPS]) {
        acc[0] = v[0] * v[1];
    }
    fn out(&self, t: u64) -> Option<u64> {
        Some(self.out + 4 * t)
    }
    fn out_affine(&self) -> Option<Affine> {
        Some(Affine {
            base: self.out,
            stride: 4,
        })
    }
}

/// BFS levels from `src` (`u32::MAX` for unreached nodes): the CPU reference.
pub fn bfs_ref(g: &Csr, src: usize) -> Vec<u32> {
    let mut level = vec![UNVISITED; g.nodes()];
    level[src] = 0;
    let mut frontier = vec![src];
    let mut l = 0;
    while !frontier.is_empty() {
        let mut next = Vec::new();
        for &u in &frontier {
            for e in g.row[u]..g.row[u + 1] {
                let v = g.col[e as usize] as usize;
                if level[v] == UNVISITED {
                    level[v] = l + 1;
                    next.push(v);
                }
            }
        }
        frontier = next;
        l += 1;
    }
    level
}

/// Run a graph workload.
///
/// # Errors
/// An unknown name or what failed.
pub fn run(m: &SimtMachine, name: &str, size: Size) -> Result<Outcome, String> {
    let g = match name {
        "bfs-uniform" | "pagerank-uniform" => uniform(scale(size), DEGREE, 7),
        "bfs-rmat" | "pagerank-rmat" => rmat(scale(size), DEGREE, 7),
        _ => return Err(format!("unknown graph workload {name}")),
    };
    let n = g.nodes() as u64;
    let mut total = RunStats::default();
    let footprint = (2 * (n + 1) + 2 * g.col.len() as u64 + 4 * n) * 4;
    if name.starts_with("bfs") {
        let row = m.upload(&g.row)?;
        let col = m.upload(&g.col)?;
        let mut lv = vec![UNVISITED; n as usize];
        lv[0] = 0;
        let levels = m.upload(&lv)?;
        let flag = m.upload(&[0])?;
        for level in 0.. {
            m.store_words(flag, &[0])?;
            let k = Gather {
                n,
                row: row.start.as_u64(),
                col: col.start.as_u64(),
                mode: Mode::Bfs {
                    level,
                    levels: levels.start.as_u64(),
                    flag: flag.start.as_u64(),
                },
            };
            total.plus(&m.launch(&k).map_err(|e| e.to_string())?);
            if m.download(flag, 1)?[0] == 0 {
                break;
            }
        }
        let got = m.download(levels, n as usize)?;
        let want = bfs_ref(&g, 0);
        let ok = got == want;
        return Ok(Outcome {
            name: name.into(),
            stats: total,
            verified: ok,
            max_error: if ok { 0.0 } else { 1.0 },
            footprint,
        });
    }
    // PageRank: pull over in-edges, 3 iterations.
    let t = g.transpose();
    let inv = inv_out_degree(&g);
    let row = m.upload(&t.row)?;
    let col = m.upload(&t.col)?;
    let inv_r = m.upload_f32(&inv)?;
    let rank0 = vec![1.0 / n as f32; n as usize];
    let rank = m.upload_f32(&rank0)?;
    let contrib = m.alloc(n * 4)?;
    let base = (1.0 - DAMPING) / n as f32;
    for _ in 0..3 {
        let c = SpecKernel::new(Contrib {
            n,
            rank: rank.start.as_u64(),
            inv_deg: inv_r.start.as_u64(),
            out: contrib.start.as_u64(),
        });
        total.plus(&m.launch(&c).map_err(|e| e.to_string())?);
        let k = Gather {
            n,
            row: row.start.as_u64(),
            col: col.start.as_u64(),
            mode: Mode::Pull {
                contrib: contrib.start.as_u64(),
                out: rank.start.as_u64(),
                base,
            },
        };
        total.plus(&m.launch(&k).map_err(|e| e.to_string())?);
    }
    let want = pagerank_ref(&t, &inv, 3);
    let got = m.download_f32(rank, n as usize)?;
    // Ranks are ~1/n: compare relative to the mean rank.
    let scale = n as f32;
    let err = max_rel_error(
        &got.iter().map(|x| x * scale).collect::<Vec<_>>(),
        &want.iter().map(|x| x * scale).collect::<Vec<_>>(),
    );
    Ok(Outcome {
        name: name.into(),
        stats: total,
        verified: err < 1e-3,
        max_error: err,
        footprint,
    })
}
