//! The outbox's two small metadata files, each replaced atomically (written to `<name>.tmp`,
//! fsynced, renamed over `<name>`, directory fsynced: the durable-rename recipe of reference
//! notes §5.1; a leftover `.tmp` is removed on open):
//!
//! - `OUTBOX_ID`: 32 lowercase hex digits and a newline, random, created once with the outbox and
//!   never changed. Receivers key their dedup high-water marks by (origin id, seq), so the id
//!   lives exactly as long as the log whose seqs it qualifies;
//! - `SEQ_LEASE`: a decimal `u64` and a newline, the seq lease: every seq handed out so far is
//!   below it. Seqs are taken from the lease and it is extended before it runs out, so seqs stay
//!   unique even if the end of the log is lost (bit rot in the last record, a disk that lied
//!   about a flush): a reopen starts at the lease, above anything handed out.

use std::collections::hash_map::RandomState;
use std::hash::{BuildHasher, Hasher};
use std::io::ErrorKind;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use crate::error::StorageError;
use crate::fs::Fs;

/// The identity file's name, in the outbox directory.
pub const OUTBOX_ID_FILE: &str = "OUTBOX_ID";
/// The seq lease file's name, in the outbox directory.
pub const SEQ_LEASE_FILE: &str = "SEQ_LEASE";
const TMP_SUFFIX: &str = ".tmp";
const OUTBOX_ID_HEX_DIGITS: usize = 32;

/// What the outbox directory holds besides the log.
#[derive(Debug, Default)]
pub(super) struct Meta {
    pub origin_id: Option<String>,
    pub seq_lease: Option<u64>,
}

/// Reads both files (each may be missing) and removes temporary files left by a crash. A file
/// that does not parse is an error and is never replaced: a new identity would make receivers
/// take resent items for new data, a guessed lease could reuse seqs.
pub(super) fn read(fs: &dyn Fs, dir: &Path) -> Result<Meta, StorageError> {
    let names = fs.list_dir(dir).map_err(StorageError::io("list", dir))?;
    let mut removed_tmp = false;
    for name in [OUTBOX_ID_FILE, SEQ_LEASE_FILE] {
        let tmp_name = format!("{name}{TMP_SUFFIX}");
        if names.contains(&tmp_name) {
            let tmp = dir.join(tmp_name);
            fs.remove_file(&tmp).map_err(StorageError::io("remove", &tmp))?;
            removed_tmp = true;
        }
    }
    if removed_tmp {
        fs.sync_dir(dir).map_err(StorageError::io("fsync dir", dir))?;
    }
    let invalid = |name: &str, problem: String| StorageError::OutboxMetaInvalid { path: dir.join(name), problem };
    let origin_id = match read_line(fs, dir, &names, OUTBOX_ID_FILE)? {
        None => None,
        Some(line) => Some(line.and_then(check_id).map_err(|p| invalid(OUTBOX_ID_FILE, p))?),
    };
    let seq_lease = match read_line(fs, dir, &names, SEQ_LEASE_FILE)? {
        None => None,
        Some(line) => Some(line.and_then(|t| check_lease(&t)).map_err(|p| invalid(SEQ_LEASE_FILE, p))?),
    };
    Ok(Meta { origin_id, seq_lease })
}

/// Creates a new random identity, durably.
pub(super) fn create_id(fs: &dyn Fs, dir: &Path) -> Result<String, StorageError> {
    let id = random_id();
    write_atomic(fs, dir, OUTBOX_ID_FILE, &format!("{id}\n"))?;
    Ok(id)
}

/// Replaces the seq lease, durably.
pub(super) fn write_lease(fs: &dyn Fs, dir: &Path, lease: u64) -> Result<(), StorageError> {
    write_atomic(fs, dir, SEQ_LEASE_FILE, &format!("{lease}\n"))
}

/// The one line of text in file `name` (without its newline): `None` if the file is missing,
/// `Some(Err(problem))` if it is not one line of UTF-8 text.
fn read_line(
    fs: &dyn Fs,
    dir: &Path,
    names: &[String],
    name: &str,
) -> Result<Option<Result<String, String>>, StorageError> {
    if !names.iter().any(|n| n == name) {
        return Ok(None);
    }
    let path = dir.join(name);
    let bytes = fs.read(&path).map_err(StorageError::io("read", &path))?;
    let line = std::str::from_utf8(&bytes).ok().and_then(|t| t.strip_suffix('\n')).filter(|t| !t.contains('\n'));
    let found = || String::from_utf8_lossy(&bytes[..bytes.len().min(80)]).into_owned();
    Ok(Some(
        line.map(str::to_string)
            .ok_or_else(|| format!("expected one line of text ending in a newline, found {:?}", found())),
    ))
}

fn write_atomic(fs: &dyn Fs, dir: &Path, name: &str, content: &str) -> Result<(), StorageError> {
    let tmp = dir.join(format!("{name}{TMP_SUFFIX}"));
    let path = dir.join(name);
    match fs.remove_file(&tmp) {
        Err(e) if e.kind() != ErrorKind::NotFound => return Err(StorageError::io("remove", &tmp)(e)),
        _ => {}
    }
    let mut file = fs.create_append(&tmp).map_err(StorageError::io("create", &tmp))?;
    file.write_all(content.as_bytes()).map_err(StorageError::io("write", &tmp))?;
    file.sync_data().map_err(StorageError::io("fsync", &tmp))?;
    fs.rename(&tmp, &path).map_err(StorageError::io("rename", &tmp))?;
    fs.sync_dir(dir).map_err(StorageError::io("fsync dir", dir))
}

fn check_id(text: String) -> Result<String, String> {
    let is_hex = text.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b));
    if text.len() != OUTBOX_ID_HEX_DIGITS || !is_hex {
        return Err(format!("expected {OUTBOX_ID_HEX_DIGITS} lowercase hex digits, found {text:?}"));
    }
    Ok(text)
}

fn check_lease(text: &str) -> Result<u64, String> {
    let digits = !text.is_empty() && text.bytes().all(|b| b.is_ascii_digit());
    let lease = text.parse::<u64>().ok().filter(|_| digits);
    lease.filter(|&l| l >= 1).ok_or_else(|| format!("expected a decimal seq of at least 1, found {text:?}"))
}

/// 128 random bits as hex. `RandomState` keys SipHash with bits from the OS random source, so
/// its output is unpredictable; the clock, process id and a counter make every call's input
/// distinct as well.
fn random_id() -> String {
    static CALLS: AtomicU64 = AtomicU64::new(0);
    let call = CALLS.fetch_add(1, Ordering::Relaxed);
    let nanos = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_nanos());
    let half = |which: u8| {
        let mut hasher = RandomState::new().build_hasher();
        hasher.write_u128(nanos);
        hasher.write_u32(std::process::id());
        hasher.write_u64(call);
        hasher.write_u8(which);
        hasher.finish()
    };
    format!("{:016x}{:016x}", half(0), half(1))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_hex_and_distinct_and_bad_contents_are_rejected() {
        let ids: std::collections::BTreeSet<String> = (0..100).map(|_| random_id()).collect();
        assert_eq!(ids.len(), 100);
        assert!(ids.iter().all(|id| check_id(id.clone()).is_ok()));
        for bad in ["", "0123", "0123456789abcdef0123456789ABCDEF", "0123456789abcdef0123456789abcdefff"] {
            assert!(check_id(bad.to_string()).is_err(), "{bad:?}");
        }
        assert_eq!(check_lease("42"), Ok(42));
        for bad in ["", "0", "-1", "+1", "1 ", "18446744073709551616", "x"] {
            assert!(check_lease(bad).is_err(), "{bad:?}");
        }
    }
}
