//! Memory coalescing: the lane addresses of one warp instruction become 128-byte
//! transactions, and the distinct pages among those become translation requests.
//!
//! A lane's access is 4 bytes, naturally aligned, so it never straddles a transaction
//! (128 bytes divide every page size). Transactions come out in ascending address
//! order, each once; pages likewise.
//!
//! A full warp whose addresses are affine in the lane (`a0 + s·lane`, `s ≥ 0`, the
//! form of most kernels' accesses) is recognised with one pass over the lanes (an add
//! and a compare each), and its transactions follow from `a0` and `s` directly: a run of
//! consecutive lines for `s < 128`, a line per lane above. Other warps go lane by
//! lane.

/// Lanes of a warp.
pub const LANES: usize = 32;
/// Bytes of one memory transaction (a GPU cache line).
pub const TRANSACTION: u64 = 128;

/// 32 zeros then 32 ones: a window of it is a split of the lanes between two
/// transactions (see `Coalesced::fill_consecutive`).
const SPLIT: [u8; 2 * LANES] = {
    let mut s = [0u8; 2 * LANES];
    let mut i = LANES;
    while i < 2 * LANES {
        s[i] = 1;
        i += 1;
    }
    s
};

/// Lane `l` holds `l`: the lane-to-transaction map of a warp with a line per lane.
const IDENTITY: [u8; LANES] = {
    let mut s = [0u8; LANES];
    let mut i = 0;
    while i < LANES {
        s[i] = i as u8;
        i += 1;
    }
    s
};

/// Why a warp instruction's addresses were rejected.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CoalesceError {
    /// A lane's address is not 4-byte aligned.
    Unaligned {
        /// The lane.
        lane: usize,
        /// Its address.
        addr: u64,
    },
}

/// The transactions and pages of one warp instruction.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Coalesced {
    /// First address of each distinct 128-byte transaction, ascending.
    pub transactions: Vec<u64>,
    /// First address of each distinct page (of `1 << page_shift` bytes), ascending.
    pub pages: Vec<u64>,
    /// Each active lane's index in `transactions` (stale for inactive lanes).
    lane_tx: [u8; LANES],
    /// Each transaction's index in `pages`.
    tx_page: [u8; LANES],
    /// The instruction is one whole transaction: all 32 lanes active, lane `l` at byte
    /// `4 l` of one aligned 128-byte line (see [`Coalesced::whole_line`]).
    whole: bool,
}

impl Coalesced {
    /// Coalesce the active lanes (`mask` bit `i` = lane `i`) of `addr` with pages of
    /// `1 << page_shift` bytes, replacing this value's contents (no allocation once
    /// warmed up).
    ///
    /// # Errors
    /// [`CoalesceError::Unaligned`] for an active lane whose address is not 4-byte
    /// aligned; the value is then left empty.
    pub fn fill(
        &mut self,
        addr: &[u64; LANES],
        mask: u32,
        page_shift: u8,
    ) -> Result<(), CoalesceError> {
        self.fill_declared(addr, mask, 0, page_shift)
    }

    /// [`Coalesced::fill`] for lanes the program may have declared affine
    /// ([`crate::kernel::WarpIo::set_affine`]): a non-zero `stride` with all 32 lanes
    /// active says lane `l` is at `addr[0] + stride·l`, so the per-lane check is
    /// skipped (debug builds still make it); 0 declares nothing. The result is that of
    /// [`Coalesced::fill`] either way.
    ///
    /// # Errors
    /// As [`Coalesced::fill`].
    #[inline]
    pub fn fill_declared(
        &mut self,
        addr: &[u64; LANES],
        mask: u32,
        stride: u64,
        page_shift: u8,
    ) -> Result<(), CoalesceError> {
        self.transactions.clear();
        self.pages.clear();
        self.whole = false;
        if mask == u32::MAX && self.fill_affine(addr, stride, page_shift) {
            return Ok(());
        }
        self.fill_lanes(addr, mask, page_shift)
    }

    /// [`Coalesced::fill`] lane by lane, into emptied lists.
    fn fill_lanes(
        &mut self,
        addr: &[u64; LANES],
        mask: u32,
        page_shift: u8,
    ) -> Result<(), CoalesceError> {
        // Lanes usually come in ascending address order: each lane's transaction is
        // then the last one or a new one at the end, and its index is known at once.
        let mut sorted = true;
        let mut m = mask;
        while m != 0 {
            let lane = m.trailing_zeros() as usize;
            m &= m - 1;
            let a = addr[lane];
            if a % 4 != 0 {
                self.transactions.clear();
                self.pages.clear();
                return Err(CoalesceError::Unaligned { lane, addr: a });
            }
            let t = a & !(TRANSACTION - 1);
            match self.transactions.last() {
                Some(&l) if l == t => {}
                Some(&l) if l > t => {
                    sorted = false;
                    if let Err(i) = self.transactions.binary_search(&t) {
                        self.transactions.insert(i, t);
                    }
                }
                _ => self.transactions.push(t),
            }
            self.lane_tx[lane] = (self.transactions.len() - 1) as u8;
        }
        if !sorted {
            // An insertion moved transactions after lanes were given their index.
            let mut m = mask;
            while m != 0 {
                let lane = m.trailing_zeros() as usize;
                m &= m - 1;
                let t = addr[lane] & !(TRANSACTION - 1);
                let i = self.transactions.binary_search(&t).unwrap_or(0);
                self.lane_tx[lane] = i as u8;
            }
        }
        self.pages_of_transactions(page_shift);
        Ok(())
    }

    /// Fill the (emptied) page list and `tx_page` from the ascending transactions.
    fn pages_of_transactions(&mut self, page_shift: u8) {
        let pmask = !((1u64 << page_shift) - 1);
        for i in 0..self.transactions.len() {
            let p = self.transactions[i] & pmask;
            if self.pages.last() != Some(&p) {
                self.pages.push(p);
            }
            self.tx_page[i] = (self.pages.len() - 1) as u8;
        }
    }

    /// A full warp whose lane `l` is at `addr[0] + s·l` for one stride `s ≥ 0`
    /// (`addr[1] - addr[0]`), every address aligned and the run not wrapping: fills
    /// the value and returns true, else returns false having changed nothing. The
    /// check is one pass over the lanes, an add and a compare each (no multiply),
    /// skipped when the program `declared` stride `s`; the
    /// transactions then follow from `addr[0]` and `s` (for `s = 4`, the common
    /// coalesced access, see [`Coalesced::fill_consecutive`]), and so do the pages
    /// when the lanes are a page or more apart.
    fn fill_affine(&mut self, addr: &[u64; LANES], declared: u64, page_shift: u8) -> bool {
        let a0 = addr[0];
        let s = addr[1].wrapping_sub(a0);
        if a0 % 4 != 0 || s % 4 != 0 {
            return false;
        }
        // The last lane's address, if the run does not wrap.
        let Some(end) = s
            .checked_mul(LANES as u64 - 1)
            .and_then(|d| a0.checked_add(d))
        else {
            return false;
        };
        // An induction rather than a product per lane: an add per lane. (A vector
        // form, xor and or per pair of lanes, measured 18 instructions more.)
        let off = || {
            let (mut x, mut off) = (a0, 0u64);
            for &a in addr {
                off |= a ^ x;
                x = x.wrapping_add(s);
            }
            off
        };
        if declared == 0 || declared != s {
            // No declaration (or one the lanes no longer match): check every lane.
            if off() != 0 {
                return false;
            }
        } else {
            debug_assert_eq!(off(), 0, "lanes declared affine with stride {s} are not");
        }
        if s == 4 {
            self.fill_consecutive(a0, end, page_shift);
            return true;
        }
        let first = a0 & !(TRANSACTION - 1);
        if s < TRANSACTION {
            // Consecutive lanes are less than a line apart: every line from the first
            // lane's to the last lane's is touched.
            let last = end & !(TRANSACTION - 1);
            self.transactions
                .extend((first..=last).step_by(TRANSACTION as usize));
            for (t, &a) in self.lane_tx.iter_mut().zip(addr) {
                *t = ((a - first) / TRANSACTION) as u8;
            }
        } else {
            // A line per lane, ascending.
            self.transactions
                .extend(addr.iter().map(|&a| a & !(TRANSACTION - 1)));
            self.lane_tx = IDENTITY;
            if s.checked_shr(u32::from(page_shift)).unwrap_or(0) != 0 {
                // Lanes at least a page apart: a page per lane too.
                let pmask = !((1u64 << page_shift) - 1);
                self.pages
                    .extend(self.transactions.iter().map(|&t| t & pmask));
                self.tx_page = IDENTITY;
                return true;
            }
        }
        self.pages_of_transactions(page_shift);
        true
    }

    /// [`Coalesced::fill_affine`]'s common case, stride 4: lane `l` at `a0 + 4 l`, the
    /// last at `end`, aligned and not wrapping (checked by the caller). The one to two
    /// transactions and their lanes follow from the addresses.
    fn fill_consecutive(&mut self, a0: u64, end: u64, page_shift: u8) {
        let first = a0 & !(TRANSACTION - 1);
        let last = end & !(TRANSACTION - 1);
        let pmask = !((1u64 << page_shift) - 1);
        self.transactions.push(first);
        self.pages.push(first & pmask);
        self.tx_page[0] = 0;
        if last == first {
            // The 32 words (128 bytes) in one line: they start it, and are the whole line.
            self.lane_tx = [0; LANES];
            self.whole = true;
            return;
        }
        self.transactions.push(last);
        if last & pmask != first & pmask {
            self.pages.push(last & pmask);
        }
        self.tx_page[1] = (self.pages.len() - 1) as u8;
        // Lanes before the second line's first word are in the first transaction.
        let split = ((last - a0) / 4) as usize;
        // Lane `l` gets `SPLIT[LANES - split + l]`, which is 1 exactly when `l >= split`:
        // one fixed-size copy instead of two fills of run-time lengths (two `memset`
        // calls).
        self.lane_tx
            .copy_from_slice(&SPLIT[LANES - split..2 * LANES - split]);
    }

    /// Whether the last [`Coalesced::fill`] found one whole transaction: all 32 lanes
    /// active, lane `l` at byte `4 l` of one aligned 128-byte line (the common load or
    /// store of a coalesced kernel, whose bytes move as the line at once).
    pub fn whole_line(&self) -> bool {
        self.whole
    }

    /// Index of the transaction holding `addr` (which must be one of the coalesced
    /// lanes' addresses).
    pub fn transaction_of(&self, addr: u64) -> Option<usize> {
        self.transactions
            .binary_search(&(addr & !(TRANSACTION - 1)))
            .ok()
    }

    /// Index in [`Coalesced::transactions`] of active lane `lane`'s transaction (the
    /// last [`Coalesced::fill`] computed it; meaningless for a lane it did not cover).
    pub fn lane_transaction(&self, lane: usize) -> usize {
        usize::from(self.lane_tx[lane % LANES])
    }

    /// Index in [`Coalesced::pages`] of transaction `ti`'s page.
    pub fn transaction_page(&self, ti: usize) -> usize {
        usize::from(self.tx_page[ti % LANES])
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernel::WarpIo;

    fn lanes(f: impl Fn(u64) -> u64) -> [u64; LANES] {
        std::array::from_fn(|i| f(i as u64))
    }

    #[test]
    fn consecutive_words_make_one_transaction_per_128_bytes() {
        let mut c = Coalesced::default();
        c.fill(&lanes(|i| 0x1000 + 4 * i), u32::MAX, 12).unwrap();
        assert_eq!(c.transactions, vec![0x1000]);
        assert_eq!(c.pages, vec![0x1000]);
        assert!(c.whole_line());
        c.fill(&lanes(|i| 0x1040 + 4 * i), u32::MAX, 12).unwrap();
        assert_eq!(c.transactions, vec![0x1040 - 0x40, 0x1080]);
        assert!(!c.whole_line());
        c.fill(&lanes(|i| 0x1000 + 4 * i), u32::MAX >> 1, 12)
            .unwrap();
        assert!(!c.whole_line());
    }

    #[test]
    fn a_strided_warp_touches_a_page_per_lane() {
        // Each lane walks its own 4 KiB row (ATAX's A[i][j] with i per lane).
        let mut c = Coalesced::default();
        c.fill(&lanes(|i| 0x10_0000 + 4096 * (31 - i) + 8), u32::MAX, 12)
            .unwrap();
        assert_eq!(c.transactions.len(), 32);
        assert_eq!(c.pages.len(), 32);
        assert!(c.pages.windows(2).all(|w| w[0] < w[1]));
        // With 2 MiB pages they are all one page.
        c.fill(&lanes(|i| 0x20_0000 + 4096 * i), u32::MAX, 21)
            .unwrap();
        assert_eq!(c.pages, vec![0x20_0000]);
    }

    #[test]
    fn inactive_lanes_do_not_count_and_duplicates_merge() {
        let mut c = Coalesced::default();
        c.fill(&lanes(|i| if i < 16 { 0x5000 } else { 0x9000 }), 0xffff, 12)
            .unwrap();
        assert_eq!(c.transactions, vec![0x5000]);
        c.fill(&lanes(|_| 0), 0, 12).unwrap();
        assert!(c.transactions.is_empty() && c.pages.is_empty());
        assert_eq!(c.transaction_of(0x5000), None);
    }

    /// The lane and page indices agree with searching the lists, lanes in order or not.
    #[test]
    fn lane_and_page_indices_match_a_search() {
        let mut x = 0x2545_f491_4f6c_dd1du64;
        for round in 0..2000u64 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let mask = if round % 3 == 0 { u32::MAX } else { x as u32 };
            let addr = lanes(|i| match round % 6 {
                0 => 0x10_0000 + 4 * i + 64 * (x % 7) + 4 * (x % 1024),
                1 => 0x10_0000 + 4 * (31 - i) * (x % 300),
                // Ascending strides: under a line, a line or more (some pages apart),
                // 0 and 4 among them; one lane in eight rounds off the line.
                2 | 3 => {
                    let s = 4 * (x % if round % 3 == 0 { 40 } else { 2000 });
                    let bad = u64::from(round % 8 == 2 && i == x % 32);
                    0x10_0000 + 4 * (x % 512) + s * i + 4 * bad
                }
                _ => 0x10_0000 + 4 * ((x >> i) % 4096),
            });
            let mut c = Coalesced::default();
            c.fill(&addr, mask, 12).unwrap();
            // The lane-by-lane path gives the same value, fast path or not.
            let mut slow = Coalesced::default();
            slow.fill_lanes(&addr, mask, 12).unwrap();
            // `whole_line` exactly when the 32 lanes are one aligned line in order.
            let whole = mask == u32::MAX
                && addr[0] % TRANSACTION == 0
                && (0..LANES).all(|l| addr[l] == addr[0] + 4 * l as u64);
            assert_eq!(c.whole_line(), whole);
            slow.whole = whole;
            assert_eq!(slow, c);
            for (l, &a) in addr.iter().enumerate() {
                if mask & (1 << l) != 0 {
                    let ti = c.lane_transaction(l);
                    assert_eq!(Some(ti), c.transaction_of(a));
                    let p = c.transactions[ti] & !0xfff;
                    assert_eq!(c.pages[c.transaction_page(ti)], p);
                }
            }
        }
    }

    /// Lanes declared affine ([`WarpIo::set_affine`]) coalesce exactly as checked ones
    /// do, and a declaration the lanes do not match (another stride, as if the
    /// addresses were rewritten after it) is not trusted.
    #[test]
    fn declared_lanes_coalesce_as_checked_ones() {
        let mut io = WarpIo::default();
        let runs = [
            (0x1000, 4),
            (0x1040, 4),
            (0x1ff8, 4),
            (0x2000, 8),
            (0x3000, 132),
            (0x10_0008, 4096),
            (0x4000, 0),
            (u64::MAX - 63, 4),
            (u64::MAX - 60, 4),
        ];
        for (start, stride) in runs {
            io.set_affine(start, stride);
            assert_eq!(io.stride, stride);
            for decl in [io.stride, 0, stride.wrapping_add(4)] {
                let mut checked = Coalesced::default();
                let a = checked.fill(&io.addr, io.mask, 12);
                let mut declared = Coalesced::default();
                let b = declared.fill_declared(&io.addr, io.mask, decl, 12);
                assert_eq!(
                    (a, checked),
                    (b, declared),
                    "start {start:#x} stride {stride}"
                );
            }
        }
        // Setting lanes one by one takes the declaration back.
        io.lanes(|l| Some(4 * l as u64));
        assert_eq!(io.stride, 0);
    }

    #[test]
    fn unaligned_lanes_are_rejected() {
        let mut c = Coalesced::default();
        let err = c.fill(&lanes(|i| 4 * i + u64::from(i == 7)), u32::MAX, 12);
        assert_eq!(err, Err(CoalesceError::Unaligned { lane: 7, addr: 29 }));
        assert!(c.transactions.is_empty());
    }
}
