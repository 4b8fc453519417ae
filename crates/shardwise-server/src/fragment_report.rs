//! How a node that ran a query fragment tells the initiator what it ran: after the fragment's
//! last row, one more Flight message (a schema message, no rows) whose `app_metadata` is
//! [`REPORT_MARK`] and the plan with its operators' metrics as text. `EXPLAIN ANALYZE` on the
//! initiator shows it ([`shardwise_query::FragmentReport`]); a client that does not look for it
//! sees a stream that ends with no more rows.

use arrow::datatypes::SchemaRef;
use arrow_flight::FlightData;
use futures::stream::BoxStream;
use futures::{StreamExt, TryStreamExt};
use tonic::Status;

/// Start of the `app_metadata` of a report message.
pub const REPORT_MARK: &[u8] = b"SWFR";

/// The report message (with the schema it must carry to be a valid Flight message).
pub fn trailer(schema: SchemaRef, text: String) -> BoxStream<'static, Result<FlightData, Status>> {
    let mut metadata = REPORT_MARK.to_vec();
    metadata.extend_from_slice(text.as_bytes());
    crate::flight_split::encoder()
        .with_metadata(metadata.into())
        .with_schema(schema)
        .build(futures::stream::empty())
        .map_err(Status::from)
        .boxed()
}

/// The report `data` carries, if it is a report message.
pub fn report_of(data: &FlightData) -> Option<String> {
    let text = data.app_metadata.strip_prefix(REPORT_MARK)?;
    Some(String::from_utf8_lossy(text).into_owned())
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow::datatypes::{DataType, Field, Schema};
    use std::sync::Arc;

    #[tokio::test]
    async fn a_report_round_trips_and_other_messages_are_not_reports() {
        let schema = Arc::new(Schema::new(vec![Field::new("a", DataType::Int64, true)]));
        let messages: Vec<FlightData> =
            trailer(schema, "AggregateExec: metrics=[output_rows=3]".into()).try_collect().await.expect("encode");
        assert_eq!(messages.len(), 1);
        assert_eq!(report_of(&messages[0]).as_deref(), Some("AggregateExec: metrics=[output_rows=3]"));
        assert_eq!(report_of(&FlightData::default()), None);
    }
}
