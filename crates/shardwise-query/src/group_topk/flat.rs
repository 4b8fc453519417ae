//! The kept rows of every group in flat arrays, for the common case of small N and fixed-width
//! ORDER BY keys (numbers, dates, booleans): group g owns entries `g*k .. g*k+k`, each an
//! encoded key of `width` bytes and a slot, sorted best first. A row its group cannot use is
//! turned away after comparing with one key in contiguous memory; no allocation per kept row.

/// The most rows per group the flat layout is used for; above, a heap per group.
pub const FLAT_MAX_K: usize = 16;

/// What offering a row did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Offer {
    Rejected,
    /// Kept; the group had room.
    Added,
    /// Kept; the group's worst row was pushed out.
    Replaced,
}

#[derive(Debug)]
pub struct FlatTopK {
    k: usize,
    width: usize,
    keys: Vec<u8>,
    slots: Vec<u64>,
    /// Kept rows per group (at most `k`).
    lens: Vec<u32>,
}

impl FlatTopK {
    /// Correct for any `k`; meant for `k` up to [`FLAT_MAX_K`], since keeping a group sorted
    /// costs O(k) per kept row.
    pub fn new(k: usize, width: usize) -> Self {
        FlatTopK { k, width, keys: Vec::new(), slots: Vec::new(), lens: Vec::new() }
    }

    pub fn width(&self) -> usize {
        self.width
    }

    pub fn ensure_groups(&mut self, groups: usize) {
        if self.lens.len() < groups {
            self.lens.resize(groups, 0);
            self.slots.resize(groups * self.k, 0);
            self.keys.resize(groups * self.k * self.width, 0);
        }
    }

    pub fn size(&self) -> usize {
        self.keys.capacity() + self.slots.capacity() * 8 + self.lens.capacity() * 4
    }

    fn key(&self, entry: usize) -> &[u8] {
        &self.keys[entry * self.width..(entry + 1) * self.width]
    }

    /// Offers `key` (exactly `width` bytes) for `group`, stored at `slot` if kept.
    pub fn offer(&mut self, group: usize, key: &[u8], slot: u64) -> Offer {
        let (k, base) = (self.k, group * self.k);
        let len = self.lens[group] as usize;
        if len == k && (k == 0 || !less(key, self.key(base + k - 1))) {
            return Offer::Rejected;
        }
        // Position: after every kept key not worse than this one (ties keep arrival order).
        let mut at = len.min(k - 1);
        while at > 0 && less(key, self.key(base + at - 1)) {
            at -= 1;
        }
        let last = len.min(k - 1);
        let w = self.width;
        self.keys.copy_within((base + at) * w..(base + last) * w, (base + at + 1) * w);
        self.slots.copy_within(base + at..base + last, base + at + 1);
        self.keys[(base + at) * w..(base + at + 1) * w].copy_from_slice(key);
        self.slots[base + at] = slot;
        if len < k {
            self.lens[group] += 1;
            Offer::Added
        } else {
            Offer::Replaced
        }
    }

    /// Calls `f` on the slot of every kept row, group by group, letting it rewrite the slot.
    pub fn for_each_slot(&mut self, mut f: impl FnMut(&mut u64)) {
        for (group, &len) in self.lens.iter().enumerate() {
            for slot in &mut self.slots[group * self.k..group * self.k + len as usize] {
                f(slot);
            }
        }
    }
}

/// `a < b` for two keys of the same width: as big-endian integers when they fit in 16 bytes
/// (no call to `memcmp` for a 9-byte float key).
pub fn less(a: &[u8], b: &[u8]) -> bool {
    if a.len() <= 16 && a.len() == b.len() {
        let (mut x, mut y) = ([0u8; 16], [0u8; 16]);
        x[..a.len()].copy_from_slice(a);
        y[..b.len()].copy_from_slice(b);
        return u128::from_be_bytes(x) < u128::from_be_bytes(y);
    }
    a < b
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
            .map(|(i, k)| flat.offer(1, k, i as u64))
            .collect();
        use Offer::*;
        assert_eq!(offers, [Added, Added, Added, Replaced, Rejected, Replaced]);
        let mut slots = Vec::new();
        flat.for_each_slot(|s| slots.push(*s));
        // Keys 1 (slot 3), 3 (slot 1), 3 (slot 5): the earlier 3 first.
        assert_eq!(slots, [3, 1, 5]);
        assert!(less(&[1, 2], &[1, 3]) && !less(&[1, 3], &[1, 3]) && less(&[0; 20], &[1; 20]));
    }
}
