//! The one error type of the server crate: what can stop an endpoint from starting or serving;
//! and [`with_causes`], how an error and its causes become one line of text.

/// Failure to start or run a network endpoint.
#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    /// The Flight SQL server failed (bad listener, fatal transport error).
    #[error("flight sql server failed: {0}")]
    Transport(#[from] tonic::transport::Error),
    /// The static server description (`GetSqlInfo`) could not be built.
    #[error("cannot build the flight sql server description: {0}")]
    SqlInfo(#[source] arrow_flight::error::FlightError),
    /// The HTTP server failed.
    #[error("http server failed: {0}")]
    Http(#[source] std::io::Error),
}

/// `message`, then each of `causes` not already in the text: the layers of an error chain often
/// repeat one another (`reading x: disk gone`, then `disk gone`; tonic's `http2 error: transport
/// error: http2 error`), and each is said once.
pub fn with_causes(message: String, causes: impl IntoIterator<Item = String>) -> String {
    causes.into_iter().fold(message, |mut text, cause| {
        if !text.contains(&cause) {
            text.push_str(": ");
            text.push_str(&cause);
        }
        text
    })
}

#[cfg(test)]
mod tests {
    #[test]
    fn each_cause_is_said_once() {
        let causes = ["disk gone", "http2 error", "keep-alive timed out"].map(String::from);
        assert_eq!(
            super::with_causes("reading x: disk gone".into(), causes),
            "reading x: disk gone: http2 error: keep-alive timed out"
        );
    }
}
