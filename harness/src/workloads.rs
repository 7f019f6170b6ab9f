//! Workloads over one shared address space, each verified bit-exactly against a
//! CPU-only reference computed with the same operations in the same order.
//!
//! - **VectorAdd** (`c = a + b`, u32): the CPU writes `a` and `b`, the accelerator
//!   computes `c`, the CPU reads it — the GMEM paper's first simulated workload.
//! - **Back-propagation** on a 3-layer network (n inputs, 16 hidden units, 1 output, as
//!   in Rodinia's `backprop`): the CPU writes initial weights and, every step, a fresh
//!   random input; the accelerator runs the forward pass, the backward pass and the
//!   momentum weight update; the CPU reads the weights back. The momentum buffers are
//!   first touched by the accelerator (zero-filled in device memory).
//! - **ATAX** (Polybench, `y = Aᵀ(A x)`): the CPU writes `A` and `x`, the accelerator
//!   computes, the CPU checks `y`.
//!
//! Every workload returns the core's counters, the bytes zero-filled in device memory,
//! the working set and the number of values that differ from the reference.

use crate::machine::{Accel, Machine, On, TlbReport};
use gmem_core::{Stats, PAGE_SIZE};

/// What a workload run measured.
#[derive(Clone, Debug)]
pub struct Outcome {
    /// The core's counters at the end.
    pub stats: Stats,
    /// Bytes zero-filled in the accelerator's memory.
    pub device_zeroed: u64,
    /// Bytes of the buffers the workload allocated.
    pub working_set: u64,
    /// Values that differ from the CPU-only reference.
    pub mismatches: u64,
    /// Values compared.
    pub compared: u64,
    /// The accelerator's TLB counters.
    pub gpu_tlb: TlbReport,
}

fn finish(
    m: &Machine,
    working_set: u64,
    mismatches: u64,
    compared: u64,
) -> Result<Outcome, String> {
    m.check()?;
    Ok(Outcome {
        stats: m.gm().stats(),
        device_zeroed: m.device_bytes_zeroed(),
        working_set,
        mismatches,
        compared,
        gpu_tlb: m.tlb(On::Gpu),
    })
}

/// Pages of host memory for a working set (room for every byte twice over).
fn host_pages(working_set: u64) -> u64 {
    2 * working_set.div_ceil(PAGE_SIZE) + 1024
}

/// A small deterministic generator (xorshift64*), so reference and device see the same
/// inputs.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn unit(&mut self) -> f32 {
        (self.next() >> 40) as f32 / (1u64 << 24) as f32 - 0.5
    }
}

/// Device memory in pages for `percent`% of `working_set` bytes.
pub fn device_pages(working_set: u64, percent: u64) -> u64 {
    (working_set.div_ceil(PAGE_SIZE) * percent / 100).max(1)
}

/// VectorAdd over `elements` u32s.
///
/// # Errors
/// The first machine error as text: building the machine ([`Machine::new`]), an
/// allocation, a load or store that failed ([`Machine::load`]), or a core invariant
/// violated at the end ([`Machine::check`]). A result that differs from the CPU-only
/// reference is not an error: it is counted in [`Outcome::mismatches`].
pub fn vectoradd(elements: u64, accel_of: impl Fn(u64) -> Accel) -> Result<Outcome, String> {
    let bytes = elements * 4;
    let working_set = 3 * bytes.div_ceil(PAGE_SIZE) * PAGE_SIZE;
    let m = Machine::new(host_pages(working_set), accel_of(working_set))?;
    let (a, b, c) = (m.alloc(bytes)?, m.alloc(bytes)?, m.alloc(bytes)?);
    let input = |i: u64, k: u32| (i as u32).wrapping_mul(2_654_435_761).wrapping_add(k);
    let chunk = PAGE_SIZE / 4;
    let mut i = 0;
    while i < elements {
        let n = chunk.min(elements - i);
        m.store_u32(
            On::Cpu,
            a,
            i,
            &(i..i + n).map(|j| input(j, 1)).collect::<Vec<_>>(),
        )?;
        m.store_u32(
            On::Cpu,
            b,
            i,
            &(i..i + n).map(|j| input(j, 2)).collect::<Vec<_>>(),
        )?;
        i += n;
    }
    let mut i = 0;
    while i < elements {
        let n = chunk.min(elements - i);
        let xs = m.load_u32(On::Gpu, a, i, n as usize)?;
        let ys = m.load_u32(On::Gpu, b, i, n as usize)?;
        let zs: Vec<u32> = xs
            .iter()
            .zip(&ys)
            .map(|(x, y)| x.wrapping_add(*y))
            .collect();
        m.store_u32(On::Gpu, c, i, &zs)?;
        i += n;
    }
    let mut mismatches = 0;
    let mut i = 0;
    while i < elements {
        let n = chunk.min(elements - i);
        let zs = m.load_u32(On::Cpu, c, i, n as usize)?;
        mismatches += zs
            .iter()
            .enumerate()
            .filter(|(k, z)| **z != input(i + *k as u64, 1).wrapping_add(input(i + *k as u64, 2)))
            .count() as u64;
        i += n;
    }
    for r in [a, b, c] {
        m.free(r)?;
    }
    finish(&m, working_set, mismatches, elements)
}

const HIDDEN: usize = 16;
const ETA: f32 = 0.3;
const MOMENTUM: f32 = 0.3;

fn sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + (-x).exp())
}

/// What the input-layer update of a step needs from the output layer.
struct Step {
    delta_h: [f32; HIDDEN + 1],
}

/// Forward and output-layer part of a step, shared by reference and device: given the
/// hidden sums and the output weights, the hidden activations and hidden deltas.
fn output_layer(sums: &[f32; HIDDEN], w2: &mut [f32], dw2: &mut [f32], target: f32) -> Step {
    let mut hidden = [0f32; HIDDEN + 1];
    hidden[0] = 1.0;
    for j in 0..HIDDEN {
        hidden[j + 1] = sigmoid(sums[j]);
    }
    let mut o = 0f32;
    for j in 0..=HIDDEN {
        o += w2[j] * hidden[j];
    }
    let out = sigmoid(o);
    let delta_o = out * (1.0 - out) * (target - out);
    let mut delta_h = [0f32; HIDDEN + 1];
    for j in 1..=HIDDEN {
        delta_h[j] = hidden[j] * (1.0 - hidden[j]) * w2[j] * delta_o;
    }
    for j in 0..=HIDDEN {
        let d = ETA * delta_o * hidden[j] + MOMENTUM * dw2[j];
        w2[j] += d;
        dw2[j] = d;
    }
    Step { delta_h }
}

/// Update one row `i` of the input weights (and its momentum) in place.
fn update_row(w1: &mut [f32], dw1: &mut [f32], x_i: f32, delta_h: &[f32; HIDDEN + 1]) {
    for j in 0..HIDDEN {
        let d = ETA * delta_h[j + 1] * x_i + MOMENTUM * dw1[j];
        w1[j] += d;
        dw1[j] = d;
    }
}

/// Back-propagation with `inputs` input units for `steps` training steps.
///
/// # Errors
/// The first machine error as text: building the machine ([`Machine::new`]), an
/// allocation, a load or store that failed ([`Machine::load`]), or a core invariant
/// violated at the end ([`Machine::check`]). A result that differs from the CPU-only
/// reference is not an error: it is counted in [`Outcome::mismatches`].
pub fn backprop(
    inputs: u64,
    steps: u32,
    accel_of: impl Fn(u64) -> Accel,
) -> Result<Outcome, String> {
    let rows = inputs + 1;
    let wbytes = rows * HIDDEN as u64 * 4;
    let page = |b: u64| b.div_ceil(PAGE_SIZE) * PAGE_SIZE;
    let working_set = 2 * page(wbytes) + page(rows * 4) + 2 * page((HIDDEN as u64 + 1) * 4);
    let m = Machine::new(host_pages(working_set), accel_of(working_set))?;
    let (x, w1, dw1) = (m.alloc(rows * 4)?, m.alloc(wbytes)?, m.alloc(wbytes)?);
    let (w2r, dw2r) = (
        m.alloc((HIDDEN as u64 + 1) * 4)?,
        m.alloc((HIDDEN as u64 + 1) * 4)?,
    );
    let mut rng = Rng(0x5EED_0FBA_C4C4);
    // Reference state, and the same initial weights written by the CPU.
    let mut ref_w1: Vec<f32> = (0..rows * HIDDEN as u64)
        .map(|_| rng.unit() * 0.1)
        .collect();
    let mut ref_dw1 = vec![0f32; ref_w1.len()];
    let mut ref_w2: Vec<f32> = (0..=HIDDEN).map(|_| rng.unit()).collect();
    let mut ref_dw2 = vec![0f32; HIDDEN + 1];
    let chunk_rows = (PAGE_SIZE * 16 / (HIDDEN as u64 * 4)) as usize;
    for (k, part) in ref_w1.chunks(chunk_rows * HIDDEN).enumerate() {
        m.store_f32(On::Cpu, w1, (k * chunk_rows * HIDDEN) as u64, part)?;
    }
    m.store_f32(On::Cpu, w2r, 0, &ref_w2)?;
    for _ in 0..steps {
        // The CPU produces a fresh input and target.
        let mut xs: Vec<f32> = (0..rows).map(|_| rng.unit()).collect();
        xs[0] = 1.0;
        let target = if rng.next() & 1 == 1 { 0.9 } else { 0.1 };
        for (k, part) in xs.chunks(chunk_rows).enumerate() {
            m.store_f32(On::Cpu, x, (k * chunk_rows) as u64, part)?;
        }
        // Reference step.
        let mut sums = [0f32; HIDDEN];
        for (i, xi) in xs.iter().enumerate() {
            for j in 0..HIDDEN {
                sums[j] += ref_w1[i * HIDDEN + j] * xi;
            }
        }
        let st = output_layer(&sums, &mut ref_w2, &mut ref_dw2, target);
        for (i, xi) in xs.iter().enumerate() {
            let r = i * HIDDEN..(i + 1) * HIDDEN;
            update_row(&mut ref_w1[r.clone()], &mut ref_dw1[r], *xi, &st.delta_h);
        }
        // The same step on the accelerator, through its MMU.
        let mut sums = [0f32; HIDDEN];
        let mut i = 0u64;
        while i < rows {
            let n = (chunk_rows as u64).min(rows - i);
            let xv = m.load_f32(On::Gpu, x, i, n as usize)?;
            let wv = m.load_f32(On::Gpu, w1, i * HIDDEN as u64, n as usize * HIDDEN)?;
            for (k, xi) in xv.iter().enumerate() {
                for j in 0..HIDDEN {
                    sums[j] += wv[k * HIDDEN + j] * xi;
                }
            }
            i += n;
        }
        let mut w2 = m.load_f32(On::Gpu, w2r, 0, HIDDEN + 1)?;
        let mut dw2 = m.load_f32(On::Gpu, dw2r, 0, HIDDEN + 1)?;
        let st = output_layer(&sums, &mut w2, &mut dw2, target);
        m.store_f32(On::Gpu, w2r, 0, &w2)?;
        m.store_f32(On::Gpu, dw2r, 0, &dw2)?;
        let mut i = 0u64;
        while i < rows {
            let n = (chunk_rows as u64).min(rows - i);
            let xv = m.load_f32(On::Gpu, x, i, n as usize)?;
            let mut wv = m.load_f32(On::Gpu, w1, i * HIDDEN as u64, n as usize * HIDDEN)?;
            let mut dv = m.load_f32(On::Gpu, dw1, i * HIDDEN as u64, n as usize * HIDDEN)?;
            for (k, xi) in xv.iter().enumerate() {
                let r = k * HIDDEN..(k + 1) * HIDDEN;
                update_row(&mut wv[r.clone()], &mut dv[r], *xi, &st.delta_h);
            }
            m.store_f32(On::Gpu, w1, i * HIDDEN as u64, &wv)?;
            m.store_f32(On::Gpu, dw1, i * HIDDEN as u64, &dv)?;
            i += n;
        }
    }
    // The CPU reads the trained weights and compares them bit for bit.
    let mut mismatches = 0u64;
    let mut i = 0usize;
    while i < ref_w1.len() {
        let n = (chunk_rows * HIDDEN).min(ref_w1.len() - i);
        let got = m.load_f32(On::Cpu, w1, i as u64, n)?;
        mismatches += got
            .iter()
            .zip(&ref_w1[i..i + n])
            .filter(|(a, b)| a.to_bits() != b.to_bits())
            .count() as u64;
        i += n;
    }
    let got = m.load_f32(On::Cpu, w2r, 0, HIDDEN + 1)?;
    mismatches += got
        .iter()
        .zip(&ref_w2)
        .filter(|(a, b)| a.to_bits() != b.to_bits())
        .count() as u64;
    let compared = ref_w1.len() as u64 + HIDDEN as u64 + 1;
    finish(&m, working_set, mismatches, compared)
}

/// ATAX on an `n` x `n` matrix.
///
/// # Errors
/// The first machine error as text: building the machine ([`Machine::new`]), an
/// allocation, a load or store that failed ([`Machine::load`]), or a core invariant
/// violated at the end ([`Machine::check`]). A result that differs from the CPU-only
/// reference is not an error: it is counted in [`Outcome::mismatches`].
pub fn atax(n: u64, accel_of: impl Fn(u64) -> Accel) -> Result<Outcome, String> {
    let page = |b: u64| b.div_ceil(PAGE_SIZE) * PAGE_SIZE;
    let working_set = page(n * n * 4) + 3 * page(n * 4);
    let m = Machine::new(host_pages(working_set), accel_of(working_set))?;
    let (a, x, tmp, y) = (
        m.alloc(n * n * 4)?,
        m.alloc(n * 4)?,
        m.alloc(n * 4)?,
        m.alloc(n * 4)?,
    );
    let mut rng = Rng(0xA7A8);
    let xs: Vec<f32> = (0..n).map(|_| rng.unit()).collect();
    m.store_f32(On::Cpu, x, 0, &xs)?;
    let mut ref_a = Vec::with_capacity((n * n) as usize);
    for i in 0..n {
        let row: Vec<f32> = (0..n).map(|_| rng.unit()).collect();
        m.store_f32(On::Cpu, a, i * n, &row)?;
        ref_a.extend_from_slice(&row);
    }
    // Reference: tmp = A x; y = A^T tmp (row by row, as the device does).
    let nu = n as usize;
    let mut ref_tmp = vec![0f32; nu];
    let mut ref_y = vec![0f32; nu];
    for i in 0..nu {
        for j in 0..nu {
            ref_tmp[i] += ref_a[i * nu + j] * xs[j];
        }
        for j in 0..nu {
            ref_y[j] += ref_a[i * nu + j] * ref_tmp[i];
        }
    }
    // Device.
    let xv = m.load_f32(On::Gpu, x, 0, nu)?;
    let mut yv = vec![0f32; nu];
    for i in 0..n {
        let row = m.load_f32(On::Gpu, a, i * n, nu)?;
        let mut t = 0f32;
        for j in 0..nu {
            t += row[j] * xv[j];
        }
        m.store_f32(On::Gpu, tmp, i, &[t])?;
        for j in 0..nu {
            yv[j] += row[j] * t;
        }
    }
    m.store_f32(On::Gpu, y, 0, &yv)?;
    let got = m.load_f32(On::Cpu, y, 0, nu)?;
    let mismatches = got
        .iter()
        .zip(&ref_y)
        .filter(|(a, b)| a.to_bits() != b.to_bits())
        .count() as u64;
    finish(&m, working_set, mismatches, n)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A named accelerator configuration: working set -> accelerator.
    type Config = (String, Box<dyn Fn(u64) -> Accel>);

    fn configs() -> Vec<Config> {
        let mut v: Vec<Config> = Vec::new();
        for percent in [25u64, 50, 100, 200] {
            v.push((
                format!("discrete {percent}%"),
                Box::new(move |ws| Accel::Discrete {
                    pages: device_pages(ws, percent),
                }),
            ));
        }
        v.push((
            "integrated shared".into(),
            Box::new(|_| Accel::IntegratedShared),
        ));
        v.push((
            "integrated coherent".into(),
            Box::new(|_| Accel::IntegratedCoherent),
        ));
        v
    }

    fn verified(name: &str, o: Outcome) -> Outcome {
        assert_eq!(
            o.mismatches, 0,
            "{name}: {} of {} values differ",
            o.mismatches, o.compared
        );
        assert!(o.compared > 0, "{name}: nothing compared");
        o
    }

    #[test]
    fn every_workload_verifies_bit_exactly_on_every_accelerator_configuration() {
        for (name, accel) in configs() {
            let v = verified(&name, vectoradd(20_000, &accel).unwrap());
            let b = verified(&name, backprop(3000, 2, &accel).unwrap());
            let a = verified(&name, atax(96, &accel).unwrap());
            if name == "discrete 25%" {
                for o in [&v, &b, &a] {
                    assert!(
                        o.stats.evictions > 0,
                        "{name}: a quarter of the working set must evict"
                    );
                }
            }
            if name == "discrete 200%" {
                for o in [&v, &b, &a] {
                    assert_eq!(
                        o.stats.evictions, 0,
                        "{name}: twice the working set never evicts"
                    );
                }
            }
            if name.starts_with("integrated") {
                for o in [&v, &b, &a] {
                    assert_eq!(
                        o.stats.bytes_host_to_dev, 0,
                        "{name}: no local memory, no migration"
                    );
                }
            }
        }
    }

    #[test]
    fn shared_page_table_spares_the_integrated_gpu_its_faults() {
        let shared = vectoradd(20_000, |_| Accel::IntegratedShared).unwrap();
        let coherent = vectoradd(20_000, |_| Accel::IntegratedCoherent).unwrap();
        let faults = |o: &Outcome| {
            let s = o.stats;
            s.faults_zero_fill + s.faults_map_existing + s.faults_migrate + s.faults_remote
        };
        assert!(
            faults(&shared) < faults(&coherent),
            "shared {} vs coherent {}",
            faults(&shared),
            faults(&coherent)
        );
    }

    #[test]
    fn momentum_buffers_are_zero_filled_in_device_memory() {
        let o = backprop(3000, 1, |ws| Accel::Discrete {
            pages: device_pages(ws, 200),
        })
        .unwrap();
        let momentum = (3001u64 * HIDDEN as u64 * 4).div_ceil(PAGE_SIZE) * PAGE_SIZE;
        assert!(
            o.device_zeroed >= momentum,
            "{} zeroed, momentum buffer is {momentum}",
            o.device_zeroed
        );
    }
}
