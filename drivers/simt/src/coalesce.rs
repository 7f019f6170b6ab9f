//! Memory coalescing: the lane addresses of one warp instruction become 128-byte
//! transactions, and the distinct pages among those become translation requests.
//!
//! A lane's access is 4 bytes, naturally aligned, so it never straddles a transaction
//! (128 bytes divide every page size). Transactions come out in ascending address
//! order, each once; pages likewise.

/// Lanes of a warp.
pub const LANES: usize = 32;
/// Bytes of one memory transaction (a GPU cache line).
pub const TRANSACTION: u64 = 128;

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
        self.transactions.clear();
        self.pages.clear();
        for (lane, &a) in addr.iter().enumerate() {
            if mask & (1 << lane) == 0 {
                continue;
            }
            if a % 4 != 0 {
                self.transactions.clear();
                self.pages.clear();
                return Err(CoalesceError::Unaligned { lane, addr: a });
            }
            insert_sorted(&mut self.transactions, a & !(TRANSACTION - 1));
        }
        let pmask = !((1u64 << page_shift) - 1);
        for i in 0..self.transactions.len() {
            let p = self.transactions[i] & pmask;
            if self.pages.last() != Some(&p) {
                self.pages.push(p);
            }
        }
        Ok(())
    }

    /// Index of the transaction holding `addr` (which must be one of the coalesced
    /// lanes' addresses).
    pub fn transaction_of(&self, addr: u64) -> Option<usize> {
        self.transactions
            .binary_search(&(addr & !(TRANSACTION - 1)))
            .ok()
    }
}

/// Insert `v` into the ascending `list` unless present; lanes usually come in
/// ascending order, so the common case is a push.
fn insert_sorted(list: &mut Vec<u64>, v: u64) {
    match list.last() {
        None => list.push(v),
        Some(&l) if l < v => list.push(v),
        Some(&l) if l == v => {}
        _ => {
            if let Err(i) = list.binary_search(&v) {
                list.insert(i, v);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lanes(f: impl Fn(u64) -> u64) -> [u64; LANES] {
        std::array::from_fn(|i| f(i as u64))
    }

    #[test]
    fn consecutive_words_make_one_transaction_per_128_bytes() {
        let mut c = Coalesced::default();
        c.fill(&lanes(|i| 0x1000 + 4 * i), u32::MAX, 12).unwrap();
        assert_eq!(c.transactions, vec![0x1000]);
        assert_eq!(c.pages, vec![0x1000]);
        c.fill(&lanes(|i| 0x1040 + 4 * i), u32::MAX, 12).unwrap();
        assert_eq!(c.transactions, vec![0x1040 - 0x40, 0x1080]);
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

    #[test]
    fn unaligned_lanes_are_rejected() {
        let mut c = Coalesced::default();
        let err = c.fill(&lanes(|i| 4 * i + u64::from(i == 7)), u32::MAX, 12);
        assert_eq!(err, Err(CoalesceError::Unaligned { lane: 7, addr: 29 }));
        assert!(c.transactions.is_empty());
    }
}
