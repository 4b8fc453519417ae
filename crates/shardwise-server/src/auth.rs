//! The `authorization` header of Flight SQL and HTTP requests: Basic credentials, checked against
//! [`crate::users::Users`], or a bearer token from an earlier Flight SQL handshake.

use tonic::Status;
use tonic::metadata::MetadataMap;

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
}
