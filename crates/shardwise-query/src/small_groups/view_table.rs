//! Group ids of short `Utf8View` keys (up to 12 bytes, held whole in their 16-byte view), found
//! a batch at a time with the probes of later rows prefetched.
//!
//! Why: db-benchmark's `id3` (100 000 keys of 12 bytes) is grouped as `Utf8View`, and in q10 each
//! of ten million rows looks its key up in a table of 100 000: a table too large for a core's
//! cache, probed in row order, so each lookup waited for memory (the lookup was over a quarter
//! of the node's CPU in a profile, nearly all of it on the load of the probed entry). Here the
//! keys and their hashes are computed for the whole batch first, and while row `i` is probed the
//! slot of row `i + PREFETCH_DISTANCE` is already being fetched. A slot holds the key itself
//! (no second load to compare it), so one probe is one cache line.
//!
//! Open addressing with linear probing, at most half full; a slot is the key's two halves and its
//! group (`u64::MAX` when empty).

use std::hash::BuildHasher;

/// Rows ahead whose slot is prefetched.
const PREFETCH_DISTANCE: usize = 16;
/// Slots of a new table.
const SLOTS_MIN: usize = 1 << 10;
/// A slot's group when it is empty.
const EMPTY: u64 = u64::MAX;
/// A row this table does not answer (no short view's length field is `u32::MAX`).
pub const NOT_SHORT: u128 = u128::MAX;

/// The table. See the module doc.
#[derive(Debug)]
pub struct ViewTable {
    /// (key's low half, key's high half, group) per slot.
    slots: Vec<[u64; 3]>,
    len: usize,
    hasher: foldhash::fast::FixedState,
    /// Scratch for one batch: each row's slot hash.
    hashes: Vec<u64>,
}

impl ViewTable {
    pub fn new(seed: u64) -> Self {
        ViewTable {
            slots: vec![[0, 0, EMPTY]; SLOTS_MIN],
            len: 0,
            hasher: foldhash::fast::FixedState::with_seed(seed),
            hashes: Vec::new(),
        }
    }

    /// Bytes held.
    pub fn size(&self) -> usize {
        self.slots.capacity() * 24 + self.hashes.capacity() * 8
    }

    /// For each of `keys` (the masked views of short keys; [`NOT_SHORT`] for rows this table
    /// does not answer), calls `found(row, Some(group))` if the key is known, else
    /// `found(row, None)`, which returns the group the row then has (kept for a short key), or
    /// `None` to stop: the rows after it are not visited.
    pub fn lookup(&mut self, keys: &[u128], mut found: impl FnMut(usize, Option<u32>) -> Option<u32>) {
        self.hashes.clear();
        self.hashes.extend(keys.iter().map(|&k| if k == NOT_SHORT { 0 } else { self.hasher.hash_one(k) }));
        for (row, &key) in keys.iter().enumerate() {
            if let Some(&ahead) = self.hashes.get(row + PREFETCH_DISTANCE) {
                prefetch(&self.slots[ahead as usize & (self.slots.len() - 1)]);
            }
            let known = match key {
                NOT_SHORT => None,
                key => self.find(key, self.hashes[row]).ok(),
            };
            match found(row, known) {
                None => return,
                Some(group) if known.is_none() && key != NOT_SHORT => self.insert(key, self.hashes[row], group),
                Some(_) => {}
            }
        }
    }

    /// The key's group, or the empty slot where it would go.
    #[inline]
    fn find(&self, key: u128, hash: u64) -> Result<u32, usize> {
        let mask = self.slots.len() - 1;
        let (lo, hi) = (key as u64, (key >> 64) as u64);
        let mut at = hash as usize & mask;
        loop {
            let slot = &self.slots[at];
            if slot[2] == EMPTY {
                return Err(at);
            }
            if slot[0] == lo && slot[1] == hi {
                return Ok(slot[2] as u32);
            }
            at = (at + 1) & mask;
        }
    }

    fn insert(&mut self, key: u128, hash: u64, group: u32) {
        if (self.len + 1) * 2 > self.slots.len() {
            self.grow();
        }
        if let Err(at) = self.find(key, hash) {
            self.slots[at] = [key as u64, (key >> 64) as u64, u64::from(group)];
            self.len += 1;
        }
    }

    fn grow(&mut self) {
        let slots = (self.slots.len() * 2).max(SLOTS_MIN);
        let old = std::mem::replace(&mut self.slots, vec![[0, 0, EMPTY]; slots]);
        let mask = self.slots.len() - 1;
        for slot in old.into_iter().filter(|s| s[2] != EMPTY) {
            let key = u128::from(slot[0]) | (u128::from(slot[1]) << 64);
            let mut at = self.hasher.hash_one(key) as usize & mask;
            while self.slots[at][2] != EMPTY {
                at = (at + 1) & mask;
            }
            self.slots[at] = slot;
        }
    }
}

/// Asks the CPU to start loading `slot`'s cache line.
#[inline(always)]
fn prefetch(slot: &[u64; 3]) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: a prefetch is a hint with no effect on memory or program state, and the address is
    // that of a live slot.
    unsafe {
        std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(slot.as_ptr().cast::<i8>());
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = slot;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_keep_their_groups_across_growth_and_batches() {
        let mut table = ViewTable::new(7);
        let keys: Vec<u128> =
            (0..50_000u128).map(|i| if i % 9 == 0 { NOT_SHORT } else { (i % 20_000) * 0x1_0000_0001 + 3 }).collect();
        let mut next = 0u32;
        let mut got = vec![u32::MAX; keys.len()];
        for chunk in (0..keys.len()).step_by(4096) {
            let end = (chunk + 4096).min(keys.len());
            table.lookup(&keys[chunk..end], |row, group| {
                let group = group.unwrap_or_else(|| {
                    next += 1;
                    next - 1
                });
                got[chunk + row] = group;
                Some(group)
            });
        }
        let mut by_key = std::collections::HashMap::new();
        for (&key, group) in keys.iter().zip(&got) {
            if key != NOT_SHORT {
                assert_eq!(*by_key.entry(key).or_insert(*group), *group);
            }
        }
        // Each distinct key got one group; the other rows each asked for one too.
        let nones = keys.iter().filter(|&&k| k == NOT_SHORT).count();
        assert_eq!(next as usize, by_key.len() + nones);
        assert_eq!(table.len, by_key.len());
    }

    #[test]
    fn a_stop_leaves_the_rows_after_it_unvisited() {
        let mut table = ViewTable::new(7);
        let keys: Vec<u128> = (0..10u128).collect();
        let mut visited = 0;
        table.lookup(&keys, |row, _| {
            visited += 1;
            (row < 4).then_some(row as u32)
        });
        assert_eq!((visited, table.len), (5, 4));
    }
}
