//! The names PostgreSQL gives a query's unaliased answer columns, for the PostgreSQL endpoint.
//!
//! Why: DataFusion names a column by its expression's text: `count(*)`, `sum(m.k)`,
//! `md5(Utf8("a"))`, `Utf8("x")`. PostgreSQL names it `count`, `sum`, `md5`, `?column?`, and
//! client code is written against those names (`row["count"]` in psycopg, `df["sum"]` in pandas).
//!
//! What: PostgreSQL's rule (`FigureColname` in its parser): a column reference is named by the
//! column, a function call by the function (`count`, `coalesce`, `substring`), `CASE` `case`,
//! `EXISTS` `exists`, `ARRAY[...]` `array`, a row `row`, a scalar subquery by its own first
//! column; a cast by what it casts when that has a name, else by the type (`SELECT 1::int` is
//! `int4`, `DATE '2024-01-01'` is `date`); anything else (a literal, an operator) `?column?`. An
//! alias is kept. Only the outermost `SELECT` list (the first branch of a `UNION`) is named, and
//! only over PostgreSQL: Flight SQL and HTTP clients keep the plan's names, and inside the query
//! (subqueries, `ORDER BY`) the plan's names hold as before. Two columns may get the same name,
//! as in PostgreSQL.

use std::sync::Arc;

use datafusion::arrow::datatypes::{Field, Schema, SchemaRef};
use datafusion::sql::parser::Statement as DfStatement;
use datafusion::sql::sqlparser::ast::{
    DataType, Expr, Ident, ObjectName, ObjectNamePart, Query, SelectItem, SetExpr, Statement,
};

/// PostgreSQL's name for a column whose expression gives none.
pub const NO_NAME: &str = "?column?";

/// The names of a statement's answer columns over PostgreSQL, one entry per item of its
/// outermost `SELECT` list (nothing when the statement is not a query).
#[derive(Debug, Clone, Default)]
pub struct OutputNames(Vec<Item>);

#[derive(Debug, Clone, PartialEq)]
enum Item {
    /// An unaliased expression, and PostgreSQL's name for it.
    Named(String),
    /// An aliased one: the plan already has the alias.
    Aliased(String),
    /// `*` or `t.*`: as many columns as it expands to, their names kept.
    Wildcard,
}

impl OutputNames {
    /// The names for `statement`'s answer, read from it as parsed.
    pub fn of(statement: &DfStatement) -> OutputNames {
        match statement {
            DfStatement::Statement(s) => match s.as_ref() {
                Statement::Query(query) => OutputNames(items(query)),
                _ => OutputNames::default(),
            },
            _ => OutputNames::default(),
        }
    }

    /// `schema` with its columns renamed; unchanged where the items cannot be matched with the
    /// columns one to one (more than one wildcard, or a rewrite changed the column count).
    pub fn apply(&self, schema: &SchemaRef) -> SchemaRef {
        let n = schema.fields().len();
        let wildcards = self.0.iter().filter(|i| **i == Item::Wildcard).count();
        let names: Vec<Option<&str>> = match wildcards {
            0 if self.0.len() == n => self.0.iter().map(Item::name).collect(),
            1 if self.0.len() - 1 <= n => {
                let expanded = n - (self.0.len() - 1);
                let mut names = Vec::with_capacity(n);
                for item in &self.0 {
                    match item {
                        Item::Wildcard => names.extend(std::iter::repeat_n(None, expanded)),
                        item => names.push(item.name()),
                    }
                }
                names
            }
            _ => return Arc::clone(schema),
        };
        if names.iter().all(Option::is_none) {
            return Arc::clone(schema);
        }
        let fields: Vec<Field> = schema
            .fields()
            .iter()
            .zip(names)
            .map(|(field, name)| match name {
                Some(name) => field.as_ref().clone().with_name(name),
                None => field.as_ref().clone(),
            })
            .collect();
        Arc::new(Schema::new_with_metadata(fields, schema.metadata().clone()))
    }
}

impl Item {
    fn name(&self) -> Option<&str> {
        match self {
            Item::Named(name) => Some(name),
            Item::Aliased(_) | Item::Wildcard => None,
        }
    }
}

fn items(query: &Query) -> Vec<Item> {
    body_items(&query.body)
}

fn body_items(body: &SetExpr) -> Vec<Item> {
    match body {
        SetExpr::Select(select) => select
            .projection
            .iter()
            .map(|item| match item {
                SelectItem::UnnamedExpr(expr) => Item::Named(figure(expr).0),
                SelectItem::ExprWithAlias { alias, .. } => Item::Aliased(folded(alias)),
                // `expr AS (a, b)` names its own columns, as many as it has.
                SelectItem::Wildcard(_) | SelectItem::QualifiedWildcard(..) | SelectItem::ExprWithAliases { .. } => {
                    Item::Wildcard
                }
            })
            .collect(),
        SetExpr::Query(query) => items(query),
        SetExpr::SetOperation { left, .. } => body_items(left),
        _ => Vec::new(),
    }
}

/// How sure a name is: PostgreSQL prefers a cast's operand's name to the type's, and the type's
/// to none.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Strength {
    None,
    Type,
    Named,
}

/// PostgreSQL's name for `expr` (`FigureColnameInternal`).
fn figure(expr: &Expr) -> (String, Strength) {
    let named = |name: &str| (name.to_string(), Strength::Named);
    match expr {
        Expr::Identifier(ident) => (folded(ident), Strength::Named),
        Expr::CompoundIdentifier(parts) => match parts.last() {
            Some(ident) => (folded(ident), Strength::Named),
            None => (NO_NAME.into(), Strength::None),
        },
        Expr::Function(function) => match last_name(&function.name) {
            Some(name) => (name, Strength::Named),
            None => (NO_NAME.into(), Strength::None),
        },
        Expr::Cast { expr, data_type, .. } => match figure(expr) {
            (name, Strength::Named) => (name, Strength::Named),
            _ => (type_name(data_type), Strength::Type),
        },
        Expr::TypedString(typed) => (type_name(&typed.data_type), Strength::Type),
        Expr::Interval(_) => ("interval".into(), Strength::Type),
        Expr::Nested(inner) | Expr::Collate { expr: inner, .. } => figure(inner),
        Expr::Case { .. } => named("case"),
        Expr::Exists { .. } => named("exists"),
        Expr::Array(_) => named("array"),
        Expr::Tuple(_) => named("row"),
        Expr::Subquery(query) => match items(query).first() {
            Some(Item::Named(name) | Item::Aliased(name)) => (name.clone(), Strength::Named),
            _ => (NO_NAME.into(), Strength::None),
        },
        Expr::Substring { .. } => named("substring"),
        Expr::Trim { .. } => named("btrim"),
        Expr::Position { .. } => named("position"),
        Expr::Overlay { .. } => named("overlay"),
        Expr::Extract { .. } => named("extract"),
        Expr::Ceil { .. } => named("ceil"),
        Expr::Floor { .. } => named("floor"),
        Expr::AtTimeZone { .. } => named("timezone"),
        _ => (NO_NAME.into(), Strength::None),
    }
}

/// An identifier as the catalog has it: unquoted ones fold to lower case.
fn folded(ident: &Ident) -> String {
    match ident.quote_style {
        Some(_) => ident.value.clone(),
        None => ident.value.to_lowercase(),
    }
}

fn last_name(name: &ObjectName) -> Option<String> {
    match name.0.last()? {
        ObjectNamePart::Identifier(ident) => Some(folded(ident)),
        other => Some(other.to_string().to_lowercase()),
    }
}

/// The name PostgreSQL's grammar gives a type as written (`int` is `int4`, `double precision`
/// `float8`).
fn type_name(data_type: &DataType) -> String {
    let written = data_type.to_string().to_lowercase();
    let base = written.split('(').next().unwrap_or(&written).trim().to_string();
    let name = match base.as_str() {
        "int" | "integer" | "int4" => "int4",
        "bigint" | "int8" => "int8",
        "smallint" | "int2" => "int2",
        "real" | "float4" => "float4",
        "double" | "double precision" | "float" | "float8" => "float8",
        "decimal" | "numeric" | "dec" => "numeric",
        "boolean" | "bool" => "bool",
        "character varying" | "varchar" | "string" => "varchar",
        "character" | "char" | "bpchar" => "bpchar",
        "timestamp" | "timestamp without time zone" => "timestamp",
        "timestamptz" | "timestamp with time zone" => "timestamptz",
        "time" | "time without time zone" => "time",
        _ => return base.rsplit('.').next().unwrap_or(&base).to_string(),
    };
    name.to_string()
}

#[cfg(test)]
mod tests {
    use datafusion::arrow::datatypes::DataType as ArrowType;
    use datafusion::sql::parser::DFParser;

    use super::*;

    fn names(sql: &str, columns: usize) -> Vec<String> {
        let statement = DFParser::parse_sql(sql).expect("parses").pop_front().expect("one statement");
        let schema: SchemaRef = Arc::new(Schema::new(
            (0..columns).map(|i| Field::new(format!("df{i}"), ArrowType::Int64, true)).collect::<Vec<_>>(),
        ));
        OutputNames::of(&statement).apply(&schema).fields().iter().map(|f| f.name().clone()).collect()
    }

    #[test]
    fn functions_columns_and_expressions_are_named_as_postgresql_names_them() {
        assert_eq!(
            names("SELECT count(*), SUM(m.k), md5('a'), 'x', 1 + 2, k, t.\"Mixed\", coalesce(a, 0) FROM t", 8),
            ["count", "sum", "md5", "?column?", "?column?", "k", "Mixed", "coalesce"]
        );
        assert_eq!(
            names("SELECT CASE WHEN a THEN 1 END, EXISTS (SELECT 1), ARRAY[1], (SELECT max(a) FROM t), (k)", 5),
            ["case", "exists", "array", "max", "k"]
        );
        assert_eq!(
            names("SELECT substring(s FROM 2), trim(s), extract(year FROM d), row_number() OVER ()", 4),
            ["substring", "btrim", "extract", "row_number"]
        );
    }

    #[test]
    fn a_cast_is_named_by_what_it_casts_else_by_its_type() {
        assert_eq!(
            names(
                "SELECT a::text, 1::int, CAST(2 AS DOUBLE PRECISION), DATE '2024-01-01', '1'::varchar(3), now()::date",
                6
            ),
            ["a", "int4", "float8", "date", "varchar", "now"]
        );
    }

    #[test]
    fn aliases_wildcards_and_set_operations() {
        assert_eq!(names("SELECT count(*) AS n, sum(v) FROM t", 2), ["df0", "sum"]);
        assert_eq!(names("SELECT count(*), *, max(v) FROM t", 5), ["count", "df1", "df2", "df3", "max"]);
        assert_eq!(names("SELECT *, t.* FROM t", 4), ["df0", "df1", "df2", "df3"]);
        assert_eq!(names("SELECT sum(a) FROM t UNION ALL SELECT 1", 1), ["sum"]);
        assert_eq!(names("WITH w AS (SELECT 1 AS a) SELECT max(a) FROM w ORDER BY 1 LIMIT 1", 1), ["max"]);
        // Not a query, or items that do not match the columns: the plan's names.
        assert_eq!(names("INSERT INTO t VALUES (1)", 1), ["df0"]);
        assert_eq!(names("SELECT count(*), sum(v) FROM t", 3), ["df0", "df1", "df2"]);
        assert_eq!(names("VALUES (1, 2)", 2), ["df0", "df1"]);
    }
}
