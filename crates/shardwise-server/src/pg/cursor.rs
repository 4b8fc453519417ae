//! Server-side cursors: `DECLARE name CURSOR FOR query`, `FETCH`, `MOVE` and `CLOSE`.
//!
//! Why: drivers read a large answer a part at a time through a cursor (psycopg's named cursors,
//! SQLAlchemy's `stream_results`, pandas' `chunksize` over them); without one they failed with
//! `Unsupported SQL statement: DECLARE`.
//!
//! How: a cursor is a portal of the connection (pgwire's [`Portal::new_cursor`]), so the extended
//! protocol's Describe of it answers as PostgreSQL's does. Its query is planned at `DECLARE`
//! (errors then, nothing runs) and starts at the first `FETCH`; each `FETCH` takes the next rows
//! of the running query, so an open cursor holds the query's stream, not its answer (`FETCH n`
//! gathers its n rows; `FETCH ALL` and `MOVE ALL` stream the rest). Cursors
//! are forward only (PostgreSQL's `NO SCROLL`): `FETCH PRIOR`, `BACKWARD`, `ABSOLUTE`,
//! `RELATIVE`, `FIRST` and `LAST` are refused. A `FETCH` whose query fails part-way leaves the
//! cursor failed: every later `FETCH` says so (the rows after the error are lost), as
//! PostgreSQL's failed portals do. A cursor `WITHOUT HOLD` (the default) closes at
//! `COMMIT` or `ROLLBACK`, as in PostgreSQL; one `WITH HOLD` lasts until `CLOSE` or the end of
//! the connection. A connection holds at most [`MAX_CURSORS_PER_CONNECTION`].

use std::collections::HashMap;
use std::sync::Arc;

use datafusion::arrow::datatypes::SchemaRef;
use datafusion::sql::sqlparser::dialect::PostgreSqlDialect;
use datafusion::sql::sqlparser::tokenizer::{Token, Tokenizer};
use futures::StreamExt;
use pgwire::api::ClientPortalStore;
use pgwire::api::portal::{Format, Portal, PortalExecutionState};
use pgwire::api::results::{QueryResponse, Response, Tag};
use pgwire::api::stmt::StoredStatement;
use pgwire::api::store::{Entry, MemPortalStore, PortalStore};
use pgwire::error::PgWireResult;

use super::errors::{error, pg_error, syntax_error};
use super::{Handler, Statement, encode, show};

/// Open cursors a connection may hold (each holds a running query).
pub const MAX_CURSORS_PER_CONNECTION: usize = 64;

/// A cursor statement.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Command {
    Declare {
        name: String,
        hold: bool,
        query: String,
    },
    /// `FETCH` (rows sent) or `MOVE` (rows skipped).
    Fetch {
        name: String,
        count: Count,
        skip: bool,
    },
    /// `CLOSE name`, or `CLOSE ALL` (`None`).
    Close {
        name: Option<String>,
    },
}

/// How many rows a `FETCH` or `MOVE` takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Count {
    Rows(usize),
    All,
}

/// What a connection knows of its open cursors.
#[derive(Debug, Clone)]
pub struct CursorInfo {
    pub schema: SchemaRef,
    pub hold: bool,
    /// Why a `FETCH` failed part-way: the rows after it are lost, so the cursor answers no more.
    pub failed: Option<String>,
}

/// A connection's open cursors by name.
pub type Cursors = HashMap<String, CursorInfo>;

impl Handler {
    /// Runs a cursor statement (see the module doc).
    pub(super) async fn cursor<C>(
        &self,
        client: &C,
        command: Command,
        format: &Format,
        cancel: Option<tokio::sync::watch::Receiver<u64>>,
    ) -> PgWireResult<Response>
    where
        C: ClientPortalStore,
        C::PortalStore: PortalStore,
    {
        let portals = portals(client)?;
        match command {
            Command::Declare { name, hold, query } => {
                if self.open_cursors().contains_key(&name) {
                    return Err(error("42P03", format!("cursor \"{name}\" already exists")));
                }
                if self.open_cursors().len() >= MAX_CURSORS_PER_CONNECTION {
                    return Err(error(
                        "53000",
                        format!(
                            "too many open cursors: at most {MAX_CURSORS_PER_CONNECTION} per connection; CLOSE some"
                        ),
                    ));
                }
                // A catalog query (SQLAlchemy's, when it streams results) is read as `run` reads it.
                let query =
                    show::rewrite(&query).or_else(|| shardwise_query::pg_catalog::rewrite(&query)).unwrap_or(query);
                // Planned now, so that a bad query fails the DECLARE, as in PostgreSQL.
                let planned = self.engine.plan(&query, &self.session).await.map_err(pg_error)?;
                let schema = planned.postgres_schema();
                if schema.fields().is_empty() {
                    return Err(error("42P11", format!("cannot open a cursor for {query:?}: it returns no rows")));
                }
                let statement = Statement {
                    sql: query,
                    schema: Some(Arc::clone(&schema)),
                    parameters: false,
                    parameter_types: Vec::new(),
                };
                let stored = Arc::new(StoredStatement::new(name.clone(), statement, Vec::new()));
                portals.put_portal(Arc::new(Portal::new_cursor(name.clone(), stored)));
                self.open_cursors().insert(name, CursorInfo { schema, hold, failed: None });
                Ok(Response::Execution(Tag::new("DECLARE CURSOR")))
            }
            Command::Fetch { name, count, skip } => {
                let info = self.open_cursors().get(&name).cloned().ok_or_else(|| no_cursor(&name))?;
                if let Some(why) = &info.failed {
                    return Err(error(
                        "24000",
                        format!("cursor \"{name}\" failed in an earlier FETCH ({why}); CLOSE it and DECLARE it again"),
                    ));
                }
                let Some(Entry::Value(portal)) = portals.get_portal(&name) else { return Err(no_cursor(&name)) };
                let state = portal.state();
                let (started, finished) = match *state.lock().await {
                    PortalExecutionState::Initial => (false, false),
                    PortalExecutionState::Suspended(_) => (true, false),
                    PortalExecutionState::Finished => (true, true),
                };
                let tag = if skip { "MOVE" } else { "FETCH" };
                let max_rows = match count {
                    Count::All => usize::MAX,
                    Count::Rows(n) => n,
                };
                if finished || max_rows == 0 {
                    return Ok(match skip {
                        true => Response::Execution(Tag::new(tag).with_rows(0)),
                        false => {
                            let fields = Arc::new(encode::fields(&info.schema, format));
                            let mut empty = QueryResponse::new(fields, futures::stream::empty());
                            empty.set_command_tag(tag);
                            Response::Query(empty)
                        }
                    });
                }
                if !started {
                    // The query starts at the first FETCH and streams from then on.
                    let rows = self.query_rows(&portal.statement.statement.sql, format, cancel).await?;
                    portal.start(rows).await;
                }
                if count == Count::All {
                    // The rest of the answer streams, as a query's does: pgwire's `fetch` gathers
                    // it in memory first (a node's peak grew by 312 MB for `FETCH ALL` of 3M
                    // short rows, by 3 MB streamed).
                    let taken = std::mem::replace(&mut *state.lock().await, PortalExecutionState::Finished);
                    let PortalExecutionState::Suspended(rest) = taken else { return Err(no_cursor(&name)) };
                    let (fields, rows) = (Arc::clone(&rest.row_schema), rest.data_rows);
                    let cursors = Arc::clone(&self.cursors);
                    let rows = rows.inspect(move |row| {
                        if let Err(e) = row
                            && let Some(cursor) = cursors.lock().unwrap_or_else(|p| p.into_inner()).get_mut(&name)
                        {
                            cursor.failed = Some(e.to_string());
                        }
                    });
                    if skip {
                        let mut skipped = 0;
                        futures::pin_mut!(rows);
                        while let Some(row) = rows.next().await {
                            row?;
                            skipped += 1;
                        }
                        return Ok(Response::Execution(Tag::new(tag).with_rows(skipped)));
                    }
                    let mut all = QueryResponse::new(fields, rows);
                    all.set_command_tag(tag);
                    return Ok(Response::Query(all));
                }
                let mut fetched = match portal.fetch(max_rows).await {
                    Ok(fetched) => fetched,
                    Err(e) => {
                        // The query failed part-way: what follows would not be its answer.
                        portals.rm_portal(&name);
                        if let Some(cursor) = self.open_cursors().get_mut(&name) {
                            cursor.failed = Some(e.to_string());
                        }
                        return Err(e);
                    }
                };
                if skip {
                    let skipped = fetched.response.data_rows().count().await;
                    return Ok(Response::Execution(Tag::new(tag).with_rows(skipped)));
                }
                fetched.response.set_command_tag(tag);
                Ok(Response::Query(fetched.response))
            }
            Command::Close { name } => {
                let names: Vec<String> = match name {
                    Some(name) if self.open_cursors().contains_key(&name) => vec![name],
                    Some(name) => return Err(no_cursor(&name)),
                    None => self.open_cursors().keys().cloned().collect(),
                };
                for name in names {
                    portals.rm_portal(&name);
                    self.open_cursors().remove(&name);
                }
                Ok(Response::Execution(Tag::new("CLOSE CURSOR")))
            }
        }
    }

    /// Closes the cursors declared `WITHOUT HOLD`, at the end of a transaction.
    pub(super) fn end_transaction<C: ClientPortalStore>(&self, client: &C)
    where
        C::PortalStore: PortalStore,
    {
        let Ok(portals) = portals(client) else { return };
        self.open_cursors().retain(|name, info| {
            if !info.hold {
                portals.rm_portal(name);
            }
            info.hold
        });
    }

    /// The result columns of `FETCH` from an open cursor, for the extended protocol's Describe.
    pub(super) fn cursor_schema(&self, command: &Command) -> Option<SchemaRef> {
        match command {
            Command::Fetch { name, skip: false, .. } => self.open_cursors().get(name).map(|c| Arc::clone(&c.schema)),
            _ => None,
        }
    }

    fn open_cursors(&self) -> std::sync::MutexGuard<'_, Cursors> {
        self.cursors.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// The connection's portals, where cursors live.
fn portals<C: ClientPortalStore>(client: &C) -> PgWireResult<&MemPortalStore<Statement>>
where
    C::PortalStore: PortalStore,
{
    client
        .portal_store()
        .as_any()
        .downcast_ref::<MemPortalStore<Statement>>()
        .ok_or_else(|| syntax_error("cursors need the connection's portal store".into()))
}

fn no_cursor(name: &str) -> pgwire::error::PgWireError {
    error("34000", format!("cursor \"{name}\" does not exist"))
}

/// The statement as a cursor command: `None` when it is not one, an error message when it is
/// one that is malformed or asks for what shardwise does not do.
pub fn parse(sql: &str) -> Option<Result<Command, String>> {
    let tokens = Tokenizer::new(&PostgreSqlDialect {}, sql).tokenize().ok()?;
    let words: Vec<&Token> = tokens.iter().filter(|t| !matches!(t, Token::Whitespace(_))).collect();
    let first = keyword(words.first()?)?;
    match first.as_str() {
        "DECLARE" => Some(declare(&tokens)),
        "FETCH" | "MOVE" => Some(fetch(&words, first == "MOVE")),
        "CLOSE" => Some(close(&words)),
        _ => None,
    }
}

/// An unquoted word, upper-cased.
fn keyword(token: &Token) -> Option<String> {
    match token {
        Token::Word(w) if w.quote_style.is_none() => Some(w.value.to_ascii_uppercase()),
        _ => None,
    }
}

/// A cursor name as PostgreSQL reads it: quoted as written, unquoted in lower case.
fn name(token: Option<&&Token>) -> Result<String, String> {
    match token {
        Some(Token::Word(w)) if w.quote_style.is_some() => Ok(w.value.clone()),
        Some(Token::Word(w)) => Ok(w.value.to_ascii_lowercase()),
        other => Err(format!("expected a cursor name, found {}", other.map_or("the end".into(), |t| t.to_string()))),
    }
}

/// `DECLARE name [BINARY] [ASENSITIVE | INSENSITIVE] [[NO] SCROLL] CURSOR [{WITH | WITHOUT} HOLD]
/// FOR query`.
fn declare(tokens: &[Token]) -> Result<Command, String> {
    let mut rest = tokens.iter().enumerate().filter(|(_, t)| !matches!(t, Token::Whitespace(_)));
    rest.next(); // DECLARE
    let cursor_name = name(rest.next().map(|(_, t)| t).as_ref())?;
    let mut hold = false;
    let mut previous = String::new();
    for (i, token) in rest {
        let word = keyword(token).unwrap_or_default();
        match word.as_str() {
            "FOR" => {
                let query: String = tokens[i + 1..].iter().map(|t| t.to_string()).collect();
                let query = query.trim().trim_end_matches(';').trim().to_string();
                if query.is_empty() {
                    return Err("DECLARE ... CURSOR FOR needs a query".into());
                }
                return Ok(Command::Declare { name: cursor_name, hold, query });
            }
            "SCROLL" if previous != "NO" => {
                return Err("SCROLL cursors are not supported: shardwise cursors read forward only (NO SCROLL)".into());
            }
            "HOLD" => hold = previous == "WITH",
            "BINARY" | "ASENSITIVE" | "INSENSITIVE" | "NO" | "CURSOR" | "WITH" | "WITHOUT" | "SCROLL" => {}
            _ => {
                return Err(format!(
                    "unexpected {token} in DECLARE; expected DECLARE name CURSOR [WITH HOLD] FOR query"
                ));
            }
        }
        previous = word;
    }
    Err("DECLARE ... CURSOR needs FOR and a query".into())
}

/// `FETCH | MOVE [NEXT | FORWARD [count | ALL] | count | ALL] [FROM | IN] name`.
fn fetch(words: &[&Token], skip: bool) -> Result<Command, String> {
    let what = if skip { "MOVE" } else { "FETCH" };
    let mut i = 1;
    let mut count = Count::Rows(1);
    let number = |t: Option<&&Token>| match t {
        Some(Token::Number(n, _)) => n.parse::<usize>().ok(),
        _ => None,
    };
    match words.get(i).and_then(|t| keyword(t)).as_deref() {
        Some("NEXT") => i += 1,
        Some("ALL") => {
            count = Count::All;
            i += 1;
        }
        Some("FORWARD") => {
            i += 1;
            if let Some(n) = number(words.get(i)) {
                count = Count::Rows(n);
                i += 1;
            } else if words.get(i).and_then(|t| keyword(t)).as_deref() == Some("ALL") {
                count = Count::All;
                i += 1;
            }
        }
        Some(d @ ("PRIOR" | "FIRST" | "LAST" | "ABSOLUTE" | "RELATIVE" | "BACKWARD")) => {
            return Err(format!(
                "{what} {d} is not supported: shardwise cursors read forward only (NEXT, FORWARD n, n, ALL)"
            ));
        }
        _ => {
            if matches!(words.get(i), Some(Token::Minus)) {
                return Err(format!(
                    "{what} of a negative count is not supported: shardwise cursors read forward only"
                ));
            }
            if let Some(n) = number(words.get(i)) {
                count = Count::Rows(n);
                i += 1;
            }
        }
    }
    if matches!(words.get(i).and_then(|t| keyword(t)).as_deref(), Some("FROM" | "IN")) {
        i += 1;
    }
    let cursor_name = name(words.get(i))?;
    match words.get(i + 1) {
        None | Some(Token::SemiColon) => Ok(Command::Fetch { name: cursor_name, count, skip }),
        Some(t) => Err(format!("unexpected {t} after the cursor name in {what}")),
    }
}

/// `CLOSE name | ALL`.
fn close(words: &[&Token]) -> Result<Command, String> {
    if words.get(1).and_then(|t| keyword(t)).as_deref() == Some("ALL") {
        return Ok(Command::Close { name: None });
    }
    Ok(Command::Close { name: Some(name(words.get(1))?) })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ok(sql: &str) -> Command {
        parse(sql).expect("a cursor statement").expect("well formed")
    }

    fn err(sql: &str) -> String {
        parse(sql).expect("a cursor statement").expect_err("refused")
    }

    #[test]
    fn declare_reads_the_name_hold_and_query_as_written() {
        let c = ok(r#"DECLARE "Big" NO SCROLL CURSOR WITH HOLD FOR SELECT a, 'x y' FROM t WHERE b = 1;"#);
        assert_eq!(
            c,
            Command::Declare { name: "Big".into(), hold: true, query: "SELECT a, 'x y' FROM t WHERE b = 1".into() }
        );
        let c = ok("declare c1 binary cursor without hold for select * from t settings max_threads = 1");
        assert_eq!(
            c,
            Command::Declare {
                name: "c1".into(),
                hold: false,
                query: "select * from t settings max_threads = 1".into()
            }
        );
        assert!(err("DECLARE c SCROLL CURSOR FOR SELECT 1").contains("forward only"));
        assert!(err("DECLARE c CURSOR").contains("FOR"));
        assert!(err("DECLARE c CURSOR FOR").contains("needs a query"));
        assert!(err("DECLARE c TABLE FOR SELECT 1").contains("unexpected TABLE"));
    }

    #[test]
    fn fetch_and_move_read_forward_counts() {
        let fetch = |name: &str, count, skip| Command::Fetch { name: name.into(), count, skip };
        assert_eq!(ok(r#"FETCH FORWARD 100 FROM "c""#), fetch("c", Count::Rows(100), false));
        assert_eq!(ok("fetch c"), fetch("c", Count::Rows(1), false));
        assert_eq!(ok("FETCH NEXT IN C"), fetch("c", Count::Rows(1), false));
        assert_eq!(ok("FETCH ALL FROM c;"), fetch("c", Count::All, false));
        assert_eq!(ok("FETCH FORWARD ALL FROM c"), fetch("c", Count::All, false));
        assert_eq!(ok("FETCH 5 c"), fetch("c", Count::Rows(5), false));
        assert_eq!(ok("MOVE 3 FROM c"), fetch("c", Count::Rows(3), true));
        assert!(err("FETCH PRIOR FROM c").contains("forward only"));
        assert!(err("MOVE ABSOLUTE 3 FROM c").contains("forward only"));
        assert!(err("FETCH -1 FROM c").contains("forward only"));
        assert!(err("FETCH 1 FROM c d").contains("unexpected"));
        assert!(err("FETCH 1 FROM").contains("expected a cursor name"));
    }

    #[test]
    fn close_and_other_statements() {
        assert_eq!(ok("CLOSE ALL"), Command::Close { name: None });
        assert_eq!(ok(r#"close "c""#), Command::Close { name: Some("c".into()) });
        assert!(parse("SELECT 1").is_none());
        assert!(parse("DEALLOCATE ALL").is_none());
    }
}
