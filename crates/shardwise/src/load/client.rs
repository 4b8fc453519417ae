//! The Flight SQL side of `shardwise load` before the ingest: learning the table's schema.
//! Connecting, logging in and wording errors are `shardwise sql`'s ([`crate::cmd_sql`]).

use std::sync::Arc;

use anyhow::{Context, bail};
use arrow::datatypes::SchemaRef;
use arrow_flight::error::FlightError;
use arrow_flight::sql::client::FlightSqlServiceClient;
use tonic::Code;
use tonic::transport::Channel;

use crate::cmd_sql::flight_message;
use shardwise_query::sql_text::quote_identifier;

/// The table's schema: the result schema of `SELECT * FROM "table" LIMIT 0` (planned, not run).
pub async fn table_schema(
    client: &mut FlightSqlServiceClient<Channel>,
    addr: &str,
    table: &str,
) -> anyhow::Result<SchemaRef> {
    let info = match client.execute(select_none(table), None).await {
        Ok(info) => info,
        Err(FlightError::Tonic(status))
            if matches!(status.code(), Code::InvalidArgument | Code::NotFound)
                && (status.message().contains("unknown table") || status.message().contains("not found")) =>
        {
            // `CREATE TABLE Trips` made `trips`: the name as SQL folded it is pointed to.
            let folded = table.to_lowercase();
            let hint = if folded != table && client.execute(select_none(&folded), None).await.is_ok() {
                format!(
                    "; there is a table {folded} (SQL folds unquoted names to lower case, and this name is taken \
                     as written): load into {folded}"
                )
            } else {
                String::new()
            };
            bail!(
                "table {} does not exist on {addr} (the server says: {}){hint}",
                quote_identifier(table),
                status.message()
            )
        }
        Err(e) => {
            bail!("cannot learn the columns of table {} from {addr}: {}", quote_identifier(table), flight_message(e))
        }
    };
    let schema = info.try_decode_schema().with_context(|| format!("{addr} sent a schema that cannot be decoded"))?;
    if schema.fields().is_empty() {
        bail!("table {} has no columns", quote_identifier(table));
    }
    Ok(Arc::new(schema))
}

/// The most row bytes one insert chunk of `table` may hold (`shardwise_storage::chunk_size`, by
/// the table's replica count from `system.tables`), or `None` when the server does not say (a
/// table it does not list there): the server then checks alone.
pub async fn row_max_bytes(client: &mut FlightSqlServiceClient<Channel>, table: &str) -> Option<(usize, u32)> {
    use arrow::array::AsArray;
    let sql =
        format!("SELECT CAST(replicas AS BIGINT) FROM system.tables WHERE name = '{}'", table.replace('\'', "''"));
    let info = client.execute(sql, None).await.ok()?;
    let (_, batches) = crate::cmd_sql::fetch(client, info).await.ok()?;
    let column = batches.iter().find(|b| b.num_rows() > 0)?.column(0).clone();
    let replicas = u32::try_from(column.as_primitive_opt::<arrow::datatypes::Int64Type>()?.value(0)).ok()?;
    let setting = shardwise_storage::chunk_size::INSERT_CHUNK_MAX_BYTES_DEFAULT;
    Some((shardwise_storage::chunk_size::chunk_max_bytes(setting, replicas), replicas))
}

fn select_none(table: &str) -> String {
    format!("SELECT * FROM {} LIMIT 0", quote_identifier(table))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cmd_sql::status_message;

    #[test]
    fn status_messages_do_not_repeat_their_source() {
        let mut status = tonic::Status::unavailable("transport error");
        status.set_source(Arc::new(std::io::Error::other("transport error: connection reset")));
        assert_eq!(status_message(&status), "transport error: connection reset");
        let mut status = tonic::Status::unknown("h2 protocol error");
        status.set_source(Arc::new(std::io::Error::other("stream reset")));
        assert_eq!(status_message(&status), "h2 protocol error: stream reset");
    }
}
