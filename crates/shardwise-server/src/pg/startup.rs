//! Connection startup on the PostgreSQL endpoint: the database must be `shardwise`; while no
//! users are configured only `default` may connect, without a password (as ClickHouse's
//! `default` user); once users are configured, every connection runs SCRAM-SHA-256 against the
//! user's verifier, as PostgreSQL does (the client proves it knows the password, which never
//! crosses the wire, and the server proves it holds the verifier).

use std::fmt::Debug;
use std::sync::Arc;

use async_trait::async_trait;
use futures::Sink;
use pgwire::api::ClientInfo;
use pgwire::api::ConnectionManager;
use pgwire::api::auth::noop::NoopStartupHandler;
use pgwire::api::auth::sasl::SASLAuthStartupHandler;
use pgwire::api::auth::sasl::scram::{ScramAuth, ScramSecret};

use super::cancel::Cancels;
use pgwire::api::auth::{AuthSource, DefaultServerParameterProvider, LoginInfo, Password, StartupHandler};
use pgwire::error::{ErrorInfo, PgWireError, PgWireResult};
use pgwire::messages::{PgWireBackendMessage, PgWireFrontendMessage};

use super::PG_DATABASE;
use crate::users::Users;

/// The startup handler shared by all connections of a node.
pub struct Startup {
    users: Arc<Users>,
    scram: SASLAuthStartupHandler<DefaultServerParameterProvider>,
    trust: Trust,
    /// Every connection that has started, by the process id and secret key it was given, for
    /// cancel requests (`super::cancel`).
    cancels: Arc<Cancels>,
}

impl Startup {
    pub fn new(users: Arc<Users>) -> Startup {
        let connections = Arc::new(ConnectionManager::new());
        let scram = ScramAuth::new(Arc::new(Verifiers(Arc::clone(&users))));
        let scram = SASLAuthStartupHandler::new(Arc::new(DefaultServerParameterProvider::default()))
            .with_scram(scram)
            .with_connection_manager(Arc::clone(&connections));
        let cancels = Arc::new(Cancels::new(Arc::clone(&connections)));
        Startup { users, scram, trust: Trust(connections), cancels }
    }

    /// The registry of started connections, for cancel requests.
    pub fn cancels(&self) -> Arc<Cancels> {
        Arc::clone(&self.cancels)
    }
}

/// A `FATAL` error: the connection ends after it.
fn fatal(code: &str, message: String) -> PgWireError {
    PgWireError::UserError(Box::new(ErrorInfo::new("FATAL".to_string(), code.to_string(), message)))
}

#[async_trait]
impl StartupHandler for Startup {
    async fn on_startup<C>(&self, client: &mut C, message: PgWireFrontendMessage) -> PgWireResult<()>
    where
        C: ClientInfo + Sink<PgWireBackendMessage> + Unpin + Send + Sync,
        C::Error: Debug,
        PgWireError: From<<C as Sink<PgWireBackendMessage>>::Error>,
    {
        if let PgWireFrontendMessage::Startup(startup) = &message {
            let user = startup.parameters.get("user").cloned().unwrap_or_default();
            // PostgreSQL's rule: no database named means the database named as the user.
            let database = startup.parameters.get("database").cloned().unwrap_or_else(|| user.clone());
            if database != PG_DATABASE {
                return Err(fatal(
                    "3D000",
                    format!(
                        "database \"{database}\" does not exist (a shardwise node serves database \"{PG_DATABASE}\")"
                    ),
                ));
            }
            if !self.users.is_configured() {
                self.users.check_passwordless(&user).map_err(|e| fatal("28000", e.to_string()))?;
            }
        }
        if self.users.is_configured() {
            // libpq leaves the user name out of its SCRAM messages (the server knows it from
            // the startup message), so name the user the connection started as.
            // In PostgreSQL's words (pgwire capitalises them), which tools match on.
            self.scram.on_startup(client, message).await.map_err(|e| match e {
                PgWireError::InvalidPassword(_) => {
                    let user = client.metadata().get(pgwire::api::METADATA_USER).cloned().unwrap_or_default();
                    fatal("28P01", format!("password authentication failed for user \"{user}\""))
                }
                other => other,
            })
        } else {
            self.trust.on_startup(client, message).await
        }
    }
}

/// Startup without a password exchange (no users configured).
struct Trust(Arc<ConnectionManager>);

impl NoopStartupHandler for Trust {
    fn connection_manager(&self) -> Option<Arc<ConnectionManager>> {
        Some(Arc::clone(&self.0))
    }
}

/// The configured users' SCRAM verifiers.
#[derive(Debug)]
struct Verifiers(Arc<Users>);

#[async_trait]
impl AuthSource for Verifiers {
    async fn get_password(&self, login: &LoginInfo) -> PgWireResult<Password> {
        // Only SCRAM is offered, and it asks for the verifier below; no password is kept.
        Err(PgWireError::InvalidPassword(login.user().unwrap_or_default().to_string()))
    }

    async fn get_scram_secret(&self, login: &LoginInfo) -> PgWireResult<(ScramSecret, Option<()>)> {
        let user = login.user().unwrap_or_default();
        // An unknown user gets a made-up verifier (a salt of its own, no matching password), so
        // the exchange fails at the proof, as for a wrong password (see `Users::verifier_or_mock`).
        Ok((self.0.verifier_or_mock(user).scram_secret(), None))
    }
}
