//! The users a node admits, shared by every client protocol: Flight SQL and HTTP check Basic
//! passwords against them, and the PostgreSQL endpoint runs SCRAM-SHA-256 against them.
//!
//! As in ClickHouse, until users are configured the only user is `default`, with an empty
//! password, and clients may connect without credentials. Once the node's config names users
//! (`[users]` in the `--config` file), only they are admitted, and only with their password.
//!
//! A password is kept as PostgreSQL keeps it, a SCRAM-SHA-256 verifier
//! `SCRAM-SHA-256$<iterations>:<salt>$<StoredKey>:<ServerKey>` (RFC 5802/7677, base64 parts), so
//! the config never holds the password nor anything that lets its reader log in: the stored key
//! is a hash of the client key. `shardwise passwd USER` prints one. A Basic password is checked
//! by deriving the stored key from it (PBKDF2, thousands of iterations), so successful checks are
//! remembered by a SHA-256 of the password to spare the next request that work.

use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use pgwire::api::auth::sasl::scram::{ScramSecret, gen_salted_password};
use sha2::{Digest, Sha256};

/// The only user that exists before users are configured.
pub const DEFAULT_USER: &str = "default";

/// PBKDF2 iterations of the verifiers `shardwise passwd` makes (PostgreSQL's default).
pub const SCRAM_ITERATIONS: u32 = 4096;

/// Fewest iterations a configured verifier may have (RFC 7677 asks for at least 4096; fewer
/// would make a leaked config cheap to brute-force).
pub const SCRAM_MIN_ITERATIONS: u32 = 4096;

/// Bytes of random salt in a new verifier.
pub const SCRAM_SALT_BYTES: usize = 16;

/// Most remembered successful Basic checks; the memory is cleared when it fills.
pub const PASSWORD_CACHE_ENTRIES: usize = 1024;

const SCRAM_PREFIX: &str = "SCRAM-SHA-256$";

/// Why a user or a verifier was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AuthError {
    #[error("unknown user {user:?}: no users are configured, only {DEFAULT_USER:?} (empty password)")]
    NoSuchDefaultUser { user: String },
    #[error("wrong password for user {DEFAULT_USER:?} (no users are configured: its password is empty)")]
    DefaultPasswordNotEmpty,
    /// Wrong password or unknown user; the two are not told apart, as in PostgreSQL.
    #[error("password authentication failed for user {user:?}")]
    Failed { user: String },
    #[error("credentials required: this node has configured users")]
    CredentialsRequired,
    #[error("user {user:?}: {reason}")]
    BadVerifier { user: String, reason: String },
}

/// A SCRAM-SHA-256 password verifier, as PostgreSQL stores it in `pg_authid.rolpassword`.
#[derive(Clone, PartialEq, Eq)]
pub struct Verifier {
    iterations: u32,
    salt: Vec<u8>,
    stored_key: Vec<u8>,
    server_key: Vec<u8>,
}

impl std::fmt::Debug for Verifier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Verifier").field("iterations", &self.iterations).finish_non_exhaustive()
    }
}

impl Verifier {
    /// Derives the verifier of `password` with `salt` and `iterations`.
    pub fn derive(password: &str, salt: &[u8], iterations: u32) -> Verifier {
        let salted = gen_salted_password(password, salt, iterations as usize);
        match ScramSecret::verifier_from_salted_password(salt.to_vec(), salted, iterations as usize) {
            ScramSecret::Verifier { stored_key, server_key, .. } => {
                Verifier { iterations, salt: salt.to_vec(), stored_key, server_key }
            }
            // verifier_from_salted_password only makes verifiers.
            ScramSecret::SaltedPassword { .. } => {
                Verifier { iterations, salt: salt.to_vec(), stored_key: Vec::new(), server_key: Vec::new() }
            }
        }
    }

    /// A verifier of `password` with a fresh random salt.
    pub fn generate(password: &str) -> Verifier {
        let salt: [u8; SCRAM_SALT_BYTES] = rand::random();
        Verifier::derive(password, &salt, SCRAM_ITERATIONS)
    }

    /// Parses `SCRAM-SHA-256$<iterations>:<salt>$<StoredKey>:<ServerKey>`.
    pub fn parse(text: &str) -> Result<Verifier, String> {
        const SHAPE: &str =
            "expected SCRAM-SHA-256$<iterations>:<salt>$<StoredKey>:<ServerKey> (from `shardwise passwd`)";
        let rest = text.strip_prefix(SCRAM_PREFIX).ok_or_else(|| format!("not a SCRAM-SHA-256 verifier; {SHAPE}"))?;
        let (params, keys) = rest.split_once('$').ok_or_else(|| SHAPE.to_string())?;
        let (iterations, salt) = params.split_once(':').ok_or_else(|| SHAPE.to_string())?;
        let (stored_key, server_key) = keys.split_once(':').ok_or_else(|| SHAPE.to_string())?;
        let iterations: u32 =
            iterations.parse().map_err(|_| format!("iteration count {iterations:?} is not a number; {SHAPE}"))?;
        if iterations < SCRAM_MIN_ITERATIONS {
            return Err(format!("{iterations} iterations is fewer than the minimum {SCRAM_MIN_ITERATIONS}"));
        }
        let decode = |what: &str, part: &str| STANDARD.decode(part).map_err(|_| format!("{what} is not base64"));
        let salt = decode("the salt", salt)?;
        let stored_key = decode("the stored key", stored_key)?;
        let server_key = decode("the server key", server_key)?;
        if salt.is_empty() {
            return Err("the salt is empty".into());
        }
        if stored_key.len() != 32 || server_key.len() != 32 {
            return Err("the stored and server keys must be 32 bytes (SHA-256) each".into());
        }
        Ok(Verifier { iterations, salt, stored_key, server_key })
    }

    /// True when `password` is the password this verifier was made from.
    pub fn matches(&self, password: &str) -> bool {
        let other = Verifier::derive(password, &self.salt, self.iterations);
        constant_time_eq(&other.stored_key, &self.stored_key)
    }

    /// The verifier in the form the PostgreSQL endpoint's SCRAM exchange uses.
    pub fn scram_secret(&self) -> ScramSecret {
        ScramSecret::Verifier {
            salt: self.salt.clone(),
            iterations: self.iterations as usize,
            stored_key: self.stored_key.clone(),
            server_key: self.server_key.clone(),
        }
    }
}

impl std::fmt::Display for Verifier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{SCRAM_PREFIX}{}:{}${}:{}",
            self.iterations,
            STANDARD.encode(&self.salt),
            STANDARD.encode(&self.stored_key),
            STANDARD.encode(&self.server_key)
        )
    }
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// The users of a node.
#[derive(Debug, Default)]
pub struct Users {
    /// Empty: only `default` with an empty password.
    configured: BTreeMap<String, Verifier>,
    /// SHA-256 of passwords that passed, per user.
    passed: Mutex<HashMap<String, [u8; 32]>>,
    /// A key drawn when the node starts, from which an unknown user gets a verifier of its own
    /// ([`Users::verifier_or_mock`]).
    mock_key: [u8; 32],
}

impl Users {
    /// No users configured: `default` with an empty password, or no credentials at all.
    pub fn default_only() -> Users {
        Users::default()
    }

    /// The `[users]` table of a config file: user name to verifier.
    pub fn from_config(users: &BTreeMap<String, String>) -> Result<Users, AuthError> {
        let mut configured = BTreeMap::new();
        for (user, text) in users {
            if user.is_empty() || user.contains(':') {
                return Err(AuthError::BadVerifier {
                    user: user.clone(),
                    reason: "a user name must be non-empty and must not contain ':'".into(),
                });
            }
            let verifier =
                Verifier::parse(text).map_err(|reason| AuthError::BadVerifier { user: user.clone(), reason })?;
            configured.insert(user.clone(), verifier);
        }
        Ok(Users { configured, passed: Mutex::default(), mock_key: rand::random() })
    }

    /// True when the config names users (and `default` is no longer implied).
    pub fn is_configured(&self) -> bool {
        !self.configured.is_empty()
    }

    /// The configured users' names.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.configured.keys().map(String::as_str)
    }

    /// The verifier of a configured user.
    pub fn verifier(&self, user: &str) -> Option<&Verifier> {
        self.configured.get(user)
    }

    /// The verifier of `user`, or, for a user that does not exist, a made-up one that no
    /// password matches, with a salt of its own that stays the same while the node runs: an
    /// unknown user then takes the same exchange, and as long to refuse, as a wrong password, as
    /// in PostgreSQL (it was refused before any salt was sent, and without a key derivation, so
    /// a client could tell which users exist).
    pub fn verifier_or_mock(&self, user: &str) -> Verifier {
        if let Some(verifier) = self.verifier(user) {
            return verifier.clone();
        }
        let part = |what: &[u8]| -> Vec<u8> {
            Sha256::new()
                .chain_update(self.mock_key)
                .chain_update(what)
                .chain_update(user.as_bytes())
                .finalize()
                .to_vec()
        };
        let mut salt = part(b"salt");
        salt.truncate(SCRAM_SALT_BYTES);
        Verifier { iterations: SCRAM_ITERATIONS, salt, stored_key: part(b"stored"), server_key: part(b"server") }
    }

    /// Admits a client that sent no credentials only while no users are configured.
    pub fn check_anonymous(&self) -> Result<(), AuthError> {
        if self.is_configured() { Err(AuthError::CredentialsRequired) } else { Ok(()) }
    }

    /// Admits a user that is allowed to log in without a password exchange (the PostgreSQL
    /// endpoint while no users are configured).
    pub fn check_passwordless(&self, user: &str) -> Result<(), AuthError> {
        if self.is_configured() {
            Err(AuthError::CredentialsRequired)
        } else if user == DEFAULT_USER {
            Ok(())
        } else {
            Err(AuthError::NoSuchDefaultUser { user: user.to_string() })
        }
    }

    /// Checks a user name and password.
    pub fn check_password(&self, user: &str, password: &str) -> Result<(), AuthError> {
        if !self.is_configured() {
            return match (user == DEFAULT_USER, password.is_empty()) {
                (true, true) => Ok(()),
                (true, false) => Err(AuthError::DefaultPasswordNotEmpty),
                (false, _) => Err(AuthError::NoSuchDefaultUser { user: user.to_string() }),
            };
        }
        let failed = || AuthError::Failed { user: user.to_string() };
        // An unknown user's password is checked against a made-up verifier, which fails: the same
        // work, and the same answer, as a wrong password.
        let verifier = self.verifier_or_mock(user);
        let digest: [u8; 32] = Sha256::digest(password.as_bytes()).into();
        if self.lock().get(user).is_some_and(|d| constant_time_eq(d, &digest)) {
            return Ok(());
        }
        if !verifier.matches(password) {
            return Err(failed());
        }
        let mut passed = self.lock();
        if passed.len() >= PASSWORD_CACHE_ENTRIES {
            passed.clear();
        }
        passed.insert(user.to_string(), digest);
        Ok(())
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, [u8; 32]>> {
        self.passed.lock().unwrap_or_else(|p| p.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An unknown user has a verifier of its own (stable, unlike another user's) that no password
    /// matches, and is refused as a wrong password is.
    #[test]
    fn an_unknown_user_is_refused_as_a_wrong_password_is() {
        let alice = Verifier::generate("secret").to_string();
        let users = Users::from_config(&[("alice".to_string(), alice)].into()).unwrap();
        let (mallory, again, zoe) =
            (users.verifier_or_mock("mallory"), users.verifier_or_mock("mallory"), users.verifier_or_mock("zoe"));
        assert!(mallory == again && mallory.salt != zoe.salt && mallory.salt.len() == SCRAM_SALT_BYTES);
        assert!(!mallory.matches("") && !mallory.matches("secret"));
        let wrong = users.check_password("alice", "nope").unwrap_err();
        let unknown = users.check_password("mallory", "nope").unwrap_err();
        assert_eq!(
            (wrong.to_string(), unknown.to_string()),
            (
                "password authentication failed for user \"alice\"".to_string(),
                "password authentication failed for user \"mallory\"".to_string()
            )
        );
        assert!(users.check_password("alice", "secret").is_ok());
    }

    /// RFC 7677 section 3: user "user", password "pencil", salt and iterations of the example.
    #[test]
    fn derives_the_rfc_7677_keys() {
        let salt = STANDARD.decode("W22ZaJ0SNY7soEsUEjb6gQ==").unwrap();
        let v = Verifier::derive("pencil", &salt, 4096);
        // Computed independently with Python's hashlib.pbkdf2_hmac and hmac.
        let want = "SCRAM-SHA-256$4096:W22ZaJ0SNY7soEsUEjb6gQ==$WG5d8oPm3OtcPnkdi4Uo7BkeZkBFzpcXkuLmtbsT4qY=:\
                    wfPLwcE6nTWhTAmQ7tl2KeoiWGPlZqQxSrmfPwDl2dU=";
        assert_eq!(v.to_string(), want);
        assert_eq!(Verifier::parse(want).unwrap(), v);
        assert!(v.matches("pencil"));
        assert!(!v.matches("pencil "));
    }

    #[test]
    fn rejects_malformed_verifiers() {
        for (text, want) in [
            ("md5abc", "not a SCRAM-SHA-256"),
            ("SCRAM-SHA-256$x:AAAA$AAAA:AAAA", "not a number"),
            ("SCRAM-SHA-256$10:AAAA$AAAA:AAAA", "fewer than the minimum"),
            ("SCRAM-SHA-256$4096:!!$AAAA:AAAA", "salt is not base64"),
            ("SCRAM-SHA-256$4096:AAAA$AAAA:AAAA", "32 bytes"),
            ("SCRAM-SHA-256$4096", "expected SCRAM-SHA-256$"),
        ] {
            let e = Verifier::parse(text).unwrap_err();
            assert!(e.contains(want), "{text}: {e}");
        }
    }

    #[test]
    fn default_only_admits_default_with_empty_password() {
        let users = Users::default_only();
        assert!(users.check_password("default", "").is_ok());
        assert!(users.check_anonymous().is_ok());
        assert_eq!(users.check_password("default", "x"), Err(AuthError::DefaultPasswordNotEmpty));
        let e = users.check_password("admin", "").unwrap_err();
        assert!(e.to_string().contains("unknown user \"admin\""), "{e}");
        assert!(users.check_passwordless("default").is_ok());
        assert!(users.check_passwordless("admin").is_err());
    }

    #[test]
    fn configured_users_need_their_password() {
        let v = Verifier::generate("s3cret");
        let config = BTreeMap::from([("alice".to_string(), v.to_string())]);
        let users = Users::from_config(&config).unwrap();
        assert!(users.is_configured());
        assert_eq!(users.check_anonymous(), Err(AuthError::CredentialsRequired));
        assert_eq!(users.check_passwordless("default"), Err(AuthError::CredentialsRequired));
        assert!(users.check_password("alice", "s3cret").is_ok());
        // Again, from the memory of passed checks.
        assert!(users.check_password("alice", "s3cret").is_ok());
        assert_eq!(users.check_password("alice", "wrong"), Err(AuthError::Failed { user: "alice".into() }));
        assert_eq!(users.check_password("default", ""), Err(AuthError::Failed { user: "default".into() }));
        assert_eq!(users.check_password("bob", "s3cret"), Err(AuthError::Failed { user: "bob".into() }));
    }

    #[test]
    fn a_bad_config_names_the_user() {
        let config = BTreeMap::from([("carol".to_string(), "plain-password".to_string())]);
        let e = Users::from_config(&config).unwrap_err();
        assert!(e.to_string().starts_with("user \"carol\": not a SCRAM-SHA-256 verifier"), "{e}");
        let config = BTreeMap::from([("a:b".to_string(), Verifier::generate("x").to_string())]);
        assert!(Users::from_config(&config).is_err());
    }
}
