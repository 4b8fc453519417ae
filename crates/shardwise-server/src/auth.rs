//! Client authentication for the Flight SQL endpoint.
//!
//! Until users are configured, shardwise behaves as ClickHouse does out of the box: the only user
//! is `default`, with an empty password, and clients may also connect without credentials. A
//! successful handshake returns a bearer token that later calls may present; any other user, a
//! wrong password, or a token this process did not issue is refused.

use tonic::Status;
use tonic::metadata::MetadataMap;

/// The only user that exists before users are configured.
pub const DEFAULT_USER: &str = "default";

/// What the `authorization` header of a request says.
#[derive(Debug, PartialEq, Eq)]
pub enum Credentials {
    /// No header: anonymous, allowed while no users are configured.
    Anonymous,
    /// `Basic base64(user:password)`.
    Basic { user: String, password: String },
    /// `Bearer token`, from an earlier handshake.
    Bearer(String),
}

/// Reads the `authorization` header.
pub fn credentials(metadata: &MetadataMap) -> Result<Credentials, Status> {
    let Some(value) = metadata.get("authorization") else {
        return Ok(Credentials::Anonymous);
    };
    let value = value.to_str().map_err(|_| Status::unauthenticated("authorization header is not ASCII"))?;
    parse_authorization(value)
}

/// Parses an `authorization` header value.
pub fn parse_authorization(value: &str) -> Result<Credentials, Status> {
    let (scheme, rest) = value.split_once(' ').unwrap_or((value, ""));
    let rest = rest.trim();
    if scheme.eq_ignore_ascii_case("basic") {
        let decoded =
            base64_decode(rest).ok_or_else(|| Status::unauthenticated("basic authorization is not valid base64"))?;
        let text =
            String::from_utf8(decoded).map_err(|_| Status::unauthenticated("basic authorization is not UTF-8"))?;
        let (user, password) = text
            .split_once(':')
            .ok_or_else(|| Status::unauthenticated("basic authorization must be base64 of user:password"))?;
        Ok(Credentials::Basic { user: user.to_string(), password: password.to_string() })
    } else if scheme.eq_ignore_ascii_case("bearer") {
        Ok(Credentials::Bearer(rest.to_string()))
    } else {
        Err(Status::unauthenticated(format!("unsupported authorization scheme {scheme:?} (use Basic or Bearer)")))
    }
}

/// Checks a user name and password against the (so far fixed) user list.
pub fn check_password(user: &str, password: &str) -> Result<(), Status> {
    if user == DEFAULT_USER && password.is_empty() {
        Ok(())
    } else if user == DEFAULT_USER {
        Err(Status::unauthenticated(format!("wrong password for user {DEFAULT_USER:?}")))
    } else {
        Err(Status::unauthenticated(format!(
            "unknown user {user:?}: no users are configured, only {DEFAULT_USER:?} (empty password)"
        )))
    }
}

/// Decodes standard base64, with or without `=` padding; `None` when malformed.
fn base64_decode(input: &str) -> Option<Vec<u8>> {
    use base64::Engine as _;
    use base64::engine::{DecodePaddingMode, GeneralPurpose, GeneralPurposeConfig};
    const LENIENT: GeneralPurpose = GeneralPurpose::new(
        &base64::alphabet::STANDARD,
        GeneralPurposeConfig::new().with_decode_padding_mode(DecodePaddingMode::Indifferent),
    );
    LENIENT.decode(input).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base64_round_trips_known_values() {
        assert_eq!(base64_decode("ZGVmYXVsdDo=").as_deref(), Some(&b"default:"[..]));
        assert_eq!(base64_decode("ZGVmYXVsdDo").as_deref(), Some(&b"default:"[..]));
        assert_eq!(base64_decode("YWJj").as_deref(), Some(&b"abc"[..]));
        assert_eq!(base64_decode("YQ==").as_deref(), Some(&b"a"[..]));
        assert_eq!(base64_decode("").as_deref(), Some(&b""[..]));
        assert_eq!(base64_decode("Y"), None);
        assert_eq!(base64_decode("Y!=="), None);
        assert_eq!(base64_decode("YQ==="), None);
    }

    #[test]
    fn parses_basic_and_bearer() {
        assert_eq!(
            parse_authorization("Basic ZGVmYXVsdDo=").ok(),
            Some(Credentials::Basic { user: "default".into(), password: String::new() })
        );
        assert_eq!(parse_authorization("Bearer abc").ok(), Some(Credentials::Bearer("abc".into())));
        assert!(parse_authorization("Digest x").is_err());
        assert!(parse_authorization("Basic ###").is_err());
    }

    #[test]
    fn only_default_with_empty_password() {
        assert!(check_password("default", "").is_ok());
        let e = check_password("default", "x").unwrap_err();
        assert_eq!(e.code(), tonic::Code::Unauthenticated);
        let e = check_password("admin", "").unwrap_err();
        assert!(e.message().contains("unknown user \"admin\""), "{}", e.message());
    }
}
