//! `CHECK TABLE t`: are the replicas of each shard the same? (And the answer of `REPAIR TABLE
//! t`, which rebuilds those that are not from those that are: `shardwise-server`'s
//! `tables/repair.rs`.) The node that runs the statement
//! gathers every replica's rows and content checksum (`shardwise_storage::checksum`) from the
//! nodes that hold them; this module compares them and writes the answer.
//!
//! ClickHouse's `CHECK TABLE` checks each data part against its own checksums; here every
//! record already carries a CRC that recovery checks, so what is left to check is what only the
//! cluster can see: a replica that lost rows (a WAL tail cut by a faulty disk, a replica's files
//! removed) or holds rows the others do not (an `immediate` insert that failed part-way and was
//! not retried). As in ClickHouse, `check_query_single_value_result = 1` (the default) answers
//! one row, `result` (1 or 0), and `0` one row per replica.
//!
//! A replica is **passed** when it was read and holds the same rows as every other replica of
//! its shard that was read. When the replicas read disagree, those that share the content of a
//! strict majority of them pass and the others fail; with no majority (two replicas, say) every
//! one fails, since nothing says which is right. Rows still queued for a replica's node in some
//! node's outbox (`delay_mode_distributed`) are named in its message: a difference can be rows in
//! flight, which `SYSTEM FLUSH DISTRIBUTED t` delivers.

use std::collections::BTreeMap;
use std::sync::Arc;

use datafusion::arrow::array::{ArrayRef, BooleanArray, StringArray, UInt8Array, UInt32Array, UInt64Array};
use datafusion::arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use datafusion::arrow::record_batch::RecordBatch;
use datafusion::error::DataFusionError;
use shardwise_storage::ContentChecksum;

use crate::access::{ReplicaCheckRow, ReplicaRepairRow};
use crate::error::QueryError;

/// What reading one replica gave.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReplicaRead {
    pub shard: u32,
    pub replica: u32,
    pub rank: u32,
    /// Its content, or why it could not be read.
    pub content: Result<ContentChecksum, String>,
    /// It was not read because of the replica itself (damaged, failed, its files gone), as its
    /// node said, not because its node did not answer.
    pub replica_fault: bool,
    /// What its last opening found suspect, though it is read (its WAL's last record cut for
    /// failing its checksum: a torn write, or damage to rows it acknowledged).
    pub warning: Option<String>,
}

/// What a check row's message says of a replica rows are still queued for (followed by its
/// rank); `REPAIR TABLE` takes it as a sign that the table is being written.
pub const QUEUED_NOTE: &str = "are still queued for rank";

/// The answer rows of `CHECK TABLE table`, in shard and replica order: `reads` compared shard by
/// shard; `queued_rows` is, by destination rank, the table's rows still in the nodes' outboxes.
pub fn compare(table: &str, mut reads: Vec<ReplicaRead>, queued_rows: &BTreeMap<u32, u64>) -> Vec<ReplicaCheckRow> {
    reads.sort_by_key(|r| (r.shard, r.replica));
    let mut out = Vec::with_capacity(reads.len());
    for shard in reads.chunk_by(|a, b| a.shard == b.shard) {
        let contents: Vec<ContentChecksum> = shard.iter().filter_map(|r| r.content.clone().ok()).collect();
        // The content a strict majority of the replicas read hold, if any.
        let majority = contents.iter().find(|c| contents.iter().filter(|o| o == c).count() * 2 > contents.len());
        let all_agree = contents.windows(2).all(|w| w[0] == w[1]);
        for read in shard {
            let (is_passed, mut message) = match &read.content {
                Err(why) => (false, format!("not read: {why}")),
                Ok(_) if all_agree => (true, String::new()),
                Ok(mine) => {
                    let others: Vec<String> = shard
                        .iter()
                        .filter(|o| o.rank != read.rank)
                        .filter_map(|o| o.content.as_ref().ok().filter(|c| *c != mine).map(|c| (o.rank, c)))
                        .map(|(rank, c)| format!("rank {rank} has {} rows, checksum {:016x}", c.rows, c.checksum))
                        .collect();
                    let verdict = match majority {
                        Some(m) if m == mine => "agrees with the majority of its shard's replicas; ",
                        Some(_) => "differs from the majority of its shard's replicas; ",
                        None => "its shard's replicas differ and no majority agrees; ",
                    };
                    (majority == Some(mine), format!("{verdict}{}", others.join(", ")))
                }
            };
            // Worth saying when the replica differs: it may be the one that lost rows.
            if let Some(warning) = read.warning.as_ref().filter(|_| !is_passed) {
                let suspect = format!("suspect: {warning}");
                message = match message.is_empty() {
                    true => suspect,
                    false => format!("{message}; {suspect}"),
                };
            }
            if let Some(rows) = queued_rows.get(&read.rank).filter(|r| **r > 0) {
                let queued = format!(
                    "{rows} rows of {table} {QUEUED_NOTE} {} (system.sync_queues): a difference may be rows on their \
                     way, which SYSTEM FLUSH DISTRIBUTED {table} delivers",
                    read.rank
                );
                message = match message.is_empty() {
                    true => queued,
                    false => format!("{message}; {queued}"),
                };
            }
            let content = read.content.as_ref().ok();
            out.push(ReplicaCheckRow {
                shard: read.shard,
                replica: read.replica,
                rank: read.rank,
                rows: content.map(|c| c.rows),
                checksum: content.map(|c| c.checksum),
                is_passed,
                message,
                replica_fault: read.replica_fault,
                suspect: read.warning.is_some(),
            });
        }
    }
    out
}

/// The columns `CHECK TABLE` answers: `result` when `single_value`, else one row per replica.
pub fn schema(single_value: bool) -> SchemaRef {
    if single_value {
        return Arc::new(Schema::new(vec![Field::new("result", DataType::UInt8, false)]));
    }
    Arc::new(Schema::new(vec![
        Field::new("shard", DataType::UInt32, false),
        Field::new("replica", DataType::UInt32, false),
        Field::new("rank", DataType::UInt32, false),
        Field::new("rows", DataType::UInt64, true),
        Field::new("checksum", DataType::Utf8, true),
        Field::new("is_passed", DataType::Boolean, false),
        Field::new("message", DataType::Utf8, false),
    ]))
}

/// The rows `CHECK TABLE` answers ([`schema`]): one, `result` (1 when every replica passed),
/// when `single_value`, else one per replica.
pub fn answer(rows: &[ReplicaCheckRow], single_value: bool) -> Result<RecordBatch, QueryError> {
    let columns: Vec<ArrayRef> = match single_value {
        true => vec![Arc::new(UInt8Array::from(vec![u8::from(rows.iter().all(|r| r.is_passed))]))],
        false => vec![
            Arc::new(UInt32Array::from_iter_values(rows.iter().map(|r| r.shard))),
            Arc::new(UInt32Array::from_iter_values(rows.iter().map(|r| r.replica))),
            Arc::new(UInt32Array::from_iter_values(rows.iter().map(|r| r.rank))),
            Arc::new(UInt64Array::from_iter(rows.iter().map(|r| r.rows))),
            Arc::new(StringArray::from_iter(rows.iter().map(|r| r.checksum.map(|c| format!("{c:016x}"))))),
            Arc::new(BooleanArray::from_iter(rows.iter().map(|r| Some(r.is_passed)))),
            Arc::new(StringArray::from_iter_values(rows.iter().map(|r| r.message.as_str()))),
        ],
    };
    Ok(RecordBatch::try_new(schema(single_value), columns).map_err(DataFusionError::from)?)
}

/// The columns `REPAIR TABLE` answers: one row per replica.
pub fn repair_schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        Field::new("shard", DataType::UInt32, false),
        Field::new("replica", DataType::UInt32, false),
        Field::new("rank", DataType::UInt32, false),
        Field::new("action", DataType::Utf8, false),
        Field::new("source_rank", DataType::UInt32, true),
        Field::new("rows", DataType::UInt64, true),
        Field::new("message", DataType::Utf8, false),
    ]))
}

/// The rows `REPAIR TABLE` answers ([`repair_schema`]).
pub fn repair_answer(rows: &[ReplicaRepairRow]) -> Result<RecordBatch, QueryError> {
    let columns: Vec<ArrayRef> = vec![
        Arc::new(UInt32Array::from_iter_values(rows.iter().map(|r| r.shard))),
        Arc::new(UInt32Array::from_iter_values(rows.iter().map(|r| r.replica))),
        Arc::new(UInt32Array::from_iter_values(rows.iter().map(|r| r.rank))),
        Arc::new(StringArray::from_iter_values(rows.iter().map(|r| r.action.as_str()))),
        Arc::new(UInt32Array::from_iter(rows.iter().map(|r| r.source_rank))),
        Arc::new(UInt64Array::from_iter(rows.iter().map(|r| r.rows))),
        Arc::new(StringArray::from_iter_values(rows.iter().map(|r| r.message.as_str()))),
    ];
    Ok(RecordBatch::try_new(repair_schema(), columns).map_err(DataFusionError::from)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read(shard: u32, replica: u32, rank: u32, rows: u64, checksum: u64) -> ReplicaRead {
        ReplicaRead {
            shard,
            replica,
            rank,
            content: Ok(ContentChecksum { rows, checksum }),
            replica_fault: false,
            warning: None,
        }
    }

    fn verdicts(rows: &[ReplicaCheckRow]) -> Vec<(u32, u32, bool)> {
        rows.iter().map(|r| (r.shard, r.rank, r.is_passed)).collect()
    }

    #[test]
    fn replicas_that_agree_pass_and_answer_one() {
        // Rows queued for rank 1 are said on its replicas, which pass all the same: they agree now.
        let queued = BTreeMap::from([(1, 7), (0, 0)]);
        let rows = compare("t", vec![read(1, 0, 1, 5, 9), read(0, 1, 1, 3, 7), read(0, 0, 0, 3, 7)], &queued);
        assert_eq!(verdicts(&rows), vec![(0, 0, true), (0, 1, true), (1, 1, true)]);
        assert_eq!(rows[0].message, "");
        assert!(rows[1].message.starts_with("7 rows of t are still queued for rank 1"), "{}", rows[1].message);
        let single = answer(&rows, true).unwrap();
        let column = single.column(0).as_any().downcast_ref::<UInt8Array>().unwrap();
        assert_eq!(column.value(0), 1);
        assert_eq!(answer(&rows, false).unwrap().num_rows(), 3);
    }

    #[test]
    fn two_replicas_that_differ_both_fail_and_say_what_the_other_has() {
        let queued = BTreeMap::from([(1, 40)]);
        let rows = compare("t", vec![read(0, 0, 0, 100, 1), read(0, 1, 1, 60, 2)], &queued);
        assert_eq!(verdicts(&rows), vec![(0, 0, false), (0, 1, false)]);
        assert!(rows[0].message.contains("no majority") && rows[0].message.contains("rank 1 has 60 rows"));
        // The replica rows are queued for is told so; the other is not.
        assert!(rows[1].message.contains("40 rows of t are still queued for rank 1"), "{}", rows[1].message);
        assert!(!rows[0].message.contains("queued"));
        let single = answer(&rows, true).unwrap();
        assert_eq!(single.column(0).as_any().downcast_ref::<UInt8Array>().unwrap().value(0), 0);
    }

    #[test]
    fn the_majority_passes_and_an_unread_replica_fails() {
        let rows = compare(
            "t",
            vec![
                read(0, 0, 0, 10, 1),
                read(0, 1, 1, 10, 1),
                read(0, 2, 2, 9, 5),
                ReplicaRead {
                    shard: 1,
                    replica: 0,
                    rank: 1,
                    content: Err("rank 1 is down".into()),
                    replica_fault: false,
                    warning: None,
                },
                read(1, 1, 2, 4, 4),
            ],
            &BTreeMap::new(),
        );
        assert_eq!(verdicts(&rows), vec![(0, 0, true), (0, 1, true), (0, 2, false), (1, 1, false), (1, 2, true)]);
        assert!(rows[2].message.starts_with("differs from the majority"), "{}", rows[2].message);
        assert!(rows[0].message.contains("rank 2 has 9 rows"), "{}", rows[0].message);
        assert_eq!(rows[3].message, "not read: rank 1 is down");
        assert_eq!((rows[3].rows, rows[3].checksum), (None, None));
    }
}
