//! Byte formats of shipped data: a [`PieceSet`] (one insert chunk's rows for the shards one
//! destination holds; what the outbox stores and what travels) and a [`ShipRequest`] (several
//! piece sets sent to one destination in one call, with the sender's identity for dedup).
//!
//! A piece set is `b"SWPS" | version u8 | header_len u32-le | header JSON | Arrow IPC stream`,
//! the stream holding one batch per piece, in header order. A ship request is
//! `b"SWSH" | version u8 | origin_len u32-le | origin | count u32-le | count × (has_seq u8 |
//! seq u64-le | len u32-le | piece set)`. All lengths are checked against the buffer: a truncated
//! or foreign message is an error naming what is wrong, never a panic or a misread.

use std::io::Cursor;

use datafusion::arrow::datatypes::SchemaRef;
use datafusion::arrow::ipc::reader::StreamReader;
use datafusion::arrow::ipc::writer::StreamWriter;
use datafusion::arrow::record_batch::RecordBatch;
use serde::{Deserialize, Serialize};

const PIECE_SET_MAGIC: &[u8; 4] = b"SWPS";
const SHIP_MAGIC: &[u8; 4] = b"SWSH";
const FORMAT_VERSION: u8 = 1;

/// What a piece set is for.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PieceSetHeader {
    pub table: String,
    pub table_id: u64,
    pub generation: u64,
    /// The catalog version the sender planned with: a receiver that has not seen it yet waits.
    pub catalog_version: u64,
    /// The insert's idempotency key.
    pub insert_id: String,
    /// Which input chunk of the insert this is (a large insert is split into chunks).
    pub chunk: u64,
    /// The shard of each batch, in order.
    pub shards: Vec<u32>,
}

impl PieceSetHeader {
    /// The dedup key a shard store remembers for this piece.
    pub fn piece_key(&self) -> String {
        format!("{}/{}", self.insert_id, self.chunk)
    }
}

/// One insert chunk's rows for the shards one destination holds.
#[derive(Debug, Clone)]
pub struct PieceSet {
    pub header: PieceSetHeader,
    pub batches: Vec<RecordBatch>,
}

/// Why bytes could not be decoded.
#[derive(Debug, thiserror::Error)]
#[error("malformed {what}: {problem}")]
pub struct CodecError {
    pub what: &'static str,
    pub problem: String,
}

fn err(what: &'static str, problem: impl Into<String>) -> CodecError {
    CodecError { what, problem: problem.into() }
}

struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
    what: &'static str,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], CodecError> {
        let end = self.pos.checked_add(n).filter(|&e| e <= self.buf.len());
        let end = end.ok_or_else(|| err(self.what, format!("{n} bytes needed at offset {}, buffer ends", self.pos)))?;
        let out = &self.buf[self.pos..end];
        self.pos = end;
        Ok(out)
    }
    fn u8(&mut self) -> Result<u8, CodecError> {
        Ok(self.take(1)?[0])
    }
    fn u32(&mut self) -> Result<u32, CodecError> {
        let b = self.take(4)?;
        Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }
    fn u64(&mut self) -> Result<u64, CodecError> {
        let b = self.take(8)?;
        let mut a = [0u8; 8];
        a.copy_from_slice(b);
        Ok(u64::from_le_bytes(a))
    }
    fn magic(&mut self, magic: &[u8; 4]) -> Result<(), CodecError> {
        if self.take(4)? != magic {
            return Err(err(self.what, "wrong magic (not a shardwise message)"));
        }
        let version = self.u8()?;
        if version != FORMAT_VERSION {
            return Err(err(self.what, format!("format version {version}, this node reads {FORMAT_VERSION}")));
        }
        Ok(())
    }
}

fn len_u32(len: usize, what: &'static str) -> Result<u32, CodecError> {
    u32::try_from(len).map_err(|_| err(what, format!("{len} bytes is too long")))
}

impl PieceSet {
    pub fn encode(&self, schema: &SchemaRef) -> Result<Vec<u8>, CodecError> {
        if self.header.shards.len() != self.batches.len() {
            return Err(err("piece set", "one shard per batch is required"));
        }
        let header = serde_json::to_vec(&self.header).map_err(|e| err("piece set", e.to_string()))?;
        let mut out = Vec::with_capacity(header.len() + shardwise_storage::ipc_size_estimate(&self.batches));
        out.extend_from_slice(PIECE_SET_MAGIC);
        out.push(FORMAT_VERSION);
        out.extend_from_slice(&len_u32(header.len(), "piece set")?.to_le_bytes());
        out.extend_from_slice(&header);
        let mut writer = StreamWriter::try_new(&mut out, schema).map_err(|e| err("piece set", e.to_string()))?;
        for batch in &self.batches {
            writer.write(batch).map_err(|e| err("piece set", e.to_string()))?;
        }
        writer.finish().map_err(|e| err("piece set", e.to_string()))?;
        drop(writer);
        Ok(out)
    }

    pub fn decode(bytes: &[u8]) -> Result<PieceSet, CodecError> {
        let what = "piece set";
        let mut r = Reader { buf: bytes, pos: 0, what };
        r.magic(PIECE_SET_MAGIC)?;
        let header_len = r.u32()? as usize;
        let header: PieceSetHeader =
            serde_json::from_slice(r.take(header_len)?).map_err(|e| err(what, format!("header: {e}")))?;
        let reader = StreamReader::try_new(Cursor::new(&bytes[r.pos..]), None).map_err(|e| err(what, e.to_string()))?;
        let batches = reader.collect::<Result<Vec<_>, _>>().map_err(|e| err(what, e.to_string()))?;
        if batches.len() != header.shards.len() {
            return Err(err(what, format!("{} batches for {} shards", batches.len(), header.shards.len())));
        }
        Ok(PieceSet { header, batches })
    }
}

/// One encoded piece set in a ship request, with its outbox sequence number if it came from one.
#[derive(Debug, Clone)]
pub struct ShipItem {
    pub seq: Option<u64>,
    pub payload: std::sync::Arc<Vec<u8>>,
}

/// Piece sets for one destination, sent in one call.
#[derive(Debug, Clone)]
pub struct ShipRequest {
    /// The sending outbox's identity (with `seq`: high-water-mark dedup at the receiver).
    pub origin: Option<String>,
    pub items: Vec<ShipItem>,
}

impl ShipRequest {
    pub fn encode(&self) -> Result<Vec<u8>, CodecError> {
        let what = "ship request";
        let origin = self.origin.as_deref().unwrap_or("");
        let total: usize = self.items.iter().map(|i| i.payload.len() + 13).sum();
        let mut out = Vec::with_capacity(16 + origin.len() + total);
        out.extend_from_slice(SHIP_MAGIC);
        out.push(FORMAT_VERSION);
        out.extend_from_slice(&len_u32(origin.len(), what)?.to_le_bytes());
        out.extend_from_slice(origin.as_bytes());
        out.extend_from_slice(&len_u32(self.items.len(), what)?.to_le_bytes());
        for item in &self.items {
            out.push(u8::from(item.seq.is_some()));
            out.extend_from_slice(&item.seq.unwrap_or(0).to_le_bytes());
            out.extend_from_slice(&len_u32(item.payload.len(), what)?.to_le_bytes());
            out.extend_from_slice(&item.payload);
        }
        Ok(out)
    }

    pub fn decode(bytes: &[u8]) -> Result<ShipRequest, CodecError> {
        let what = "ship request";
        let mut r = Reader { buf: bytes, pos: 0, what };
        r.magic(SHIP_MAGIC)?;
        let origin_len = r.u32()? as usize;
        let origin = std::str::from_utf8(r.take(origin_len)?).map_err(|_| err(what, "origin is not UTF-8"))?;
        let count = r.u32()? as usize;
        let mut items = Vec::with_capacity(count.min(4096));
        for _ in 0..count {
            let has_seq = r.u8()?;
            let seq = r.u64()?;
            let len = r.u32()? as usize;
            let payload = r.take(len)?.to_vec();
            items.push(ShipItem { seq: (has_seq != 0).then_some(seq), payload: std::sync::Arc::new(payload) });
        }
        if r.pos != bytes.len() {
            return Err(err(what, format!("{} trailing bytes", bytes.len() - r.pos)));
        }
        Ok(ShipRequest { origin: (!origin.is_empty()).then(|| origin.to_string()), items })
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use datafusion::arrow::array::Int64Array;
    use datafusion::arrow::datatypes::{DataType, Field, Schema};

    use super::*;

    fn set() -> (SchemaRef, PieceSet) {
        let schema = Arc::new(Schema::new(vec![Field::new("k", DataType::Int64, true)]));
        let b = |v: Vec<i64>| RecordBatch::try_new(schema.clone(), vec![Arc::new(Int64Array::from(v))]).unwrap();
        let header = PieceSetHeader {
            table: "t".into(),
            table_id: 3,
            generation: 1,
            catalog_version: 7,
            insert_id: "abc".into(),
            chunk: 2,
            shards: vec![0, 4],
        };
        (schema.clone(), PieceSet { header, batches: vec![b(vec![1, 2]), b(vec![3])] })
    }

    #[test]
    fn piece_set_and_ship_round_trip() {
        let (schema, set) = set();
        let bytes = set.encode(&schema).unwrap();
        let back = PieceSet::decode(&bytes).unwrap();
        assert_eq!(back.header, set.header);
        assert_eq!(back.batches, set.batches);
        assert_eq!(back.header.piece_key(), "abc/2");
        let req = ShipRequest {
            origin: Some("o1".into()),
            items: vec![
                ShipItem { seq: Some(9), payload: Arc::new(bytes.clone()) },
                ShipItem { seq: None, payload: Arc::new(bytes) },
            ],
        };
        let decoded = ShipRequest::decode(&req.encode().unwrap()).unwrap();
        assert_eq!(decoded.origin.as_deref(), Some("o1"));
        assert_eq!(decoded.items.iter().map(|i| i.seq).collect::<Vec<_>>(), vec![Some(9), None]);
        assert_eq!(decoded.items[0].payload, req.items[0].payload);
    }

    #[test]
    fn truncated_and_foreign_bytes_are_errors() {
        let (schema, set) = set();
        let bytes = set.encode(&schema).unwrap();
        for cut in [0, 3, 5, 9, 20, bytes.len() - 1] {
            assert!(PieceSet::decode(&bytes[..cut]).is_err(), "cut at {cut}");
        }
        let req = ShipRequest { origin: None, items: vec![ShipItem { seq: None, payload: Arc::new(bytes) }] };
        let enc = req.encode().unwrap();
        for cut in [0, 4, 8, 12, enc.len() - 1] {
            assert!(ShipRequest::decode(&enc[..cut]).is_err(), "cut at {cut}");
        }
        let err = ShipRequest::decode(b"GET / HTTP/1.1\r\n").unwrap_err();
        assert!(err.to_string().contains("wrong magic"), "{err}");
    }
}
