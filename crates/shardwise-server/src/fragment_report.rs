//! How a node that ran a query fragment tells the initiator what it ran: after the fragment's
//! last row, one more Flight message (a schema message, no rows) whose `app_metadata` is
//! [`REPORT_MARK`] and a [`FragmentOutcome`] as JSON: the plan with its operators' metrics as
//! text (`EXPLAIN ANALYZE` on the initiator shows it), and the rows and bytes the fragment's
//! shuffle readers received (`system.queries`). A client that does not look for it sees a stream
//! that ends with no more rows.

use arrow::datatypes::SchemaRef;
use arrow_flight::FlightData;
use futures::stream::BoxStream;
use futures::{StreamExt, TryStreamExt};
use shardwise_query::FragmentOutcome;
use tonic::Status;

/// Start of the `app_metadata` of a report message.
pub const REPORT_MARK: &[u8] = b"SWFR";

/// The report message (with the schema it must carry to be a valid Flight message).
pub fn trailer(schema: SchemaRef, outcome: &FragmentOutcome) -> BoxStream<'static, Result<FlightData, Status>> {
    let mut metadata = REPORT_MARK.to_vec();
    if let Err(e) = serde_json::to_writer(&mut metadata, outcome) {
        return futures::stream::once(async move { Err(Status::internal(format!("cannot encode a report: {e}"))) })
            .boxed();
    }
    crate::flight_split::encoder()
        .with_metadata(metadata.into())
        .with_schema(schema)
        .build(futures::stream::empty())
        .map_err(Status::from)
        .boxed()
}

/// The report `data` carries, if it is a report message. One that is not JSON is the plan text
/// alone, as nodes sent it before the report carried more (a cluster being upgraded).
pub fn report_of(data: &FlightData) -> Option<FragmentOutcome> {
    let body = data.app_metadata.strip_prefix(REPORT_MARK)?;
    Some(serde_json::from_slice(body).unwrap_or_else(|_| FragmentOutcome {
        plan: Some(String::from_utf8_lossy(body).into_owned()),
        ..FragmentOutcome::default()
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow::datatypes::{DataType, Field, Schema};
    use std::sync::Arc;

    #[tokio::test]
    async fn a_report_round_trips_and_other_messages_are_not_reports() {
        let schema = Arc::new(Schema::new(vec![Field::new("a", DataType::Int64, true)]));
        let outcome = FragmentOutcome {
            plan: Some("AggregateExec: metrics=[output_rows=3]".into()),
            exchanged_rows: 7,
            exchanged_bytes: 56,
        };
        let messages: Vec<FlightData> = trailer(schema, &outcome).try_collect().await.expect("encode");
        assert_eq!(messages.len(), 1);
        assert_eq!(report_of(&messages[0]), Some(outcome));
        assert_eq!(report_of(&FlightData::default()), None);
        // The plan text alone, as a node of an earlier version sends it.
        let text = FlightData { app_metadata: [REPORT_MARK, b"AggregateExec"].concat().into(), ..Default::default() };
        assert_eq!(report_of(&text).and_then(|o| o.plan).as_deref(), Some("AggregateExec"));
    }
}
