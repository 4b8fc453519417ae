//! The dedup state of a shard store: a high-water mark per origin, and a bounded window of the
//! most recent insert ids.
//!
//! Deciding is separate from recording: [`DedupState::decide`] judges a whole call's pieces
//! against the state plus the call's own earlier pieces, without changing anything, so nothing
//! changes if the WAL append then fails; [`DedupState::observe`] records a piece's effect once it
//! is durable (and again, identically, when its WAL record is replayed).

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};

use super::Piece;

/// What to do with one piece of an `apply` call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Decision {
    /// New: write its rows.
    Apply,
    /// Its insert id was seen, but its `seq` is above its origin's high-water mark: no rows, but
    /// the mark advances (durably, through a WAL record of its own).
    DuplicateAdvance,
    /// Seen before: nothing to do.
    Duplicate,
}

/// Per-origin high-water marks and the recent insert-id window.
#[derive(Debug, Clone, Default)]
pub(super) struct DedupState {
    hwm: BTreeMap<String, u64>,
    /// Oldest first; never holds an id twice.
    window: VecDeque<String>,
    in_window: HashSet<String>,
    capacity: usize,
}

impl DedupState {
    /// The state a manifest recorded; `window` is oldest first. If it holds more ids than
    /// `capacity` (the setting shrank), the oldest are forgotten.
    pub(super) fn new(hwm: BTreeMap<String, u64>, window: Vec<String>, capacity: usize) -> Self {
        let mut state = DedupState { hwm, capacity, ..DedupState::default() };
        for id in window {
            state.remember(&id);
        }
        state
    }

    pub(super) fn hwm(&self, origin: &str) -> Option<u64> {
        self.hwm.get(origin).copied()
    }

    pub(super) fn hwm_map(&self) -> &BTreeMap<String, u64> {
        &self.hwm
    }

    /// The remembered insert ids, oldest first.
    pub(super) fn window(&self) -> impl Iterator<Item = &String> {
        self.window.iter()
    }

    /// Judges each piece in order, as if the ones before it in `pieces` were already applied.
    pub(super) fn decide(&self, pieces: &[Piece]) -> Vec<Decision> {
        let mut pending_hwm: HashMap<&str, u64> = HashMap::new();
        let mut pending_ids: HashSet<&str> = HashSet::new();
        let mut decisions = Vec::with_capacity(pieces.len());
        for piece in pieces {
            let sequenced = piece.origin.as_deref().zip(piece.seq);
            if let Some((origin, seq)) = sequenced {
                let mark = pending_hwm.get(origin).copied().or_else(|| self.hwm(origin));
                if mark.is_some_and(|mark| seq <= mark) {
                    decisions.push(Decision::Duplicate);
                    continue;
                }
                pending_hwm.insert(origin, seq);
            }
            let id = piece.insert_id.as_deref();
            let id_seen = id.is_some_and(|id| pending_ids.contains(id) || self.in_window.contains(id));
            decisions.push(match (id_seen, sequenced) {
                (true, Some(_)) => Decision::DuplicateAdvance,
                (true, None) => Decision::Duplicate,
                (false, _) => {
                    pending_ids.extend(id.filter(|_| self.capacity > 0));
                    Decision::Apply
                }
            });
        }
        decisions
    }

    /// Records a durable piece: its origin's mark moves up to `seq`, and `insert_id` (of an
    /// applied piece) joins the window, evicting the oldest id when the window is full.
    pub(super) fn observe(&mut self, origin: Option<&str>, seq: Option<u64>, insert_id: Option<&str>) {
        if let Some((origin, seq)) = origin.zip(seq) {
            match self.hwm.get_mut(origin) {
                Some(mark) => *mark = (*mark).max(seq),
                None => {
                    self.hwm.insert(origin.to_string(), seq);
                }
            }
        }
        if let Some(id) = insert_id {
            self.remember(id);
        }
    }

    fn remember(&mut self, id: &str) {
        if self.capacity == 0 || self.in_window.contains(id) {
            return;
        }
        while self.window.len() >= self.capacity {
            let Some(oldest) = self.window.pop_front() else { break };
            self.in_window.remove(&oldest);
        }
        self.window.push_back(id.to_string());
        self.in_window.insert(id.to_string());
    }
}
