//! The Arrow Flight SQL endpoint: how ADBC, JDBC and `shardwise sql` clients talk to a node.
//!
//! Flight SQL splits a query in two calls: `GetFlightInfo` returns the result schema and a
//! ticket, `DoGet` redeems the ticket for the rows. The ticket (and a prepared statement's handle)
//! of a query carries its SQL text and names the plan `GetFlightInfo` made, which `DoGet` runs
//! (planned again from the text when the plan is gone: `flight_plans`); a statement run for its
//! effect ran at `GetFlightInfo`, and its ticket names its result (`executed`). A prepared
//! statement's handle is its SQL text and bound values.
//! All failures become a `tonic::Status` in [`to_status`].

use std::collections::HashMap;
use std::pin::Pin;
use std::sync::{Arc, Mutex};

use arrow::datatypes::SchemaRef;
use arrow::ipc::writer::IpcWriteOptions;
use arrow_flight::encode::FlightDataEncoderBuilder;
use arrow_flight::error::FlightError;
use arrow_flight::flight_service_server::FlightService;
use arrow_flight::sql::metadata::{SqlInfoData, SqlInfoDataBuilder};
use arrow_flight::sql::server::{DoPutError, FlightSqlService, PeekableFlightDataStream};
use arrow_flight::sql::{
    ActionClosePreparedStatementRequest, ActionCreatePreparedStatementRequest, ActionCreatePreparedStatementResult,
    CommandGetCatalogs, CommandGetDbSchemas, CommandGetSqlInfo, CommandGetTableTypes, CommandGetTables,
    CommandPreparedStatementQuery, CommandPreparedStatementUpdate, CommandStatementIngest, CommandStatementQuery,
    CommandStatementUpdate, DoPutPreparedStatementResult, ProstMessageExt, SqlInfo, TicketStatementQuery,
};
use arrow_flight::{
    Action, FlightDescriptor, FlightEndpoint, FlightInfo, HandshakeRequest, HandshakeResponse, IpcMessage, SchemaAsIpc,
    Ticket,
};
use datafusion::arrow::array::{Array, UInt64Array};
use datafusion::execution::SendableRecordBatchStream;
use futures::{Stream, StreamExt, TryStreamExt};
use prost::Message;
use shardwise_query::error::Stopped;
use shardwise_query::{Planned, QueryEngine, QueryError, Session};
use tonic::metadata::{MetadataMap, MetadataValue};
use tonic::{Request, Response, Status, Streaming};

use crate::auth::{self, Credentials};
use crate::connections::{Sessions, connection_id};
use crate::error::ServerError;
use crate::executed::{Executed, ExecutedResults};
use crate::flight_metadata;
use crate::flight_plans::{PlannedQueries, PlannedQuery, Redeemed};
use crate::users::{AuthError, DEFAULT_USER, Users};

/// Name reported in `GetSqlInfo`.
pub const SERVER_NAME: &str = "shardwise";

type DoGetStream = <FlightSqlEndpoint as FlightService>::DoGetStream;
type HandshakeStream = Pin<Box<dyn Stream<Item = Result<HandshakeResponse, Status>> + Send>>;

/// Maps a query-layer error to the status a client sees. The one place this mapping lives.
pub(crate) fn to_status(e: QueryError) -> Status {
    if let QueryError::Unavailable(m) = &e {
        Status::unavailable(format!("unavailable: {m}"))
    } else if let Some(stopped) = e.stopped() {
        match stopped {
            Stopped::TimedOut => Status::deadline_exceeded(e.to_string()),
            Stopped::Killed => Status::cancelled(e.to_string()),
        }
    } else if e.is_user_error() {
        Status::invalid_argument(e.to_string())
    } else {
        tracing::warn!(error = %e, "query failed");
        Status::internal(e.to_string())
    }
}

/// Serves Flight SQL on top of a [`QueryEngine`].
pub struct FlightSqlEndpoint {
    engine: Arc<QueryEngine>,
    /// Who may connect, and the session tokens handed out.
    gate: Gate,
    sql_info: SqlInfoData,
    /// One per client connection (what `SET` changed).
    sessions: Arc<Sessions>,
    /// Results of statements run when submitted, until fetched.
    executed: ExecutedResults,
    planned: PlannedQueries,
}

/// Who may call: the configured users, and the bearer tokens `Handshake` handed out (one per
/// user and process, token to user).
#[derive(Clone)]
pub struct Gate {
    users: Arc<Users>,
    tokens: Arc<Mutex<HashMap<String, String>>>,
}

impl Gate {
    /// Admits a call by its headers: a user and password, a bearer token from our handshake,
    /// or no credentials while no users are configured. Returns the user.
    pub fn authorize(&self, metadata: &MetadataMap) -> Result<String, Status> {
        let refused = |e: AuthError| Status::unauthenticated(e.to_string());
        match auth::credentials(metadata)? {
            Credentials::Anonymous => self.users.check_anonymous().map(|()| DEFAULT_USER.to_string()).map_err(refused),
            Credentials::Basic { user, password } => {
                self.users.check_password(&user, &password).map_err(refused)?;
                Ok(user)
            }
            Credentials::Bearer(token) => self.tokens().get(&token).cloned().ok_or_else(|| {
                Status::unauthenticated("unknown session token (the server may have restarted): handshake again")
            }),
        }
    }

    fn tokens(&self) -> std::sync::MutexGuard<'_, HashMap<String, String>> {
        self.tokens.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl std::fmt::Debug for FlightSqlEndpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FlightSqlEndpoint").field("engine", &self.engine).finish_non_exhaustive()
    }
}

impl FlightSqlEndpoint {
    pub fn new(engine: Arc<QueryEngine>, sessions: Arc<Sessions>, users: Arc<Users>) -> Result<Self, ServerError> {
        let mut info = SqlInfoDataBuilder::new();
        info.append(SqlInfo::FlightSqlServerName, SERVER_NAME);
        info.append(SqlInfo::FlightSqlServerVersion, env!("CARGO_PKG_VERSION"));
        // Arrow format version (Schema.fbs MetadataVersion V5 is format 1.3 and later).
        info.append(SqlInfo::FlightSqlServerArrowVersion, "1.3");
        let sql_info = info.build().map_err(ServerError::SqlInfo)?;
        Ok(FlightSqlEndpoint {
            engine,
            gate: Gate { users, tokens: Arc::default() },
            sql_info,
            sessions,
            executed: crate::executed::executed_results(),
            planned: PlannedQueries::default(),
        })
    }

    /// Admits a call: a user and password, a bearer token from our handshake, or no credentials
    /// while no users are configured. Returns the user.
    fn authorize(&self, metadata: &MetadataMap) -> Result<String, Status> {
        self.gate.authorize(metadata)
    }

    /// What admits calls, for a check before a call's message is read (`crate::serve_flight`).
    pub fn gate(&self) -> Gate {
        self.gate.clone()
    }

    /// The bearer token of `user`, made on first use.
    fn token_of(&self, user: &str) -> String {
        let mut tokens = self.tokens();
        if let Some((token, _)) = tokens.iter().find(|(_, u)| *u == user) {
            return token.clone();
        }
        let token = uuid::Uuid::new_v4().simple().to_string();
        tokens.insert(token.clone(), user.to_string());
        token
    }

    fn tokens(&self) -> std::sync::MutexGuard<'_, HashMap<String, String>> {
        self.gate.tokens()
    }

    /// The session of the connection `request` came on.
    fn session<T>(&self, request: &Request<T>) -> Arc<Session> {
        self.sessions.session(connection_id(request))
    }

    /// Plans `sql` in `session` and runs it.
    async fn run(&self, sql: &str, session: &Arc<Session>) -> Result<SendableRecordBatchStream, Status> {
        let planned = self.engine.plan_to_run(sql, session).await.map_err(to_status)?;
        self.engine.execute(planned).await.map_err(to_status)
    }

    /// Plans `sql` in `session` and runs it, its batches in the schema `GetFlightInfo` announced
    /// for it (see `flight_schema`).
    async fn run_as_announced(&self, sql: &str, session: &Arc<Session>) -> Result<SendableRecordBatchStream, Status> {
        let planned = self.engine.plan_to_run(sql, session).await.map_err(to_status)?;
        let schema = crate::flight_schema::announced(&planned.schema());
        self.run_planned(planned, schema).await
    }

    /// Runs `planned`, its batches in the announced `schema`.
    async fn run_planned(&self, planned: Planned, schema: SchemaRef) -> Result<SendableRecordBatchStream, Status> {
        let stream = self.engine.execute(planned).await.map_err(to_status)?;
        let target = Arc::clone(&schema);
        let batches = stream.map(move |batch| {
            batch.and_then(|b| {
                crate::flight_schema::conform(b, &target).map_err(datafusion::error::DataFusionError::from)
            })
        });
        Ok(Box::pin(datafusion::physical_plan::stream::RecordBatchStreamAdapter::new(schema, batches)))
    }

    /// Plans `sql` and describes its result with one endpoint, whose ticket names the plan
    /// (`keep_plan`) or else is `ticket`; a statement run for its effect runs now.
    async fn flight_info(
        &self,
        sql: &str,
        ticket: Ticket,
        keep_plan: bool,
        request: Request<FlightDescriptor>,
    ) -> Result<FlightInfo, Status> {
        let session = self.session(&request);
        let planned = self.engine.plan_to_run(sql, &session).await.map_err(to_status)?;
        let descriptor = request.into_inner();
        let schema = crate::flight_schema::announced(&planned.schema());
        let info = FlightInfo::new()
            .try_with_schema(&schema)
            .map_err(|e| Status::internal(format!("cannot encode the result schema: {e}")))?;
        let ticket = if planned.runs_for_effect() {
            // Run it now: a client may never fetch the result of DDL or an INSERT (executed.rs).
            let stream = self.engine.execute(planned).await.map_err(to_status)?;
            let batches: Vec<_> = stream.try_collect().await.map_err(|e| to_status(QueryError::from(e)))?;
            let batches = batches
                .into_iter()
                .map(|b| crate::flight_schema::conform(b, &schema))
                .collect::<Result<Vec<_>, _>>()
                .map_err(|e| Status::internal(format!("cannot send the statement's answer: {e}")))?;
            let handle = self.executed.put(Executed { schema, batches });
            Ticket::new(TicketStatementQuery { statement_handle: handle.into() }.as_any().encode_to_vec())
        } else if keep_plan {
            let handle = self.planned.keep(PlannedQuery { planned, schema, session }, sql);
            Ticket::new(TicketStatementQuery { statement_handle: handle.into() }.as_any().encode_to_vec())
        } else {
            ticket
        };
        Ok(info.with_endpoint(FlightEndpoint::new().with_ticket(ticket)).with_descriptor(descriptor))
    }

    /// Plans and runs `sql`, then streams its rows as Flight data.
    async fn do_get_sql(&self, sql: &str, session: &Arc<Session>) -> Result<Response<DoGetStream>, Status> {
        Ok(Response::new(encode(self.run_as_announced(sql, session).await?)))
    }

    /// Runs a statement for its effect; the affected row count when it reports one, else 0.
    async fn run_update(&self, sql: &str, session: &Arc<Session>) -> Result<i64, Status> {
        let stream = self.run(sql, session).await?;
        let batches: Vec<_> = stream.try_collect().await.map_err(|e| to_status(QueryError::from(e)))?;
        Ok(affected_rows(&batches))
    }
}

/// DataFusion reports DML as one `count: UInt64` column; anything else affected no rows.
fn affected_rows(batches: &[arrow::array::RecordBatch]) -> i64 {
    let mut total: u64 = 0;
    for batch in batches {
        let schema = batch.schema();
        if schema.fields().len() != 1 || schema.field(0).name() != "count" {
            return 0;
        }
        let Some(counts) = batch.column(0).as_any().downcast_ref::<UInt64Array>() else {
            return 0;
        };
        total = total.saturating_add(counts.iter().flatten().sum());
    }
    i64::try_from(total).unwrap_or(i64::MAX)
}

/// Turns a result stream into Flight data; the schema is sent even when there are no rows.
fn encode(stream: SendableRecordBatchStream) -> DoGetStream {
    let schema: SchemaRef = stream.schema();
    let batches = stream
        .map_ok(|batch| futures::stream::iter(crate::flight_split::split(batch).into_iter().map(Ok)))
        .map_err(|e| FlightError::Tonic(Box::new(to_status(QueryError::from(e)))))
        .try_flatten();
    let data = crate::flight_split::encoder().with_schema(schema).build(batches).map_err(Status::from);
    Box::pin(data)
}

/// The SQL carried by a ticket or handle.
fn sql_text(bytes: &[u8]) -> Result<&str, Status> {
    std::str::from_utf8(bytes).map_err(|_| Status::invalid_argument("statement is not UTF-8"))
}

#[tonic::async_trait]
impl FlightSqlService for FlightSqlEndpoint {
    type FlightService = FlightSqlEndpoint;

    async fn do_handshake(
        &self,
        request: Request<Streaming<HandshakeRequest>>,
    ) -> Result<Response<HandshakeStream>, Status> {
        let user = self.authorize(request.metadata())?;
        let token = self.token_of(&user);
        let reply = HandshakeResponse { protocol_version: 0, payload: token.clone().into() };
        let output: HandshakeStream = Box::pin(futures::stream::iter([Ok(reply)]));
        let mut response = Response::new(output);
        let bearer = MetadataValue::try_from(format!("Bearer {token}"))
            .map_err(|e| Status::internal(format!("cannot encode the session token: {e}")))?;
        response.metadata_mut().insert("authorization", bearer);
        Ok(response)
    }

    async fn get_flight_info_statement(
        &self,
        query: CommandStatementQuery,
        request: Request<FlightDescriptor>,
    ) -> Result<Response<FlightInfo>, Status> {
        self.authorize(request.metadata())?;
        let ticket = TicketStatementQuery { statement_handle: query.query.clone().into() };
        let ticket = Ticket::new(ticket.as_any().encode_to_vec());
        let info = self.flight_info(&query.query, ticket, true, request).await?;
        Ok(Response::new(info))
    }

    async fn get_flight_info_prepared_statement(
        &self,
        query: CommandPreparedStatementQuery,
        request: Request<FlightDescriptor>,
    ) -> Result<Response<FlightInfo>, Status> {
        self.authorize(request.metadata())?;
        let sql = crate::flight_params::Handle::parse(&query.prepared_statement_handle)?.runnable().to_string();
        let ticket = Ticket::new(query.as_any().encode_to_vec());
        let info = self.flight_info(&sql, ticket, false, request).await?;
        Ok(Response::new(info))
    }

    async fn get_flight_info_sql_info(
        &self,
        query: CommandGetSqlInfo,
        request: Request<FlightDescriptor>,
    ) -> Result<Response<FlightInfo>, Status> {
        self.authorize(request.metadata())?;
        let ticket = Ticket::new(query.as_any().encode_to_vec());
        let info = FlightInfo::new()
            .try_with_schema(query.into_builder(&self.sql_info).schema().as_ref())
            .map_err(|e| Status::internal(format!("cannot encode the sql info schema: {e}")))?
            .with_endpoint(FlightEndpoint::new().with_ticket(ticket))
            .with_descriptor(request.into_inner());
        Ok(Response::new(info))
    }

    async fn do_get_statement(
        &self,
        ticket: TicketStatementQuery,
        request: Request<Ticket>,
    ) -> Result<Response<DoGetStream>, Status> {
        self.authorize(request.metadata())?;
        if let Some((key, _)) = self.executed.split(&ticket.statement_handle) {
            let executed = self.executed.take(key).ok_or_else(|| {
                Status::not_found("the statement's result was fetched already or expired (it ran when submitted)")
            })?;
            let batches = futures::stream::iter(executed.batches.into_iter().map(Ok));
            let stream = datafusion::physical_plan::stream::RecordBatchStreamAdapter::new(executed.schema, batches);
            return Ok(Response::new(encode(Box::pin(stream))));
        }
        let session = self.session(&request);
        match self.planned.redeem(&ticket.statement_handle, &session) {
            Some(Redeemed::Plan(kept)) => {
                let PlannedQuery { planned, schema, .. } = *kept;
                Ok(Response::new(encode(self.run_planned(planned, schema).await?)))
            }
            Some(Redeemed::Sql(sql)) => self.do_get_sql(sql_text(sql)?, &session).await,
            None => self.do_get_sql(sql_text(&ticket.statement_handle)?, &session).await,
        }
    }

    async fn do_get_prepared_statement(
        &self,
        query: CommandPreparedStatementQuery,
        request: Request<Ticket>,
    ) -> Result<Response<DoGetStream>, Status> {
        self.authorize(request.metadata())?;
        let handle = crate::flight_params::Handle::parse(&query.prepared_statement_handle)?;
        self.do_get_sql(handle.runnable(), &self.session(&request)).await
    }

    async fn do_get_sql_info(
        &self,
        query: CommandGetSqlInfo,
        request: Request<Ticket>,
    ) -> Result<Response<DoGetStream>, Status> {
        self.authorize(request.metadata())?;
        let builder = query.into_builder(&self.sql_info);
        let schema = builder.schema();
        let batch = builder.build();
        let data = FlightDataEncoderBuilder::new()
            .with_schema(schema)
            .build(futures::stream::once(async { batch }))
            .map_err(Status::from);
        Ok(Response::new(Box::pin(data)))
    }

    async fn get_flight_info_catalogs(
        &self,
        query: CommandGetCatalogs,
        request: Request<FlightDescriptor>,
    ) -> Result<Response<FlightInfo>, Status> {
        self.authorize(request.metadata())?;
        let schema = flight_metadata::catalogs_schema(query);
        Ok(Response::new(flight_metadata::info(&query, &schema, request.into_inner())?))
    }

    async fn do_get_catalogs(
        &self,
        query: CommandGetCatalogs,
        request: Request<Ticket>,
    ) -> Result<Response<DoGetStream>, Status> {
        self.authorize(request.metadata())?;
        let schema = flight_metadata::catalogs_schema(query);
        Ok(Response::new(flight_metadata::answer(schema, flight_metadata::catalogs(&self.engine, query))))
    }

    async fn get_flight_info_schemas(
        &self,
        query: CommandGetDbSchemas,
        request: Request<FlightDescriptor>,
    ) -> Result<Response<FlightInfo>, Status> {
        self.authorize(request.metadata())?;
        let schema = flight_metadata::db_schemas_schema(query.clone());
        Ok(Response::new(flight_metadata::info(&query, &schema, request.into_inner())?))
    }

    async fn do_get_schemas(
        &self,
        query: CommandGetDbSchemas,
        request: Request<Ticket>,
    ) -> Result<Response<DoGetStream>, Status> {
        self.authorize(request.metadata())?;
        let schema = flight_metadata::db_schemas_schema(query.clone());
        Ok(Response::new(flight_metadata::answer(schema, flight_metadata::db_schemas(&self.engine, query))))
    }

    async fn get_flight_info_tables(
        &self,
        query: CommandGetTables,
        request: Request<FlightDescriptor>,
    ) -> Result<Response<FlightInfo>, Status> {
        self.authorize(request.metadata())?;
        let schema = flight_metadata::tables_schema(query.clone());
        Ok(Response::new(flight_metadata::info(&query, &schema, request.into_inner())?))
    }

    async fn do_get_tables(
        &self,
        query: CommandGetTables,
        request: Request<Ticket>,
    ) -> Result<Response<DoGetStream>, Status> {
        self.authorize(request.metadata())?;
        let schema = flight_metadata::tables_schema(query.clone());
        let batch = flight_metadata::tables(&self.engine, query).await;
        Ok(Response::new(flight_metadata::answer(schema, batch)))
    }

    async fn get_flight_info_table_types(
        &self,
        query: CommandGetTableTypes,
        request: Request<FlightDescriptor>,
    ) -> Result<Response<FlightInfo>, Status> {
        self.authorize(request.metadata())?;
        let schema = flight_metadata::table_types_schema(query);
        Ok(Response::new(flight_metadata::info(&query, &schema, request.into_inner())?))
    }

    async fn do_get_table_types(
        &self,
        query: CommandGetTableTypes,
        request: Request<Ticket>,
    ) -> Result<Response<DoGetStream>, Status> {
        self.authorize(request.metadata())?;
        let schema = flight_metadata::table_types_schema(query);
        Ok(Response::new(flight_metadata::answer(schema, flight_metadata::table_types(query))))
    }

    async fn do_put_statement_update(
        &self,
        command: CommandStatementUpdate,
        request: Request<PeekableFlightDataStream>,
    ) -> Result<i64, Status> {
        self.authorize(request.metadata())?;
        self.run_update(&command.query, &self.session(&request)).await
    }

    /// Runs an update once per row of parameters sent (`executemany`), or once without.
    async fn do_put_prepared_statement_update(
        &self,
        command: CommandPreparedStatementUpdate,
        request: Request<PeekableFlightDataStream>,
    ) -> Result<i64, Status> {
        self.authorize(request.metadata())?;
        let session = self.session(&request);
        let handle = crate::flight_params::Handle::parse(&command.prepared_statement_handle)?;
        let sql = handle.sql.clone();
        let rows = crate::flight_params::bound_rows(request.into_inner()).await?;
        if rows.is_empty() {
            return self.run_update(handle.runnable(), &session).await;
        }
        // A trailing `SETTINGS` clause applies to the insert as a whole, however its rows go in.
        let (body, settings) = shardwise_query::settings::split_settings_clause(&sql).map_err(to_status)?;
        let settings_text = sql.get(body.len()..).unwrap_or_default();
        // Placeholders alone: the rows go in as the Arrow columns they came in (`bound_insert`).
        let direct = self.engine.tables().and_then(|access| {
            let catalog = access.catalog();
            let insert = crate::bound_insert::bound_insert(&body, &catalog)?;
            let schema = catalog.tables.get(&insert.table)?.def.schema.clone();
            Some((insert, schema))
        });
        if let Some((insert, schema)) = direct {
            let statement = format!("INSERT INTO {}", insert.table);
            let nothing = "nothing was written";
            let batches = rows
                .iter()
                .map(|batch| crate::ingest_schema::conform_as(&statement, insert.rows(batch)?, &schema, nothing))
                .collect::<Result<Vec<_>, Status>>()?;
            let count: usize = batches.iter().map(|b| b.num_rows()).sum();
            let described = format!("{sql} ({count} rows of bound parameters)");
            let stored = self.engine.insert_batches(&insert.table, batches, &session, &settings, &described).await;
            return stored.map(|rows| i64::try_from(rows).unwrap_or(i64::MAX)).map_err(to_status);
        }
        if let Some((before, row_text)) = crate::flight_params::values_row(&body) {
            let mut bound = String::from(before);
            for (n, (batch, row)) in
                rows.iter().flat_map(|batch| (0..batch.num_rows()).map(move |row| (batch, row))).enumerate()
            {
                if n > 0 {
                    bound.push_str(", ");
                }
                bound.push_str(&crate::flight_params::bind_row(row_text, batch, row)?);
            }
            bound.push_str(settings_text);
            return self.run_update(&bound, &session).await;
        }
        let count: usize = rows.iter().map(|b| b.num_rows()).sum();
        if count > 1 && settings.iter().any(|(name, _)| name.eq_ignore_ascii_case("insert_id")) {
            return Err(Status::invalid_argument(format!(
                "this statement runs once per row of parameters ({count} rows), and one insert_id would make every \
                 run after the first a retry of it, dropped: give each row its own statement and insert_id, or \
                 write the insert as INSERT ... VALUES (?, ...), whose rows go in as one insert; nothing was run"
            )));
        }
        let mut affected: i64 = 0;
        for batch in &rows {
            for row in 0..batch.num_rows() {
                let bound = crate::flight_params::bind_row(&sql, batch, row)?;
                affected = affected.saturating_add(self.run_update(&bound, &session).await?);
            }
        }
        Ok(affected)
    }

    /// Binds a query's parameters: one row of values, spliced into the SQL, which comes back as
    /// the statement's new handle (see `flight_params`).
    async fn do_put_prepared_statement_query(
        &self,
        query: CommandPreparedStatementQuery,
        request: Request<PeekableFlightDataStream>,
    ) -> Result<DoPutPreparedStatementResult, Status> {
        self.authorize(request.metadata())?;
        let handle = crate::flight_params::Handle::parse(&query.prepared_statement_handle)?;
        let rows = crate::flight_params::bound_rows(request.into_inner()).await?;
        let bound = match rows.as_slice() {
            [] => return Ok(DoPutPreparedStatementResult { prepared_statement_handle: None }),
            [batch] if batch.num_rows() == 1 => crate::flight_params::bind_row(&handle.sql, batch, 0)?,
            _ => {
                let n: usize = rows.iter().map(|b| b.num_rows()).sum();
                return Err(Status::invalid_argument(format!(
                    "a query takes one row of parameters, {n} were sent (several rows are for updates)"
                )));
            }
        };
        Ok(DoPutPreparedStatementResult { prepared_statement_handle: Some(handle.with_bound(bound)?.into()) })
    }

    /// Bulk load (`shardwise load`, ADBC ingest): every batch is received and checked before
    /// anything is written, then inserted as one insert. Options: `insert_id` (idempotency key)
    /// and `expected_rows` (the row count the client sent; a mismatch means the stream was cut).
    async fn do_put_statement_ingest(
        &self,
        command: CommandStatementIngest,
        request: Request<PeekableFlightDataStream>,
    ) -> Result<i64, Status> {
        self.authorize(request.metadata())?;
        crate::ingest::ingest(&self.engine, command, request.into_inner()).await
    }

    /// A `DoPut` whose first message carries no command: said so, in words a user can act on.
    /// ADBC's bulk ingest of zero rows sends no message at all, so the server never learns the
    /// table or the mode, and nothing can be done (a table to create included).
    async fn do_put_error_callback(
        &self,
        request: Request<PeekableFlightDataStream>,
        error: DoPutError,
    ) -> Result<Response<<Self as FlightService>::DoPutStream>, Status> {
        self.authorize(request.metadata())?;
        Err(Status::invalid_argument(match error {
            DoPutError::MissingCommand => {
                "the upload was empty: no command and no rows arrived, so nothing was done (an ADBC \
                 bulk ingest of zero rows sends nothing; to create an empty table, send CREATE TABLE)"
                    .to_string()
            }
            DoPutError::MissingFlightDescriptor => {
                "the upload's first message has no flight descriptor naming the command; nothing was done".to_string()
            }
        }))
    }

    async fn do_action_create_prepared_statement(
        &self,
        query: ActionCreatePreparedStatementRequest,
        request: Request<Action>,
    ) -> Result<ActionCreatePreparedStatementResult, Status> {
        self.authorize(request.metadata())?;
        // With placeholders, the result is described as planned with NULLs for them; a statement
        // that cannot be planned so (a NULL where a type matters) is described once bound.
        let dataset_schema = match crate::flight_params::with_nulls(&query.query)? {
            None => {
                let planned = self.engine.plan(&query.query, &self.session(&request)).await.map_err(to_status)?;
                Some(crate::flight_schema::announced(&planned.schema()))
            }
            Some(nulls) => self
                .engine
                .plan(&nulls, &self.session(&request))
                .await
                .ok()
                .map(|p| crate::flight_schema::announced(&p.schema())),
        };
        let dataset_schema = match dataset_schema {
            Some(schema) => {
                let IpcMessage(bytes) = SchemaAsIpc::new(&schema, &IpcWriteOptions::default()).try_into().map_err(
                    |e: arrow::error::ArrowError| Status::internal(format!("cannot encode the result schema: {e}")),
                )?;
                bytes
            }
            None => Default::default(),
        };
        Ok(ActionCreatePreparedStatementResult {
            prepared_statement_handle: query.query.into(),
            dataset_schema,
            // Values are bound by the client's DoPut, whatever their types.
            parameter_schema: Default::default(),
        })
    }

    async fn do_action_close_prepared_statement(
        &self,
        _query: ActionClosePreparedStatementRequest,
        request: Request<Action>,
    ) -> Result<(), Status> {
        // The handle is the SQL itself: nothing is held, nothing to release.
        self.authorize(request.metadata()).map(drop)
    }

    async fn register_sql_info(&self, _id: i32, _result: &SqlInfo) {}
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::error::DataFusionError;

    #[test]
    fn user_errors_are_invalid_argument() {
        let status = to_status(QueryError::from(DataFusionError::Plan("no column x".into())));
        assert_eq!(status.code(), tonic::Code::InvalidArgument);
        assert_eq!(status.message(), "Error during planning: no column x");
    }

    #[test]
    fn stopped_queries_are_deadline_exceeded_or_cancelled() {
        let timed_out = "the query ran longer than max_execution_time_ms = 5 and was stopped";
        assert_eq!(to_status(QueryError::Rejected(timed_out.into())).code(), tonic::Code::DeadlineExceeded);
        let killed = "the query was stopped by KILL QUERY";
        assert_eq!(to_status(QueryError::Rejected(killed.into())).code(), tonic::Code::Cancelled);
    }

    #[test]
    fn internal_errors_are_internal() {
        let status = to_status(QueryError::from(DataFusionError::Internal("bug".into())));
        assert_eq!(status.code(), tonic::Code::Internal);
    }

    #[test]
    fn affected_rows_reads_a_count_column() {
        use arrow::array::{Int32Array, RecordBatch};
        let count =
            RecordBatch::try_from_iter([("count", Arc::new(UInt64Array::from(vec![3u64])) as _)]).expect("batch");
        assert_eq!(affected_rows(&[count.clone(), count]), 6);
        let other = RecordBatch::try_from_iter([("x", Arc::new(Int32Array::from(vec![1])) as _)]).expect("batch");
        assert_eq!(affected_rows(&[other]), 0);
        assert_eq!(affected_rows(&[]), 0);
    }
}
