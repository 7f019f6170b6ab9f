//! Hotspot with square 2D tiles, as Rodinia's hotspot decomposes its grid (the CODA
//! paper's HS is Rodinia's): block `b` is tile `(b / tiles_per_row, b mod
//! tiles_per_row)` of `tile × tile` cells and reads a one-cell halo around it. Each
//! 4 KiB page of a grid row is then read by every tile along that row. The CODA
//! paper's Fig. 3 reports that most HS pages are touched by almost all thread blocks.
//! [`crate::workloads::Hotspot`] splits the grid by whole rows instead, so a page is
//! touched by two to four blocks there. Since issue 33 this is the experiment's
//! hotspot (the issue names "hotspot (2D tiles)"); the row split is kept as the
//! ablation.
//!
//! The same stencil and inputs as [`crate::workloads::Hotspot`]: the result is checked
//! against its whole-grid CPU step, bit for bit.

use crate::exec::Exec;
use crate::machine::{HbmMachine, MachineError};
use crate::placement::AffineIndex;
use crate::workloads::{Class, Descriptor, Hotspot, Object, Workload};
use std::string::String;
use std::vec::Vec;

/// Hotspot on `rows × cols` in `tile × tile` blocks, `steps` steps.
pub struct Hotspot2d {
    /// Rows.
    pub rows: u64,
    /// Columns.
    pub cols: u64,
    /// Tile side in cells (at least 1 is used).
    pub tile: u64,
    /// Steps (ping-pong between two grids).
    pub steps: u32,
}

impl Hotspot2d {
    fn tiles_per_row(&self) -> u64 {
        self.cols.div_ceil(self.tile.max(1))
    }

    fn reference(&self) -> Hotspot {
        Hotspot {
            rows: self.rows,
            cols: self.cols,
            rows_per_block: self.rows,
            steps: self.steps,
        }
    }
}

impl Workload for Hotspot2d {
    fn name(&self) -> String {
        "hotspot-2d".into()
    }
    fn paper_name(&self) -> Option<&'static str> {
        Some("HS")
    }
    fn class(&self) -> Class {
        Class::CoreExclusive
    }
    fn objects(&self) -> Vec<Object> {
        let t = self.tile.max(1);
        // What the compiler pass sees of `temp[(by·T + ty)·cols + bx·T + tx]` when
        // consecutive blocks differ in `bx`: a block stride of T elements, T + 2 rows
        // of `cols` elements per block. Consecutive blocks' footprints overlap by more
        // than a page, so the placement keeps the grid fine grain (shared data).
        let grid = Descriptor::Affine(
            AffineIndex {
                block_coeff: t as i64,
                thread_coeff: 1,
                loop_coeff: self.cols as i64,
                loop_len: t + 2,
                elem_bytes: 4,
            },
            t * t,
        );
        let own = Descriptor::Affine(
            AffineIndex {
                block_coeff: t as i64,
                thread_coeff: 1,
                loop_coeff: self.cols as i64,
                loop_len: t,
                elem_bytes: 4,
            },
            t * t,
        );
        self.reference().objects_with(grid, own)
    }
    fn init(&self, m: &HbmMachine, base: &[u64]) -> Result<(), MachineError> {
        self.reference().init(m, base)
    }
    fn run(&self, x: &mut Exec<'_>, base: &[u64]) -> Result<(), MachineError> {
        let (rows, cols, t) = (self.rows, self.cols, self.tile.max(1));
        let stencil = self.reference();
        let gx = self.tiles_per_row();
        let blocks = rows.div_ceil(t) * gx;
        for step in 0..self.steps {
            let (from, to) = if step % 2 == 0 {
                (base[0], base[2])
            } else {
                (base[2], base[0])
            };
            x.launch(blocks, |c| {
                let (by, bx) = (c.block() / gx, c.block() % gx);
                let (r0, c0) = (by * t, bx * t);
                let (r1, c1) = ((r0 + t).min(rows), (c0 + t).min(cols));
                let (lo, hi) = (r0.saturating_sub(1), (r1 + 1).min(rows));
                let (cl, ch) = (c0.saturating_sub(1), (c1 + 1).min(cols));
                let width = (ch - cl) as usize;
                let mut tile = Vec::with_capacity((hi - lo) as usize * width);
                for r in lo..hi {
                    tile.extend(c.load_f32s(from + (r * cols + cl) * 4, width)?);
                }
                let (lo_, cl_) = (lo as usize, cl as usize);
                let at = |r: usize, col: usize| tile[(r - lo_) * width + (col - cl_)];
                let mut cells = 0u64;
                for r in r0..r1 {
                    let p = c.load_f32s(base[1] + (r * cols + c0) * 4, (c1 - c0) as usize)?;
                    let mut out = Vec::with_capacity(p.len());
                    for (col, &pv) in (c0..c1).zip(&p) {
                        out.push(stencil.cell(at, r as usize, col as usize, pv));
                    }
                    cells += out.len() as u64;
                    c.store_f32s(to + (r * cols + c0) * 4, &out)?;
                }
                // As `Hotspot`: three adds, three multiply-adds, five tile reads a cell.
                c.alu(cells * 6);
                c.reads(cells * 5);
                Ok(())
            })?;
        }
        Ok(())
    }
    fn verify(&self, m: &HbmMachine, base: &[u64]) -> Result<bool, MachineError> {
        // The whole-grid CPU step does not depend on the decomposition.
        self.reference().verify(m, base)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::coda::{run, Config, Inputs};
    use crate::config::HbmConfig;

    #[test]
    fn tiles_verify_stay_fine_grain_and_each_page_is_read_by_a_row_of_tiles() {
        let cfg = HbmConfig {
            stack_bytes: 4 << 20,
            ..HbmConfig::default()
        };
        let w = Hotspot2d {
            rows: 64,
            cols: 256,
            tile: 16,
            steps: 2,
        };
        for k in [Config::Fgp, Config::Coda] {
            let r = run(&cfg, &w, k, false, &Inputs::default()).unwrap();
            assert!(r.verified, "{k:?}");
            // A page holds 4 grid rows; 16 tiles across, so at least 16 blocks each.
            let few: u64 = r
                .report
                .blocks_per_page
                .iter()
                .filter(|&(&b, _)| b < 16)
                .map(|(_, n)| n)
                .sum();
            assert_eq!(few, 0, "{:?}", r.report.blocks_per_page);
            if k == Config::Coda {
                // The descriptor says shared: CODA keeps the grid fine grain.
                assert_eq!(r.groups.1, 0);
            }
        }
    }
}
