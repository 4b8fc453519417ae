//! The kept rows of every group in flat arrays, for the common case of small N and short
//! fixed-width ORDER BY keys (numbers, dates, booleans): group g owns entries `g*k .. g*k+k`, each
//! an encoded key read as one big-endian `u128` and a slot, sorted best first. A row its group
//! cannot use is turned away after one integer comparison in contiguous memory; no allocation
//! and no `memcpy` call per row.

/// The most rows per group the flat layout is used for; above, a heap per group.
pub const FLAT_MAX_K: usize = 16;

/// The longest encoded ORDER BY key the flat layout holds (one `u128`); above, a heap per group.
pub const FLAT_MAX_KEY_BYTES: usize = 16;

/// What offering a row did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Offer {
    Rejected,
    /// Kept; the group had room.
    Added,
    /// Kept; the group's worst row was pushed out.
    Replaced,
}

/// What a row of a group is first checked against, in one place: most rows are turned away
/// after reading only this (one cache line, where the group's keys would be another).
#[derive(Debug, Clone, Copy, Default)]
struct Head {
    /// The worst kept key, once the group is full.
    worst: u128,
    /// Kept rows (at most `k`).
    len: u32,
}

#[derive(Debug)]
pub struct FlatTopK {
    k: usize,
    /// Bytes of every encoded key (at most [`FLAT_MAX_KEY_BYTES`]).
    width: usize,
    keys: Vec<u128>,
    slots: Vec<u64>,
    heads: Vec<Head>,
}

impl FlatTopK {
    /// Correct for any `k`; meant for `k` up to [`FLAT_MAX_K`], since keeping a group sorted
    /// costs O(k) per kept row.
    pub fn new(k: usize, width: usize) -> Self {
        debug_assert!(width <= FLAT_MAX_KEY_BYTES);
        FlatTopK { k, width, keys: Vec::new(), slots: Vec::new(), heads: Vec::new() }
    }

    pub fn width(&self) -> usize {
        self.width
    }

    pub fn ensure_groups(&mut self, groups: usize) {
        if self.heads.len() < groups {
            self.heads.resize(groups, Head::default());
            self.slots.resize(groups * self.k, 0);
            self.keys.resize(groups * self.k, 0);
        }
    }

    pub fn size(&self) -> usize {
        self.keys.capacity() * 16 + self.slots.capacity() * 8 + self.heads.capacity() * std::mem::size_of::<Head>()
    }

    /// Fetches `group`'s head and first key into the cache ahead of its [`FlatTopK::offer`]
    /// (most offers read only the head; an admitted row reads the keys).
    #[inline]
    pub fn prefetch(&self, group: usize) {
        if let Some(head) = self.heads.get(group) {
            super::prefetch(head);
        }
        if let Some(key) = self.keys.get(group * self.k) {
            super::prefetch(key);
        }
    }

    /// Offers `key` (from [`key_of`]) for `group`, stored at `slot` if kept.
    #[inline]
    pub fn offer(&mut self, group: usize, key: u128, slot: u64) -> Offer {
        let (k, base) = (self.k, group * self.k);
        let head = self.heads[group];
        let len = head.len as usize;
        if len == k && (k == 0 || key >= head.worst) {
            return Offer::Rejected;
        }
        // Shift worse keys one place down (the last one falls off a full group), then insert
        // after every kept key not worse than this one (ties keep arrival order).
        let keys = &mut self.keys[base..base + k];
        let slots = &mut self.slots[base..base + k];
        let mut at = len.min(k - 1);
        while at > 0 && key < keys[at - 1] {
            keys[at] = keys[at - 1];
            slots[at] = slots[at - 1];
            at -= 1;
        }
        keys[at] = key;
        slots[at] = slot;
        let worst = keys[k - 1];
        let head = &mut self.heads[group];
        if len < k {
            head.len += 1;
            head.worst = worst;
            Offer::Added
        } else {
            head.worst = worst;
            Offer::Replaced
        }
    }

    /// Calls `f` on the slot of every kept row, group by group, letting it rewrite the slot.
    pub fn for_each_slot(&mut self, mut f: impl FnMut(&mut u64)) {
        for (group, head) in self.heads.iter().enumerate() {
            for slot in &mut self.slots[group * self.k..group * self.k + head.len as usize] {
                f(slot);
            }
        }
    }
}

/// `bytes` (at most 16) as a big-endian integer padded with zeros on the right, so that keys of
/// one width compare as their bytes do. Fixed-size loads only for the usual widths (9 bytes: a
/// null flag and an 8-byte value).
#[inline]
pub fn key_of(bytes: &[u8]) -> u128 {
    let w = bytes.len();
    let load8 = |b: &[u8]| -> u64 { b.first_chunk::<8>().map_or(0, |c| u64::from_be_bytes(*c)) };
    match w {
        8 => (load8(bytes) as u128) << 64,
        9..=16 => {
            let hi = load8(bytes);
            // The last 8 bytes overlap the first (16 - w): shifting them out leaves bytes[8..w]
            // followed by zeros.
            let lo = load8(&bytes[w - 8..]) << (8 * (16 - w));
            ((hi as u128) << 64) | lo as u128
        }
        _ => {
            let mut x = [0u8; 16];
            for (to, from) in x.iter_mut().zip(bytes) {
                *to = *from;
            }
            u128::from_be_bytes(x)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_the_smallest_keys_in_order() {
        let mut flat = FlatTopK::new(3, 2);
        flat.ensure_groups(2);
        let offers: Vec<Offer> = [[5u8, 0], [3, 0], [9, 0], [1, 0], [9, 9], [3, 0]]
            .iter()
            .enumerate()
            .map(|(i, k)| flat.offer(1, key_of(k), i as u64))
            .collect();
        use Offer::*;
        assert_eq!(offers, [Added, Added, Added, Replaced, Rejected, Replaced]);
        let mut slots = Vec::new();
        flat.for_each_slot(|s| slots.push(*s));
        // Keys 1 (slot 3), 3 (slot 1), 3 (slot 5): the earlier 3 first.
        assert_eq!(slots, [3, 1, 5]);
    }

    #[test]
    fn keys_compare_as_their_bytes_at_every_width() {
        let mut next = super::super::test_rng(11);
        for w in 0..=16usize {
            for _ in 0..2_000 {
                let a: Vec<u8> = (0..w).map(|_| (next() % 4) as u8 * 85).collect();
                let b: Vec<u8> = (0..w).map(|_| (next() % 4) as u8 * 85).collect();
                assert_eq!(key_of(&a).cmp(&key_of(&b)), a.cmp(&b), "{a:?} {b:?}");
            }
            let ones = vec![0xffu8; w];
            let expected = if w == 0 { 0 } else { u128::MAX << (8 * (16 - w)) };
            assert_eq!(key_of(&ones), expected, "width {w}");
        }
    }
}
