//! The one error type of the query layer, and the line between the user's mistakes and ours.
//!
//! Front ends (Flight SQL, later pgwire and HTTP) must tell a client "your SQL is wrong" apart from
//! "the server failed"; [`QueryError::is_user_error`] is that test, decided here once.

use datafusion::error::DataFusionError;

/// An error from planning or executing a statement.
#[derive(Debug, thiserror::Error)]
pub enum QueryError {
    /// The statement is wrong: syntax, unknown table or column, type mismatch, bad setting, a
    /// runtime error caused by the data (division by zero, failed cast), ...
    #[error("{}", user_text(.0))]
    Invalid(#[source] DataFusionError),
    /// The statement is valid SQL but shardwise does not run it (DDL and DML on DataFusion
    /// tables, for now).
    #[error("statement not supported: {0}")]
    Unsupported(String),
    /// The statement was refused: an unknown or existing table, a bad table option, data that
    /// does not fit the table, ...
    #[error("{}", postgres_words(.0))]
    Rejected(String),
    /// A setting name or value is wrong.
    #[error("bad setting: {0}")]
    BadSetting(String),
    /// Part of the cluster could not be reached in time; the same statement may succeed later.
    #[error("unavailable: {0}")]
    Unavailable(String),
    /// The engine failed (I/O, resources, a bug): not the user's fault.
    #[error("internal error: {}", .0.strip_backtrace())]
    Internal(#[source] DataFusionError),
    /// The node's storage failed (a disk error, a failed log): not the user's fault.
    #[error("storage error: {0}")]
    Storage(String),
}

impl QueryError {
    /// True when the client sent something wrong (retrying the same statement will fail again);
    /// false when the server failed.
    pub fn is_user_error(&self) -> bool {
        match self {
            QueryError::Invalid(_)
            | QueryError::Unsupported(_)
            | QueryError::Rejected(_)
            | QueryError::BadSetting(_) => true,
            QueryError::Internal(_) | QueryError::Unavailable(_) | QueryError::Storage(_) => false,
        }
    }

    /// Whether the query was stopped (killed or timed out) rather than failed; PostgreSQL's
    /// `57014 query_canceled`.
    pub fn stopped(&self) -> Option<Stopped> {
        let QueryError::Rejected(message) = self else { return None };
        if message.contains(TIMED_OUT) {
            Some(Stopped::TimedOut)
        } else if message.contains(KILLED) {
            Some(Stopped::Killed)
        } else {
            None
        }
    }

    /// What `QueryError::from(e).is_user_error()` says, without taking `e`.
    pub fn is_user_error_of(e: &DataFusionError) -> bool {
        carried(e).map_or_else(|| is_user_caused(e), QueryError::is_user_error)
    }

    /// The same class of error with `prefix` before its message (what was being done).
    pub fn prefixed(self, prefix: &str) -> QueryError {
        match self.copied() {
            QueryError::Unsupported(m) => QueryError::Unsupported(format!("{prefix}{m}")),
            QueryError::Rejected(m) => QueryError::Rejected(format!("{prefix}{m}")),
            QueryError::BadSetting(m) => QueryError::BadSetting(format!("{prefix}{m}")),
            QueryError::Unavailable(m) => QueryError::Unavailable(format!("{prefix}{m}")),
            QueryError::Storage(m) => QueryError::Storage(format!("{prefix}{m}")),
            // `copied` turns the two DataFusion-carrying classes into the ones above.
            other @ (QueryError::Invalid(_) | QueryError::Internal(_)) => other,
        }
    }

    /// A copy that keeps the class and the message (the originals hold DataFusion errors, which
    /// do not clone); used to carry an error through DataFusion's `External` and back out.
    fn copied(&self) -> QueryError {
        match self {
            QueryError::Invalid(e) => QueryError::Rejected(e.strip_backtrace()),
            QueryError::Unsupported(m) => QueryError::Unsupported(m.clone()),
            QueryError::Rejected(m) => QueryError::Rejected(m.clone()),
            QueryError::BadSetting(m) => QueryError::BadSetting(m.clone()),
            QueryError::Unavailable(m) => QueryError::Unavailable(m.clone()),
            QueryError::Storage(m) => QueryError::Storage(m.clone()),
            QueryError::Internal(e) => QueryError::Storage(e.strip_backtrace()),
        }
    }
}

impl From<DataFusionError> for QueryError {
    fn from(e: DataFusionError) -> Self {
        if let Some(q) = carried(&e) {
            return q.copied();
        }
        if let DataFusionError::NotImplemented(m) = e.find_root()
            && let Some(what) = m.strip_prefix("Physical plan does not support logical expression ")
        {
            return QueryError::Unsupported(unplanned(what));
        }
        if let Some(mismatch) = argument_type_mismatch(&e) {
            return QueryError::Invalid(DataFusionError::Plan(mismatch));
        }
        if let Some(message) = misplaced_subquery(&e) {
            return QueryError::Unsupported(message.into());
        }
        if is_user_caused(&e) {
            QueryError::Invalid(without_internal_names(placed_at_end(without_rule_context(e))))
        } else {
            QueryError::Internal(e)
        }
    }
}

/// What an expression left in a plan that no operator can run fails with, in place of
/// DataFusion's "Physical plan does not support logical expression <its debug dump>", which
/// says neither what in the statement it is nor what to change.
fn unplanned(what: &str) -> String {
    let kind = what.split(['(', ' ']).next().unwrap_or(what);
    match kind {
        "ScalarSubquery" => UNPLANNED_SUBQUERY.to_string(),
        "Exists" | "InSubquery" | "SetComparison" => "an EXISTS, IN or ANY/ALL subquery of this statement cannot be \
             run as written: shardwise runs one in a WHERE or HAVING condition or a SELECT list when it refers to \
             the outer row only in its own WHERE clause, without ORDER BY ... LIMIT, and runs `x > ANY (...)` and \
             the other ordering comparisons only as a WHERE condition; rewrite it as a join"
            .to_string(),
        "WindowFunction" => "window functions are not allowed in WHERE, HAVING, GROUP BY or a join condition: \
             compute the window in a subquery and filter its result"
            .to_string(),
        "AggregateFunction" => "aggregate functions are not allowed in WHERE, GROUP BY or a join condition: \
             filter aggregates with HAVING"
            .to_string(),
        other => format!("this statement uses {other} where no operator can compute it"),
    }
}

/// What a correlated scalar subquery that neither DataFusion nor shardwise can turn into a join
/// fails with.
const UNPLANNED_SUBQUERY: &str = "a correlated scalar subquery of this statement cannot be run: shardwise runs one \
     that refers to the outer row only in its own WHERE clause, and reads at most its first row (no OFFSET, \
     no LIMIT above 1, no GROUP BY); an `x IN (subquery)` that refers to the outer row runs as a WHERE or \
     HAVING condition, not in a SELECT list (there, write EXISTS (SELECT 1 FROM ... WHERE ... AND y = x)); \
     rewrite it as a join";

/// A parser error at the end of the statement says so: sqlparser gives a line and column for
/// every token but the end (`Expected: an expression, found: EOF`).
fn placed_at_end(e: DataFusionError) -> DataFusionError {
    use datafusion::sql::sqlparser::parser::ParserError;
    match e {
        DataFusionError::SQL(parser, backtrace) => match *parser {
            ParserError::ParserError(message) if message.ends_with("found: EOF") => DataFusionError::SQL(
                Box::new(ParserError::ParserError(format!("{message} (the statement ended too early)"))),
                backtrace,
            ),
            other => DataFusionError::SQL(Box::new(other), backtrace),
        },
        other => other,
    }
}

/// The text of a user's error: DataFusion's, but a parser's error as `syntax error: ...` (its
/// display is the parser's Rust debug form, `SQL error: ParserError("...")`) and a construct
/// DataFusion's planner does not know by its name (its display dumps the syntax tree).
fn user_text(e: &DataFusionError) -> String {
    use datafusion::sql::sqlparser::parser::ParserError;
    match e {
        // DataFusion wraps some parser errors with a diagnostic (`select 1 1 1`): the error inside.
        DataFusionError::Diagnostic(_, inner) => user_text(inner),
        DataFusionError::SQL(parser, _) => match parser.as_ref() {
            ParserError::ParserError(message) | ParserError::TokenizerError(message) => {
                format!("syntax error: {message}")
            }
            ParserError::RecursionLimitExceeded => "the statement nests parentheses, subqueries or CASE \
                 expressions deeper than datafusion.sql_parser.recursion_limit allows (SET \
                 datafusion.sql_parser.recursion_limit = ... raises it)"
                .to_string(),
        },
        DataFusionError::NotImplemented(message) if message.starts_with(UNNEST_NOT_AN_ITEM) => {
            "unnest (and ClickHouse's arrayJoin) runs only as an item of a SELECT list, not inside an \
             aggregate, a WHERE or an ORDER BY: take it in a subquery (SELECT ... FROM (SELECT arrayJoin(a) \
             AS x FROM t) WHERE x = ...)"
                .to_string()
        }
        DataFusionError::NotImplemented(message) if message.starts_with(UNSUPPORTED_AST_NODE) => {
            let node = &message[UNSUPPORTED_AST_NODE.len()..];
            let name = node.split([' ', '(', '{']).next().unwrap_or(node);
            format!("this SQL construct is not supported: {name}")
        }
        other => postgres_words(&other.strip_backtrace()),
    }
}

/// `text` in PostgreSQL's words where clients and people search for them (a division by zero;
/// also in the text of an error another node's fragment sent).
fn postgres_words(text: &str) -> String {
    let text = text
        .replace("Arrow error: Divide by zero error", DIVISION_BY_ZERO)
        .replace("Divide by zero error", DIVISION_BY_ZERO);
    match text.contains(OFFSET_OVERFLOW) && !text.contains(OFFSET_OVERFLOW_EXPLAINED) {
        true => format!("{text} ({OFFSET_OVERFLOW_EXPLAINED})"),
        false => text,
    }
}

/// Arrow's words when one array would hold more than 2 GiB of text, bytes or list items.
const OFFSET_OVERFLOW: &str = "Offset overflow error";

/// What [`OFFSET_OVERFLOW`] means to a user.
const OFFSET_OVERFLOW_EXPLAINED: &str = "a column of the answer, or of a step of the query, would hold \
     more than 2 GiB of text or list items in one batch, more than Arrow's arrays hold: aggregate less \
     per group (array_agg or string_agg of long values over many rows), or split the query";

/// How a query stopped by `KILL QUERY` fails (a fragment's failure carries it from its node).
pub const KILLED: &str = "the query was stopped by KILL QUERY";

/// How a query stopped at its `max_execution_time_ms` fails.
pub const TIMED_OUT: &str = "the query ran longer than max_execution_time_ms";

/// Why a query was stopped before it finished, by a user or its own deadline.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stopped {
    /// `KILL QUERY`.
    Killed,
    /// `max_execution_time_ms`.
    TimedOut,
}

/// What a division by zero fails with (PostgreSQL's message; Arrow's is `Divide by zero error`).
pub const DIVISION_BY_ZERO: &str = "division by zero";

/// How DataFusion's SQL planner starts the message for a construct it does not plan.
const UNSUPPORTED_AST_NODE: &str = "Unsupported ast node in sqltorel: ";

/// DataFusion's words for an `unnest` left inside another expression (an aggregate's argument,
/// a WHERE), which its planner cannot place.
const UNNEST_NOT_AN_ITEM: &str = "Unnest should be rewritten to LogicalPlan::Unnest";

/// DataFusion's words after an internal error's message.
const DATAFUSION_BUG_TRAILER: &str = ".\nThis issue was likely caused by a bug in DataFusion's code. Please help us to \
     resolve this by filing a bug report in our issue tracker: https://github.com/apache/datafusion/issues";

/// A function called with arguments of types it does not take (`sum(text_column)`,
/// `substr(s, 'a')`), which DataFusion reports as its own internal error (a bug to report to
/// it): the message without that framing, as the statement's error.
fn argument_type_mismatch(e: &DataFusionError) -> Option<String> {
    let text = e.strip_backtrace();
    if !text.contains("failed to match any signature") && !text.contains("No function matches the given name") {
        return None;
    }
    let text = text.replace(DATAFUSION_BUG_TRAILER, "");
    let text = text.replace("Internal error: ", "").replace("Error during planning: ", "");
    Some(text)
}

/// A correlated subquery where DataFusion's analyzer allows none (ORDER BY, a join condition,
/// a window), whose own message speaks of plan nodes.
fn misplaced_subquery(e: &DataFusionError) -> Option<&'static str> {
    e.strip_backtrace()
        .contains("Correlated scalar subquery can only be used in Projection, Filter, Aggregate")
        .then_some(
            "a correlated subquery may be used in the SELECT list, WHERE and HAVING only: for ORDER BY, GROUP BY, \
         a join condition or a window, compute it in the SELECT list of a subquery and use its column",
        )
}

/// A column not found, without the columns of DataFusion's own making among the ones it suggests
/// (`No field named t.k. Did you mean '__scalar_sq_1.k'?`, where the subquery's join is named
/// `__scalar_sq_1`): the user wrote none of them.
fn without_internal_names(e: DataFusionError) -> DataFusionError {
    use datafusion::common::SchemaError;
    match e {
        DataFusionError::SchemaError(error, backtrace) => match *error {
            SchemaError::FieldNotFound { field, mut valid_fields } => {
                valid_fields.retain(|c| {
                    !c.name.starts_with("__") && !c.relation.as_ref().is_some_and(|r| r.table().starts_with("__"))
                });
                DataFusionError::SchemaError(Box::new(SchemaError::FieldNotFound { field, valid_fields }), backtrace)
            }
            other => DataFusionError::SchemaError(Box::new(other), backtrace),
        },
        other => other,
    }
}

/// `e` without the layers DataFusion's optimizers wrap around an error from a rule (`Optimizer
/// rule '...' failed` from the logical one, the bare rule name from the physical one): for the
/// user's own mistakes (a constant that does not cast) the rule's name is noise, and for
/// shardwise's rules (`shardwise_distribute`) it names internals.
fn without_rule_context(e: DataFusionError) -> DataFusionError {
    match e {
        DataFusionError::Context(message, inner)
            if message.starts_with("Optimizer rule '") || !message.contains(char::is_whitespace) =>
        {
            without_rule_context(*inner)
        }
        other => other,
    }
}

/// The `QueryError` a DataFusion error carries through `External`, if any.
fn carried(e: &DataFusionError) -> Option<&QueryError> {
    match e.find_root() {
        DataFusionError::External(inner) => inner.downcast_ref::<QueryError>(),
        _ => None,
    }
}

/// Classifies a DataFusion error by its root cause.
fn is_user_caused(e: &DataFusionError) -> bool {
    use datafusion::arrow::error::ArrowError;
    match e.find_root() {
        DataFusionError::SQL(..)
        | DataFusionError::Plan(_)
        | DataFusionError::SchemaError(..)
        | DataFusionError::NotImplemented(_)
        | DataFusionError::Configuration(_)
        | DataFusionError::Execution(_) => true,
        DataFusionError::ArrowError(arrow, _) => match arrow.as_ref() {
            ArrowError::ExternalError(inner) => is_bad_pattern(inner.as_ref()),
            other => !matches!(other, ArrowError::IoError(..) | ArrowError::MemoryError(_)),
        },
        DataFusionError::External(inner) => is_bad_pattern(inner.as_ref()),
        DataFusionError::Collection(errors) => errors.first().is_some_and(is_user_caused),
        _ => false,
    }
}

/// A regular expression that does not compile (`regexp_like(s, '(')`), as the functions and
/// the optimizer's rewrite of `~` report it.
fn is_bad_pattern(e: &(dyn std::error::Error + Send + Sync + 'static)) -> bool {
    e.is::<regex::Error>() || e.is::<regex_syntax::Error>()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Arrow's "Offset overflow error" says what it means for the query, once.
    #[test]
    fn an_offset_overflow_is_explained() {
        let e = QueryError::from(DataFusionError::ArrowError(
            Box::new(datafusion::arrow::error::ArrowError::OffsetOverflowError(2_205_840_340)),
            None,
        ));
        let text = e.to_string();
        assert!(text.contains("Offset overflow") && text.contains("more than 2 GiB of text or list items"), "{text}");
        assert_eq!(postgres_words(&text), text, "explained twice");
    }

    #[test]
    fn parser_errors_read_as_syntax_errors() {
        use datafusion::sql::sqlparser::parser::ParserError;
        let parse = |e: ParserError| QueryError::from(DataFusionError::SQL(Box::new(e), None)).to_string();
        let text = parse(ParserError::ParserError("Expected: ), found: exclude at Line: 1, Column: 9".into()));
        assert_eq!(text, "syntax error: Expected: ), found: exclude at Line: 1, Column: 9");
        let inner = DataFusionError::SQL(Box::new(ParserError::ParserError("Expected: end of statement".into())), None);
        let wrapped = DataFusionError::Diagnostic(
            Box::new(datafusion::common::Diagnostic::new_error("end of statement", None)),
            Box::new(inner),
        );
        assert_eq!(QueryError::from(wrapped).to_string(), "syntax error: Expected: end of statement");
        assert!(parse(ParserError::RecursionLimitExceeded).contains("recursion_limit"));
        let e = QueryError::from(DataFusionError::NotImplemented(format!(
            "{UNSUPPORTED_AST_NODE}Collate {{ expr: Identifier(Ident {{ value: \"s\" }}) }}"
        )));
        assert_eq!(e.to_string(), "this SQL construct is not supported: Collate");
    }

    #[test]
    fn plan_errors_are_user_errors() {
        let e = QueryError::from(DataFusionError::Plan("no such column".into()));
        assert!(e.is_user_error());
        assert_eq!(e.to_string(), "Error during planning: no such column");
    }

    #[test]
    fn a_missing_column_is_not_matched_with_internal_names() {
        use datafusion::common::{Column, SchemaError};
        let missing = SchemaError::FieldNotFound {
            field: Box::new(Column::new(Some("t"), "k")),
            valid_fields: vec![Column::new(Some("__scalar_sq_1"), "k"), Column::new(Some("t"), "g")],
        };
        let e = QueryError::from(DataFusionError::SchemaError(Box::new(missing), Box::new(None)));
        assert!(!e.to_string().contains("__scalar_sq_1"), "{e}");
        assert!(e.to_string().contains("No field named t.k"), "{e}");
    }

    #[test]
    fn a_function_given_the_wrong_types_is_the_users_error_without_datafusions_bug_report() {
        let e = QueryError::from(DataFusionError::Internal(
            "Function 'sum' failed to match any signature, errors: Error during planning: sum does not support Utf8"
                .into(),
        ));
        assert!(e.is_user_error(), "{e:?}");
        let text = e.to_string();
        assert!(text.contains("Function 'sum' failed to match any signature") && !text.contains("bug"), "{text}");
    }

    #[test]
    fn a_bad_regular_expression_is_the_users() {
        let pattern = String::from("(");
        let bad = regex::Regex::new(&pattern).expect_err("unclosed group");
        let e = QueryError::from(DataFusionError::External(Box::new(bad)));
        assert!(e.is_user_error(), "{e:?}");
        assert!(e.to_string().contains("unclosed group"), "{e}");
        let bad = regex_syntax::Parser::new().parse("(").expect_err("unclosed group");
        let e = DataFusionError::Context("Invalid regex".into(), Box::new(DataFusionError::External(Box::new(bad))));
        assert!(QueryError::from(e).is_user_error());
    }

    #[test]
    fn an_unplanned_subquery_says_which_subqueries_run() {
        let e = QueryError::from(DataFusionError::NotImplemented(
            "Physical plan does not support logical expression ScalarSubquery(<subquery>)".into(),
        ));
        assert!(matches!(e, QueryError::Unsupported(_)), "{e:?}");
        assert!(e.to_string().contains("refers to the outer row only in its own WHERE clause"), "{e}");
        let e = QueryError::from(DataFusionError::NotImplemented(
            "Physical plan does not support logical expression WindowFunction(WindowFunction { fun: .. })".into(),
        ));
        assert!(e.to_string().contains("window functions are not allowed in WHERE"), "{e}");
        assert!(!e.to_string().contains("fun:"), "{e}");
    }

    #[test]
    fn a_statement_that_ends_too_early_says_so() {
        use datafusion::sql::sqlparser::parser::ParserError;
        let eof = ParserError::ParserError("Expected: an expression, found: EOF".into());
        let e = QueryError::from(DataFusionError::SQL(Box::new(eof), None));
        assert!(e.to_string().contains("found: EOF (the statement ended too early)"), "{e}");
        let placed = ParserError::ParserError("Expected: an expression, found: ) at Line: 1, Column: 9".into());
        let e = QueryError::from(DataFusionError::SQL(Box::new(placed), None));
        assert!(!e.to_string().contains("ended too early"), "{e}");
    }

    #[test]
    fn internal_and_io_errors_are_not() {
        assert!(!QueryError::from(DataFusionError::Internal("bug".into())).is_user_error());
        let io = std::io::Error::other("disk gone");
        assert!(!QueryError::from(DataFusionError::IoError(io)).is_user_error());
    }

    #[test]
    fn context_is_looked_through() {
        let e = DataFusionError::Plan("bad".into()).context("while planning");
        assert!(QueryError::from(e).is_user_error());
    }

    #[test]
    fn an_optimizer_rule_name_is_not_shown_for_user_errors() {
        let e =
            DataFusionError::Execution("Cannot cast".into()).context("Optimizer rule 'simplify_expressions' failed");
        assert_eq!(QueryError::from(e).to_string(), "Execution error: Cannot cast");
        let e = DataFusionError::Plan("mode 2 needs columns".into()).context("shardwise_distribute");
        assert_eq!(QueryError::from(e).to_string(), "Error during planning: mode 2 needs columns");
        let ours = DataFusionError::Internal("bug".into()).context("Optimizer rule 'shardwise_distribute' failed");
        assert!(QueryError::from(ours).to_string().contains("shardwise_distribute"));
    }

    #[test]
    fn a_prefix_keeps_the_class() {
        let user = QueryError::from(DataFusionError::Execution("Divide by zero error".into())).prefixed("doing x: ");
        assert!(user.is_user_error());
        assert!(user.to_string().starts_with("doing x: "), "{user}");
        let ours = QueryError::Unavailable("rank 2".into()).prefixed("doing x: ");
        assert!(!ours.is_user_error());
        assert_eq!(ours.to_string(), "unavailable: doing x: rank 2");
    }

    #[test]
    fn unsupported_is_a_user_error() {
        let e = QueryError::Unsupported("DDL (CreateExternalTable)".into());
        assert!(e.is_user_error());
        assert_eq!(e.to_string(), "statement not supported: DDL (CreateExternalTable)");
    }
}
