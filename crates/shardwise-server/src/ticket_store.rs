//! What a Flight SQL `GetFlightInfo` leaves for the `DoGet` that follows it, under a ticket.
//!
//! Flight SQL runs a query in two calls: `GetFlightInfo` plans it and answers with a ticket, and
//! `DoGet` redeems the ticket for the rows. What the first call prepared (a result already
//! computed, a plan) waits here for the second under a key made of a prefix no SQL text starts
//! with and a random id; for at most a time to live, and at most a number of entries at once, the
//! oldest going first when full. A key is taken once.

use std::collections::VecDeque;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Length of the random id after a key's prefix (a UUID in 32 hex digits).
const ID_LEN: usize = 32;

/// Entries of one kind waiting for their `DoGet`.
#[derive(Debug)]
pub struct TicketStore<T> {
    /// Starts every key of this store; starts no SQL text (a NUL byte first).
    prefix: &'static [u8],
    ttl: Duration,
    max_entries: usize,
    waiting: Mutex<VecDeque<(Vec<u8>, Instant, T)>>,
}

impl<T> TicketStore<T> {
    /// A store whose keys start with `prefix` (which must start with a NUL byte), keeping an
    /// entry `ttl_ms` and at most `max_entries` at once.
    pub fn new(prefix: &'static [u8], ttl_ms: u64, max_entries: usize) -> TicketStore<T> {
        assert!(prefix.first() == Some(&0), "a ticket key prefix starts with NUL, which no SQL text does");
        assert!(max_entries > 0);
        TicketStore { prefix, ttl: Duration::from_millis(ttl_ms), max_entries, waiting: Mutex::new(VecDeque::new()) }
    }

    /// Keeps `entry` and returns its key.
    pub fn put(&self, entry: T) -> Vec<u8> {
        let mut key = self.prefix.to_vec();
        key.extend_from_slice(uuid::Uuid::new_v4().simple().to_string().as_bytes());
        debug_assert_eq!(key.len(), self.prefix.len() + ID_LEN);
        let mut waiting = self.lock();
        self.expire(&mut waiting);
        if waiting.len() >= self.max_entries {
            waiting.pop_front();
        }
        waiting.push_back((key.clone(), Instant::now(), entry));
        key
    }

    /// Splits a ticket handle that starts with a key of this store into the key and the bytes
    /// after it; `None` when it does not.
    pub fn split<'a>(&self, handle: &'a [u8]) -> Option<(&'a [u8], &'a [u8])> {
        let key_len = self.prefix.len() + ID_LEN;
        (handle.starts_with(self.prefix) && handle.len() >= key_len).then(|| handle.split_at(key_len))
    }

    /// Takes the entry `key` names; `None` when it expired, was pushed out or was taken already.
    pub fn take(&self, key: &[u8]) -> Option<T> {
        let mut waiting = self.lock();
        self.expire(&mut waiting);
        let at = waiting.iter().position(|(k, _, _)| k == key)?;
        waiting.remove(at).map(|(_, _, entry)| entry)
    }

    fn expire(&self, waiting: &mut VecDeque<(Vec<u8>, Instant, T)>) {
        while waiting.front().is_some_and(|(_, at, _)| at.elapsed() > self.ttl) {
            waiting.pop_front();
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, VecDeque<(Vec<u8>, Instant, T)>> {
        self.waiting.lock().unwrap_or_else(|p| p.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_entry_is_taken_once() {
        let store = TicketStore::new(b"\0t:", 60_000, 4);
        let key = store.put(7);
        assert_eq!(store.split(&key), Some((&key[..], &b""[..])));
        assert!(store.split(b"SELECT 1").is_none());
        assert_eq!(store.take(&key), Some(7));
        assert_eq!(store.take(&key), None);
    }

    #[test]
    fn the_oldest_goes_when_full() {
        let store = TicketStore::new(b"\0t:", 60_000, 2);
        let first = store.put(1);
        let second = store.put(2);
        let third = store.put(3);
        assert_eq!(store.take(&first), None);
        assert_eq!(store.take(&second), Some(2));
        assert_eq!(store.take(&third), Some(3));
    }

    #[test]
    fn an_entry_expires() {
        let store = TicketStore::new(b"\0t:", 0, 2);
        let key = store.put(1);
        std::thread::sleep(Duration::from_millis(2));
        assert_eq!(store.take(&key), None);
    }

    #[test]
    fn a_handle_splits_after_its_key() {
        let store: TicketStore<()> = TicketStore::new(b"\0t:", 60_000, 2);
        let mut handle = store.put(());
        let key = handle.clone();
        handle.extend_from_slice(b"SELECT 1");
        assert_eq!(store.split(&handle), Some((&key[..], &b"SELECT 1"[..])));
        assert!(store.split(b"\0t:short").is_none());
    }
}
