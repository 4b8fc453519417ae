//! How a fragment travels: the plan is serialized with `datafusion-proto`, shardwise's own leaf
//! ([`ShardScanExec`]) through [`ShardwiseCodec`], and the whole is wrapped in a
//! [`FragmentTicket`] that also says which slices of the shard (or which shuffle bucket) the
//! receiving node reads.
//!
//! Ticket layout: `SWFT`, a u32 format version, a u32 header length, the JSON header, then the
//! plan bytes. Every length is checked before use: a ticket from a peer that speaks something
//! else is an error naming what is wrong, never a panic.

use std::sync::Arc;

use datafusion::arrow::datatypes::Schema;
use datafusion::error::{DataFusionError, Result};
use datafusion::execution::TaskContext;
use datafusion::physical_plan::ExecutionPlan;
use datafusion_proto::bytes::{
    physical_plan_from_bytes_with_extension_codec, physical_plan_to_bytes_with_extension_codec,
};
use datafusion_proto::physical_plan::{PhysicalExtensionCodec, PhysicalProtoConverterExtension};
use datafusion_proto::protobuf;
use prost::Message;
use serde::{Deserialize, Serialize};

use super::scan::{ShardScanExec, ShardSlice, ShardTableRef};
use super::shuffle::{ShuffleReaderExec, ShuffleSource};
use crate::access::TableAccess;
use crate::group_topk;
use crate::many_groups;
use crate::small_groups;

const TICKET_MAGIC: &[u8; 4] = b"SWFT";
const TICKET_VERSION: u32 = 1;

/// What the leaf of a fragment reads on the node that runs it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum LeafAssignment {
    /// Exactly these slices (a fragment whose operators keep partitions apart).
    Slices(Vec<ShardSlice>),
    /// All of one shard, cut into as many slices as the node has threads (a fragment that
    /// aggregates or sorts the whole shard).
    WholeShard(u32),
    /// One bucket of a shuffle (the leaf is a [`ShuffleReaderExec`]).
    Bucket(u32),
}

impl LeafAssignment {
    /// The shard read, or the bucket merged: which entry of the fragment's candidate ranks
    /// applies.
    pub fn index(&self) -> u32 {
        match self {
            LeafAssignment::Slices(s) => s.first().map(|p| p.shard).unwrap_or(0),
            LeafAssignment::WholeShard(shard) => *shard,
            LeafAssignment::Bucket(bucket) => *bucket,
        }
    }

    /// The slices to read on a node running `threads` threads.
    pub fn slices(&self, threads: usize) -> Vec<ShardSlice> {
        match self {
            LeafAssignment::Slices(s) => s.clone(),
            LeafAssignment::WholeShard(shard) => ShardSlice::all_of(*shard, threads.max(1) as u32),
            LeafAssignment::Bucket(_) => Vec::new(),
        }
    }
}

/// The header of a fragment ticket.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TicketHeader {
    /// The initiator's query id (for logs, `system.queries` and cancellation).
    pub query_id: String,
    pub leaf: LeafAssignment,
    /// The query's `max_memory_usage` (0: no limit), enforced by the node running the fragment.
    #[serde(default)]
    pub max_memory_usage: u64,
    /// Send the plan with its metrics after the last row (`EXPLAIN ANALYZE` on the initiator).
    #[serde(default)]
    pub report: bool,
}

/// A fragment to run on a node holding a replica of its shard.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FragmentTicket {
    pub header: TicketHeader,
    /// The plan, as `datafusion-proto` bytes with [`ShardwiseCodec`] extensions.
    pub plan: Vec<u8>,
}

fn bad_ticket(problem: impl Into<String>) -> DataFusionError {
    DataFusionError::Plan(format!("not a shardwise fragment ticket: {}", problem.into()))
}

impl FragmentTicket {
    pub fn encode(&self) -> Result<Vec<u8>> {
        let header = serde_json::to_vec(&self.header)
            .map_err(|e| DataFusionError::Internal(format!("cannot encode a fragment ticket: {e}")))?;
        let header_len = u32::try_from(header.len()).map_err(|_| bad_ticket("header over 4 GiB"))?;
        let mut out = Vec::with_capacity(12 + header.len() + self.plan.len());
        out.extend_from_slice(TICKET_MAGIC);
        out.extend_from_slice(&TICKET_VERSION.to_le_bytes());
        out.extend_from_slice(&header_len.to_le_bytes());
        out.extend_from_slice(&header);
        out.extend_from_slice(&self.plan);
        Ok(out)
    }

    /// True when `bytes` starts like a fragment ticket (other tickets are JSON).
    pub fn is_fragment(bytes: &[u8]) -> bool {
        bytes.starts_with(TICKET_MAGIC)
    }

    pub fn decode(bytes: &[u8]) -> Result<FragmentTicket> {
        let rest = bytes.strip_prefix(TICKET_MAGIC.as_slice()).ok_or_else(|| bad_ticket("no SWFT magic"))?;
        let (version, rest) = split_u32(rest).ok_or_else(|| bad_ticket("cut short before its version"))?;
        if version != TICKET_VERSION {
            return Err(bad_ticket(format!("format version {version}, this node reads {TICKET_VERSION}")));
        }
        let (len, rest) = split_u32(rest).ok_or_else(|| bad_ticket("cut short before its header length"))?;
        let len = len as usize;
        if rest.len() < len {
            return Err(bad_ticket(format!("header of {len} bytes, only {} follow", rest.len())));
        }
        let header: TicketHeader =
            serde_json::from_slice(&rest[..len]).map_err(|e| bad_ticket(format!("header: {e}")))?;
        Ok(FragmentTicket { header, plan: rest[len..].to_vec() })
    }
}

fn split_u32(bytes: &[u8]) -> Option<(u32, &[u8])> {
    let (head, rest) = bytes.split_first_chunk::<4>()?;
    Some((u32::from_le_bytes(*head), rest))
}

/// The serialized form of a [`ShardScanExec`]: JSON, then the table schema as protobuf.
#[derive(Debug, Serialize, Deserialize)]
struct ScanSpec {
    table: ShardTableRef,
    projection: Option<Vec<usize>>,
    parts: Vec<ShardSlice>,
    require_verified_placement: bool,
}

/// `datafusion-proto` extension codec for shardwise's plan nodes.
#[derive(Debug)]
pub struct ShardwiseCodec {
    access: Arc<dyn TableAccess>,
    /// On the node running a fragment: what its leaf reads (replacing the initiator's), and the
    /// node's threads.
    leaf: Option<(LeafAssignment, usize)>,
    /// The fragment reports its plan with metrics (`EXPLAIN ANALYZE`): its shuffle readers ask
    /// for the stage-1 plans too.
    report: bool,
}

const SCAN_TAG: u8 = 1;
const SHUFFLE_READER_TAG: u8 = 2;
/// A top-N per group ([`group_topk::codec`]); it has an input.
const TOPK_TAG: u8 = 3;
/// A small-group aggregation ([`small_groups::codec`]); it has an input.
const SMALL_GROUPS_TAG: u8 = 4;
/// A many-group final aggregation ([`many_groups::codec`]); it has an input.
const MANY_GROUPS_TAG: u8 = 5;

/// The serialized form of a [`ShuffleReaderExec`] (then the schema, then the stage-1 plan).
#[derive(Debug, Serialize, Deserialize)]
struct ReaderSpec {
    exchange_id: String,
    sources: Vec<ShuffleSource>,
    key_columns: usize,
    buckets: u32,
}

impl ShardwiseCodec {
    /// A codec for the initiator (leaves keep their parts).
    pub fn new(access: Arc<dyn TableAccess>) -> Self {
        ShardwiseCodec { access, leaf: None, report: false }
    }

    /// A codec for the node that runs a fragment: its leaf reads `leaf` with `threads` threads.
    pub fn for_worker(access: Arc<dyn TableAccess>, leaf: LeafAssignment, threads: usize) -> Self {
        ShardwiseCodec { access, leaf: Some((leaf, threads)), report: false }
    }

    /// The same codec, for a fragment whose plan is reported (`EXPLAIN ANALYZE`) or not.
    pub fn reporting(self, report: bool) -> Self {
        ShardwiseCodec { report, ..self }
    }

    pub fn encode_plan(&self, plan: Arc<dyn ExecutionPlan>) -> Result<Vec<u8>> {
        Ok(physical_plan_to_bytes_with_extension_codec(plan, self)?.to_vec())
    }

    pub fn decode_plan(&self, bytes: &[u8], ctx: &TaskContext) -> Result<Arc<dyn ExecutionPlan>> {
        physical_plan_from_bytes_with_extension_codec(bytes, ctx, self)
    }
}

impl PhysicalExtensionCodec for ShardwiseCodec {
    fn try_decode(
        &self,
        buf: &[u8],
        inputs: &[Arc<dyn ExecutionPlan>],
        ctx: &TaskContext,
        proto_converter: &dyn PhysicalProtoConverterExtension,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        if let Some(rest) = buf.strip_prefix(&[TOPK_TAG]) {
            let [input] = inputs else { return Err(bad_ticket("a top-N per group without its one input")) };
            return group_topk::codec::decode(rest, Arc::clone(input), ctx, self, proto_converter);
        }
        if let Some(rest) = buf.strip_prefix(&[SMALL_GROUPS_TAG]) {
            let [input] = inputs else { return Err(bad_ticket("a small-group aggregation without its one input")) };
            return small_groups::codec::decode(rest, Arc::clone(input), ctx, self);
        }
        if let Some(rest) = buf.strip_prefix(&[MANY_GROUPS_TAG]) {
            let [input] = inputs else { return Err(bad_ticket("a many-group aggregation without its one input")) };
            return many_groups::codec::decode(rest, Arc::clone(input), ctx, self);
        }
        if !inputs.is_empty() {
            return Err(bad_ticket("a shardwise leaf with inputs"));
        }
        let (tag, buf) = buf.split_first().ok_or_else(|| bad_ticket("an empty extension node"))?;
        let (json, rest) = take_sized(buf).ok_or_else(|| bad_ticket("extension node cut short"))?;
        let (schema, rest) = take_sized(rest).ok_or_else(|| bad_ticket("extension schema cut short"))?;
        let proto = protobuf::Schema::decode(schema).map_err(|e| bad_ticket(format!("extension schema: {e}")))?;
        let schema = Arc::new(Schema::try_from(&proto).map_err(|e| bad_ticket(format!("extension schema: {e}")))?);
        match *tag {
            SCAN_TAG => {
                let spec: ScanSpec =
                    serde_json::from_slice(json).map_err(|e| bad_ticket(format!("shard scan: {e}")))?;
                let parts = match &self.leaf {
                    Some((leaf, threads)) => leaf.slices(*threads),
                    None => spec.parts,
                };
                let scan =
                    ShardScanExec::try_new(spec.table, schema, spec.projection, parts, Arc::clone(&self.access))?
                        .with_required_verified_placement(spec.require_verified_placement);
                Ok(Arc::new(scan))
            }
            SHUFFLE_READER_TAG => {
                let spec: ReaderSpec =
                    serde_json::from_slice(json).map_err(|e| bad_ticket(format!("shuffle reader: {e}")))?;
                let bucket = match &self.leaf {
                    Some((LeafAssignment::Bucket(b), _)) => Some(*b),
                    _ => None,
                };
                Ok(Arc::new(
                    ShuffleReaderExec::new(
                        spec.exchange_id,
                        Arc::new(rest.to_vec()),
                        spec.sources,
                        spec.key_columns,
                        bucket,
                        spec.buckets,
                        schema,
                        Arc::clone(&self.access),
                    )
                    .with_stage1_reports(self.report),
                ))
            }
            other => Err(bad_ticket(format!("unknown extension node kind {other}"))),
        }
    }

    fn try_encode(
        &self,
        node: Arc<dyn ExecutionPlan>,
        buf: &mut Vec<u8>,
        proto_converter: &dyn PhysicalProtoConverterExtension,
    ) -> Result<()> {
        let internal = |e: String| DataFusionError::Internal(e);
        if let Some(bytes) = group_topk::codec::encode(&node, self, proto_converter)? {
            buf.push(TOPK_TAG);
            buf.extend_from_slice(&bytes);
            return Ok(());
        }
        if let Some(bytes) = small_groups::codec::encode(&node, self)? {
            buf.push(SMALL_GROUPS_TAG);
            buf.extend_from_slice(&bytes);
            return Ok(());
        }
        if let Some(bytes) = many_groups::codec::encode(&node, self)? {
            buf.push(MANY_GROUPS_TAG);
            buf.extend_from_slice(&bytes);
            return Ok(());
        }
        if let Some(scan) = node.downcast_ref::<ShardScanExec>() {
            let spec = ScanSpec {
                table: scan.table().clone(),
                projection: scan.projection().cloned(),
                parts: scan.parts().to_vec(),
                require_verified_placement: scan.requires_verified_placement(),
            };
            let json = serde_json::to_vec(&spec).map_err(|e| internal(e.to_string()))?;
            let schema = protobuf::Schema::try_from(scan.table_schema().as_ref())?.encode_to_vec();
            buf.push(SCAN_TAG);
            put_sized(buf, &json)?;
            put_sized(buf, &schema)?;
            return Ok(());
        }
        if let Some(reader) = node.downcast_ref::<ShuffleReaderExec>() {
            let spec = ReaderSpec {
                exchange_id: reader.exchange_id.clone(),
                sources: reader.sources.clone(),
                key_columns: reader.key_columns,
                buckets: reader.buckets,
            };
            let json = serde_json::to_vec(&spec).map_err(|e| internal(e.to_string()))?;
            let schema = protobuf::Schema::try_from(reader.schema().as_ref())?.encode_to_vec();
            buf.push(SHUFFLE_READER_TAG);
            put_sized(buf, &json)?;
            put_sized(buf, &schema)?;
            buf.extend_from_slice(&reader.stage1);
            return Ok(());
        }
        Err(DataFusionError::NotImplemented(format!("{} cannot be sent to another node", node.name())))
    }
}

/// Appends a u32 length and `bytes`.
fn put_sized(buf: &mut Vec<u8>, bytes: &[u8]) -> Result<()> {
    let len = u32::try_from(bytes.len()).map_err(|_| DataFusionError::Internal("a plan node over 4 GiB".into()))?;
    buf.extend_from_slice(&len.to_le_bytes());
    buf.extend_from_slice(bytes);
    Ok(())
}

/// Splits a u32 length and that many bytes off `buf`.
fn take_sized(buf: &[u8]) -> Option<(&[u8], &[u8])> {
    let (len, rest) = split_u32(buf)?;
    let len = len as usize;
    (rest.len() >= len).then(|| rest.split_at(len))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tickets_round_trip_and_bad_bytes_are_errors() {
        let ticket = FragmentTicket {
            header: TicketHeader {
                query_id: "q1".into(),
                leaf: LeafAssignment::WholeShard(3),
                max_memory_usage: 7,
                report: true,
            },
            plan: vec![1, 2, 3],
        };
        let bytes = ticket.encode().expect("encode");
        assert!(FragmentTicket::is_fragment(&bytes));
        assert_eq!(FragmentTicket::decode(&bytes).expect("decode"), ticket);
        for cut in [0, 3, 6, 10, 14] {
            let err = FragmentTicket::decode(&bytes[..cut]).expect_err("cut ticket");
            assert!(err.to_string().contains("not a shardwise fragment ticket"), "{err}");
        }
        let mut wrong_version = bytes.clone();
        wrong_version[4] = 9;
        assert!(FragmentTicket::decode(&wrong_version).expect_err("version").to_string().contains("version 9"));
    }

    #[test]
    fn whole_shard_uses_the_node_threads() {
        assert_eq!(LeafAssignment::WholeShard(2).slices(3).len(), 3);
        assert_eq!(LeafAssignment::WholeShard(2).slices(0).len(), 1);
        assert_eq!(LeafAssignment::WholeShard(2).index(), 2);
        assert_eq!(LeafAssignment::Bucket(4).index(), 4);
    }
}
