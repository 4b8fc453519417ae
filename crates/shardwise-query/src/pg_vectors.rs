//! PostgreSQL's vector columns of the catalog (`pg_index.indkey`, `pg_constraint.conkey`, ...)
//! read as arrays where a client's catalog query uses them as arrays.
//!
//! Why: `datafusion-pg-catalog` keeps `int2vector`, `oidvector` and the catalog's small-integer
//! arrays as text (`"1 2"`, `"[2, 20, 3]"`), which is how a client reads them as values. But
//! SQLAlchemy's index, primary-key and unique-constraint listings `unnest(indkey)` and ask for
//! `generate_subscripts(indkey, 1)`, and failed ("unnest() can only be applied to array, struct
//! and null"; DataFusion has no `generate_subscripts`).
//!
//! How: [`rewrite`] changes a catalog statement's syntax tree (`crate::pg_catalog` calls it):
//! such a column, as the argument of `unnest`, `array_length`, `cardinality`, of `ANY`/`ALL`, or
//! subscripted, becomes `CAST(string_to_array(<its numbers>, ' ') AS INT[])`;
//! `generate_subscripts(a, d)` becomes `unnest(generate_series(lower, lower - 1 +
//! array_length(a, d)))` (the length as a BIGINT). The `int2vector`/`oidvector` columns count from 0, as in PostgreSQL
//! (`indkey[0]` is the first key), the arrays from 1.

use std::ops::ControlFlow;

use datafusion::sql::sqlparser::ast::{
    AccessExpr, Expr, FunctionArg, FunctionArgExpr, FunctionArguments, Statement, Subscript, VisitMut, VisitorMut,
};
use datafusion::sql::sqlparser::dialect::PostgreSqlDialect;
use datafusion::sql::sqlparser::parser::Parser;

/// Catalog columns of type `int2vector` or `oidvector`, whose subscripts start at 0.
const ZERO_BASED: [&str; 8] =
    ["indkey", "indclass", "indcollation", "indoption", "proargtypes", "stxkeys", "partattrs", "tgattr"];

/// Catalog arrays of numbers the crate keeps as text; subscripts from 1.
const ONE_BASED: [&str; 6] = ["conkey", "confkey", "conpfeqop", "conppeqop", "conffeqop", "conexclop"];

/// Functions whose first argument is read as an array.
const ARRAY_ARGUMENT: [&str; 3] = ["unnest", "array_length", "cardinality"];

/// `statement` with the vector columns read as arrays where it uses them so (module doc).
pub fn rewrite(mut statement: Statement) -> Statement {
    let _ = statement.visit(&mut Vectors);
    statement
}

struct Vectors;

/// The first subscript of a vector column: 0 or 1; `None` for any other expression.
fn lower_bound(e: &Expr) -> Option<i64> {
    let name = match e {
        Expr::Identifier(i) => &i.value,
        Expr::CompoundIdentifier(parts) => &parts.last()?.value,
        _ => return None,
    };
    let name = name.to_ascii_lowercase();
    if ZERO_BASED.contains(&name.as_str()) {
        Some(0)
    } else if ONE_BASED.contains(&name.as_str()) {
        Some(1)
    } else {
        None
    }
}

fn parsed(sql: &str) -> Option<Expr> {
    Parser::new(&PostgreSqlDialect {}).try_with_sql(sql).ok()?.parse_expr().ok()
}

/// The array of a vector column's text (`"1 2"`, `"[2, 20, 3]"`; empty: NULL).
fn as_array(column: &Expr) -> Option<Expr> {
    parsed(&format!(
        "CAST(string_to_array(NULLIF(trim(regexp_replace({column}, '[^0-9-]+', ' ', 'g')), ''), ' ') AS INT[])"
    ))
}

fn first_argument(args: &mut FunctionArguments) -> Option<&mut Expr> {
    match args {
        FunctionArguments::List(list) => match list.args.first_mut()? {
            FunctionArg::Unnamed(FunctionArgExpr::Expr(e)) => Some(e),
            _ => None,
        },
        _ => None,
    }
}

impl VisitorMut for Vectors {
    type Break = ();

    fn post_visit_expr(&mut self, expr: &mut Expr) -> ControlFlow<Self::Break> {
        match expr {
            Expr::Function(f) => {
                let name = f.name.0.last().map(|p| p.to_string().to_ascii_lowercase()).unwrap_or_default();
                if name == "generate_subscripts" {
                    if let FunctionArguments::List(list) = &f.args
                        && let [
                            FunctionArg::Unnamed(FunctionArgExpr::Expr(a)),
                            FunctionArg::Unnamed(FunctionArgExpr::Expr(d)),
                        ] = list.args.as_slice()
                    {
                        let lower = lower_bound(a).unwrap_or(1);
                        let array = match lower_bound(a) {
                            Some(_) => as_array(a),
                            None => Some(a.clone()),
                        };
                        let replaced = array.and_then(|array| {
                            let count = format!("CAST(array_length({array}, {d}) AS BIGINT)");
                            parsed(&format!("unnest(generate_series({lower}, {} + {count}))", lower - 1))
                        });
                        if let Some(replaced) = replaced {
                            *expr = replaced;
                        }
                    }
                } else if ARRAY_ARGUMENT.contains(&name.as_str())
                    && let Some(first) = first_argument(&mut f.args)
                    && lower_bound(first).is_some()
                    && let Some(array) = as_array(first)
                {
                    *first = array;
                }
            }
            Expr::AnyOp { right, .. } | Expr::AllOp { right, .. } => {
                if lower_bound(right).is_some()
                    && let Some(array) = as_array(right)
                {
                    **right = array;
                }
            }
            Expr::CompoundFieldAccess { root, access_chain } => {
                // `i.indkey[0]` parses as `i` then `.indkey` then `[0]`.
                let mut column = (**root).clone();
                let mut dots = 0;
                while let Some(AccessExpr::Dot(Expr::Identifier(part))) = access_chain.get(dots) {
                    column = match column {
                        Expr::Identifier(first) => Expr::CompoundIdentifier(vec![first, part.clone()]),
                        Expr::CompoundIdentifier(mut parts) => {
                            parts.push(part.clone());
                            Expr::CompoundIdentifier(parts)
                        }
                        other => other,
                    };
                    dots += 1;
                }
                if let Some(lower) = lower_bound(&column)
                    && let Some(array) = as_array(&column)
                    && let Some(AccessExpr::Subscript(Subscript::Index { index })) = access_chain.get_mut(dots)
                {
                    // DataFusion counts from 1.
                    if lower == 0
                        && let Some(shifted) = parsed(&format!("({index}) + 1"))
                    {
                        *index = shifted;
                    }
                    **root = array;
                    access_chain.drain(..dots);
                }
            }
            _ => {}
        }
        ControlFlow::Continue(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rewritten(sql: &str) -> String {
        let statement = Parser::parse_sql(&PostgreSqlDialect {}, sql).expect("parses").remove(0);
        rewrite(statement).to_string()
    }

    #[test]
    fn vectors_become_arrays_only_where_used_as_arrays() {
        let out =
            rewritten("SELECT indkey, unnest(i.indkey) AS k, generate_subscripts(i.indkey, 1) AS o FROM pg_index i");
        assert!(out.starts_with("SELECT indkey, unnest(CAST(string_to_array("), "{out}");
        assert!(out.contains("unnest(generate_series(0, -1 + CAST(array_length(CAST(string_to_array("), "{out}");
        let out = rewritten("SELECT conkey[1], c.indkey[0], x[0] FROM c WHERE 2 = ANY(conkey)");
        assert!(out.contains("INT[])[1]"), "{out}");
        assert!(out.contains("INT[])[(0) + 1]"), "{out}");
        assert!(out.contains("x[0]"), "{out}");
        assert!(out.contains("= ANY(CAST(string_to_array("), "{out}");
    }
}
