//! Settings a client gives in its startup packet's `options` (libpq's `options='-c
//! statement_timeout=5000'`, SQLAlchemy's `connect_args={"options": ...}`), applied to the
//! connection's session before its first statement, as PostgreSQL applies them.
//!
//! Why: they were ignored without a word, so a timeout a client set this way never fired. Each is
//! now applied as `SET name = 'value'` would be (PostgreSQL's client parameters that `SET` takes
//! and ignores, such as `application_name`, are taken and ignored here too); a setting that `SET`
//! refuses refuses the connection, naming it, as PostgreSQL refuses an unknown one.

use std::fmt::Debug;
use std::sync::Arc;

use async_trait::async_trait;
use futures::Sink;
use pgwire::api::ClientInfo;
use pgwire::api::auth::StartupHandler;
use pgwire::error::{ErrorInfo, PgWireError, PgWireResult};
use pgwire::messages::{PgWireBackendMessage, PgWireFrontendMessage};

use super::Handler;
use super::startup::Startup;

/// One connection's startup: its `options` applied to its session, then the node's startup.
pub struct ConnectionStartup {
    pub shared: Arc<Startup>,
    pub handler: Arc<Handler>,
}

#[async_trait]
impl StartupHandler for ConnectionStartup {
    async fn on_startup<C>(&self, client: &mut C, message: PgWireFrontendMessage) -> PgWireResult<()>
    where
        C: ClientInfo + Sink<PgWireBackendMessage> + Unpin + Send + Sync,
        C::Error: Debug,
        PgWireError: From<<C as Sink<PgWireBackendMessage>>::Error>,
    {
        if let PgWireFrontendMessage::Startup(startup) = &message
            && let Some(options) = startup.parameters.get("options")
        {
            let settings = parse(options).map_err(|why| fatal("42601", format!("startup options: {why}")))?;
            for (name, value) in settings {
                self.handler
                    .apply_startup_setting(&name, &value)
                    .await
                    .map_err(|e| fatal("42704", format!("startup option {name}={value}: {e}")))?;
            }
        }
        self.shared.on_startup(client, message).await
    }
}

fn fatal(code: &str, message: String) -> PgWireError {
    PgWireError::UserError(Box::new(ErrorInfo::new("FATAL".to_string(), code.to_string(), message)))
}

/// The `name=value` pairs of an `options` string: words split at white space (a backslash makes
/// the next character part of the word, as PostgreSQL reads them), each `-c name=value`,
/// `-cname=value` or `--name=value`; anything else is refused.
pub fn parse(options: &str) -> Result<Vec<(String, String)>, String> {
    let mut words = Vec::new();
    let (mut word, mut chars) = (String::new(), options.chars());
    while let Some(c) = chars.next() {
        match c {
            '\\' => word.extend(chars.next()),
            c if c.is_whitespace() => {
                if !word.is_empty() {
                    words.push(std::mem::take(&mut word));
                }
            }
            c => word.push(c),
        }
    }
    if !word.is_empty() {
        words.push(word);
    }
    let mut pairs = Vec::new();
    let mut words = words.into_iter();
    while let Some(word) = words.next() {
        let setting = if word == "-c" {
            words.next().ok_or("-c without a setting after it")?
        } else if let Some(rest) = word.strip_prefix("--").or_else(|| word.strip_prefix("-c")) {
            rest.to_string()
        } else {
            return Err(format!("{word:?} is not -c name=value (the only option shardwise takes)"));
        };
        let (name, value) = setting.split_once('=').ok_or_else(|| format!("{setting:?} is not name=value"))?;
        // `--statement-timeout=...` is PostgreSQL's spelling of `statement_timeout`.
        let name = name.replace('-', "_");
        if name.is_empty() || !name.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.')) {
            return Err(format!("{name:?} is not a setting name"));
        }
        pairs.push((name, value.to_string()));
    }
    Ok(pairs)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn options_are_read_as_postgresql_reads_them() {
        let pairs = parse("-c statement_timeout=5000  -cDateStyle=ISO --search-path=a\\ b").unwrap();
        assert_eq!(
            pairs,
            vec![
                ("statement_timeout".to_string(), "5000".to_string()),
                ("DateStyle".to_string(), "ISO".to_string()),
                ("search_path".to_string(), "a b".to_string()),
            ]
        );
        assert!(parse("").unwrap().is_empty());
        assert!(parse("-c").unwrap_err().contains("-c without a setting"));
        assert!(parse("-x 1").unwrap_err().contains("is not -c name=value"));
        assert!(parse("-c nothing").unwrap_err().contains("is not name=value"));
        assert!(parse("-c a;b=1").unwrap_err().contains("is not a setting name"));
    }
}
