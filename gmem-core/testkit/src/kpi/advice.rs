//! `region_advise` (issue 35, item 5) in the runner: advice over a page range of a
//! region — preferred location, accessed-by, read-mostly (read duplication) — or a
//! misuse (a range past its region, a destroyed device) that must be a typed error
//! changing nothing. Advice changes where pages live and which tables map them, never
//! their bytes: the model keeps its bytes, and every later access (reads through each
//! device's copy or remote mapping, writes that collapse copies) is checked against
//! them as any access is.

use super::{KpiRunner, NDEV};
use gmem_core::policy::advice::AdviceOp;
use gmem_core::AdviseError;
use gmem_core::Pages;

impl KpiRunner {
    /// Apply advice `kind` (modulo 7: set/unset preferred, set/unset accessed-by,
    /// set/unset read-mostly, clear) naming device `dev` to pages of the region at
    /// `start` of `slot`; `bad`: a range one page past the region (misuse).
    pub(super) fn advise(
        &mut self,
        ctx: &str,
        (slot, start): (usize, u64),
        (page, pages): (u8, u8),
        kind: u8,
        dev: u8,
        bad: bool,
    ) {
        let k = usize::from(dev) % NDEV;
        let d = self.devices[k];
        let op = match kind % 7 {
            0 => AdviceOp::SetPreferred(d),
            1 => AdviceOp::UnsetPreferred,
            2 => AdviceOp::SetAccessedBy(d),
            3 => AdviceOp::UnsetAccessedBy(d),
            4 => AdviceOp::SetReadMostly,
            5 => AdviceOp::UnsetReadMostly,
            _ => AdviceOp::Clear,
        };
        let r = self.region(slot, start);
        let space = r.handle.space;
        let (p0, n) = r.range(page, pages, bad);
        let names_dead = op.device().is_some() && !self.alive[k];
        if names_dead {
            let range = r.va_range((p0, n));
            let res = self.sys.gm.region_advise(Pages::range(space, range), op);
            return self.misuse(ctx, res, AdviseError::UnknownDevice(d));
        }
        if bad {
            let (range, want) = self.misused_range(slot, start, p0);
            let res = self.sys.gm.region_advise(Pages::range(space, range), op);
            return self.misuse(ctx, res, AdviseError::Region(want));
        }
        let range = r.va_range((p0, n));
        let res = self.sys.gm.region_advise(Pages::range(space, range), op);
        assert_eq!(res, Ok(()), "{ctx}");
        self.summary.succeeded += 1;
    }
}
