//! The cluster secret and what is derived from it.
//!
//! Joining a cluster needs proof of the secret: an HMAC-SHA256 over both sides' nonces and the
//! joiner's identity, so the secret itself never crosses the network and a recorded handshake
//! cannot be replayed. After the handshake both sides derive a session key from the secret and
//! the nonces; every control frame then carries a MAC under that key ([`crate::wire`]). The
//! control connection is, for now, the only inter-node channel.

use std::fmt;
use std::path::Path;

use hmac::{Hmac, Mac};
use sha2::Sha256;

use crate::error::{ClusterError, Result};

/// Shortest secret accepted, in bytes.
pub const MIN_SECRET_BYTES: usize = 16;
/// Environment variable that may hold the secret.
pub const SECRET_ENV: &str = "SHARDWISE_CLUSTER_SECRET";

type HmacSha256 = Hmac<Sha256>;

/// A MAC or proof: HMAC-SHA256 output.
pub type Tag = [u8; 32];

/// The shared cluster secret. Its `Debug` form never shows the bytes.
#[derive(Clone)]
pub struct ClusterSecret {
    bytes: Vec<u8>,
}

impl fmt::Debug for ClusterSecret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ClusterSecret(<{} bytes>)", self.bytes.len())
    }
}

impl ClusterSecret {
    /// Checks the length and wraps the bytes; `origin` names where they came from.
    pub fn new(bytes: Vec<u8>, origin: &str) -> Result<ClusterSecret> {
        if bytes.len() < MIN_SECRET_BYTES {
            return Err(ClusterError::SecretTooShort {
                origin: origin.to_string(),
                len: bytes.len(),
                min_bytes: MIN_SECRET_BYTES,
            });
        }
        Ok(ClusterSecret { bytes })
    }

    /// Loads the secret from `--secret-file` (first) or the `SHARDWISE_CLUSTER_SECRET` value.
    /// A file's trailing newline is not part of the secret.
    pub fn load(file: Option<&Path>, env_value: Option<String>) -> Result<Option<ClusterSecret>> {
        if let Some(path) = file {
            let mut bytes =
                std::fs::read(path).map_err(|source| ClusterError::SecretFile { path: path.to_path_buf(), source })?;
            while bytes.last().is_some_and(|b| *b == b'\n' || *b == b'\r') {
                bytes.pop();
            }
            return ClusterSecret::new(bytes, &format!("--secret-file {}", path.display())).map(Some);
        }
        match env_value {
            Some(v) => ClusterSecret::new(v.into_bytes(), SECRET_ENV).map(Some),
            None => Ok(None),
        }
    }

    /// HMAC of `parts` under the secret, with `label` separating uses. Parts are length-prefixed,
    /// so no two different part lists produce the same input.
    pub fn tag(&self, label: &str, parts: &[&[u8]]) -> Tag {
        tag_with_key(&self.bytes, label, parts)
    }

    /// Checks `tag` against the expected one in constant time.
    pub fn verify(&self, label: &str, parts: &[&[u8]], tag: &[u8]) -> bool {
        verify_with_key(&self.bytes, label, parts, tag)
    }

    /// The key for one control connection's frame MACs.
    pub fn session_key(&self, master_nonce: &[u8], node_nonce: &[u8]) -> Tag {
        self.tag("shardwise session v1", &[master_nonce, node_nonce])
    }
}

fn mac(key: &[u8], label: &str, parts: &[&[u8]]) -> HmacSha256 {
    // HMAC accepts keys of any length; `new_from_slice` cannot fail for HMAC.
    let mut m = match HmacSha256::new_from_slice(key) {
        Ok(m) => m,
        Err(_) => unreachable!("HMAC takes keys of any length"),
    };
    m.update(&(label.len() as u64).to_be_bytes());
    m.update(label.as_bytes());
    for p in parts {
        m.update(&(p.len() as u64).to_be_bytes());
        m.update(p);
    }
    m
}

/// HMAC-SHA256 of `parts` under `key` (used for session keys as well as the secret).
pub fn tag_with_key(key: &[u8], label: &str, parts: &[&[u8]]) -> Tag {
    mac(key, label, parts).finalize().into_bytes().into()
}

/// Constant-time check of a tag made by [`tag_with_key`].
pub fn verify_with_key(key: &[u8], label: &str, parts: &[&[u8]], tag: &[u8]) -> bool {
    mac(key, label, parts).verify_slice(tag).is_ok()
}

/// Length of a handshake nonce.
pub const NONCE_BYTES: usize = 32;

/// A fresh random nonce.
pub fn nonce() -> [u8; NONCE_BYTES] {
    rand::random()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_secret_is_refused_with_its_origin() {
        let err = ClusterSecret::load(None, Some("short".into())).unwrap_err().to_string();
        assert!(err.contains("SHARDWISE_CLUSTER_SECRET is 5 bytes"), "{err}");
    }

    #[test]
    fn file_wins_over_env_and_trailing_newline_is_dropped() {
        let tmp = tempfile::tempdir().unwrap();
        let p = tmp.path().join("s");
        std::fs::write(&p, "0123456789abcdef\n").unwrap();
        let a = ClusterSecret::load(Some(&p), Some("zzzzzzzzzzzzzzzzzzzz".into())).unwrap().unwrap();
        let b = ClusterSecret::new(b"0123456789abcdef".to_vec(), "test").unwrap();
        assert_eq!(a.tag("l", &[b"x"]), b.tag("l", &[b"x"]));
    }

    #[test]
    fn missing_file_is_an_error_naming_it() {
        let err = ClusterSecret::load(Some(Path::new("/nonexistent/s")), None).unwrap_err().to_string();
        assert!(err.contains("/nonexistent/s"), "{err}");
    }

    #[test]
    fn tags_verify_and_differ_by_label_and_parts() {
        let s = ClusterSecret::new(vec![7; 16], "t").unwrap();
        let t = s.tag("a", &[b"x", b"y"]);
        assert!(s.verify("a", &[b"x", b"y"], &t));
        assert!(!s.verify("b", &[b"x", b"y"], &t));
        assert!(!s.verify("a", &[b"xy"], &t));
        let other = ClusterSecret::new(vec![8; 16], "t").unwrap();
        assert!(!other.verify("a", &[b"x", b"y"], &t));
    }

    #[test]
    fn debug_hides_the_bytes() {
        let s = ClusterSecret::new(b"supersecretvalue".to_vec(), "t").unwrap();
        assert!(!format!("{s:?}").contains("supersecret"));
    }
}
