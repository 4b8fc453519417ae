//! The payload of a shard store's WAL record: one piece, with what dedup needs to rebuild its
//! state on replay.
//!
//! Layout (version 1), all integers little-endian:
//!
//! ```text
//! magic "SWPR" | version u8 = 1 | kind u8 | flags u8
//! [origin: len u32 | UTF-8]      if flags & 2
//! [seq: u64]                     if flags & 4
//! [insert_id: len u32 | UTF-8]   if flags & 8
//! [Arrow IPC stream of one batch, to the end]   if kind = 1
//! ```
//!
//! `kind` 1 is a piece's rows; kind 2 only advances its origin's high-water mark (a piece whose
//! insert id was a duplicate but whose `seq` was new). Flag 1 is `verified_placement`. The WAL
//! frame around the payload carries the checksum, so the payload has none of its own.

use std::io::Cursor;

use arrow::array::RecordBatch;
use arrow::datatypes::SchemaRef;
use arrow::ipc::reader::StreamReader;
use arrow::ipc::writer::StreamWriter;

use crate::error::StorageError;
use crate::ipc_size::ipc_size_estimate;

const MAGIC: &[u8; 4] = b"SWPR";
const VERSION: u8 = 1;
const KIND_ROWS: u8 = 1;
const KIND_MARK: u8 = 2;
const FLAG_VERIFIED: u8 = 1;
const FLAG_ORIGIN: u8 = 2;
const FLAG_SEQ: u8 = 4;
const FLAG_INSERT_ID: u8 = 8;
const KNOWN_FLAGS: u8 = FLAG_VERIFIED | FLAG_ORIGIN | FLAG_SEQ | FLAG_INSERT_ID;

/// A piece as its WAL record holds it.
#[derive(Debug, Clone)]
pub(super) struct PieceRecord {
    pub origin: Option<String>,
    pub seq: Option<u64>,
    pub insert_id: Option<String>,
    pub verified_placement: bool,
    /// The rows (with the store's schema); `None` for a record that only advances a mark.
    pub batch: Option<RecordBatch>,
}

/// Appends the encoded record to `out` (which may hold other records before it). `record.batch`
/// must already carry the store's schema.
pub(super) fn encode_into(record: &PieceRecord, out: &mut Vec<u8>) -> Result<(), StorageError> {
    let mut flags = 0;
    flags |= if record.verified_placement { FLAG_VERIFIED } else { 0 };
    flags |= if record.origin.is_some() { FLAG_ORIGIN } else { 0 };
    flags |= if record.seq.is_some() { FLAG_SEQ } else { 0 };
    flags |= if record.insert_id.is_some() { FLAG_INSERT_ID } else { 0 };
    let kind = if record.batch.is_some() { KIND_ROWS } else { KIND_MARK };
    out.reserve(record.batch.as_ref().map_or(64, |batch| ipc_size_estimate([batch])));
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&[VERSION, kind, flags]);
    if let Some(origin) = &record.origin {
        put_str(out, origin)?;
    }
    if let Some(seq) = record.seq {
        out.extend_from_slice(&seq.to_le_bytes());
    }
    if let Some(id) = &record.insert_id {
        put_str(out, id)?;
    }
    if let Some(batch) = &record.batch {
        let arrow_err = |source| StorageError::Arrow { op: "encode piece as Arrow IPC", source };
        let mut writer = StreamWriter::try_new(&mut *out, batch.schema_ref()).map_err(arrow_err)?;
        writer.write(batch).map_err(arrow_err)?;
        writer.finish().map_err(arrow_err)?;
    }
    Ok(())
}

fn put_str(out: &mut Vec<u8>, s: &str) -> Result<(), StorageError> {
    let len = u32::try_from(s.len()).map_err(|_| StorageError::InvalidOption {
        name: "origin/insert_id",
        value: format!("{} bytes", s.len()),
        expected: "at most 4 GiB".to_string(),
    })?;
    out.extend_from_slice(&len.to_le_bytes());
    out.extend_from_slice(s.as_bytes());
    Ok(())
}

/// Decodes a record; its batch must have the columns of `schema`, and is given `schema` itself.
/// The error is the problem, for the caller to wrap with the LSN.
pub(super) fn decode(payload: &[u8], schema: &SchemaRef) -> Result<PieceRecord, String> {
    let mut reader = Reader { bytes: payload, pos: 0 };
    let magic = reader.take(4, "magic")?;
    if magic != MAGIC {
        return Err(format!("bad magic {magic:02x?}, expected {MAGIC:02x?} (not a shard store piece)"));
    }
    let [version, kind, flags] = [reader.u8("version")?, reader.u8("kind")?, reader.u8("flags")?];
    if version != VERSION {
        return Err(format!("record format version {version}, this build reads version {VERSION}"));
    }
    if flags & !KNOWN_FLAGS != 0 {
        return Err(format!("unknown flags {flags:#04x}"));
    }
    let origin = if flags & FLAG_ORIGIN != 0 { Some(reader.string("origin")?) } else { None };
    let seq = if flags & FLAG_SEQ != 0 { Some(reader.u64("seq")?) } else { None };
    let insert_id = if flags & FLAG_INSERT_ID != 0 { Some(reader.string("insert_id")?) } else { None };
    let rest = &payload[reader.pos..];
    let batch = match kind {
        KIND_ROWS => Some(decode_batch(rest, schema)?),
        KIND_MARK if rest.is_empty() => None,
        KIND_MARK => return Err(format!("{} stray bytes after a mark-only record", rest.len())),
        other => return Err(format!("unknown record kind {other}")),
    };
    Ok(PieceRecord { origin, seq, insert_id, verified_placement: flags & FLAG_VERIFIED != 0, batch })
}

fn decode_batch(bytes: &[u8], schema: &SchemaRef) -> Result<RecordBatch, String> {
    let reader = StreamReader::try_new(Cursor::new(bytes), None).map_err(|e| format!("Arrow IPC stream: {e}"))?;
    if reader.schema().fields() != schema.fields() {
        return Err(format!("batch schema {:?} is not the store's {:?}", reader.schema(), schema));
    }
    let mut batches = Vec::with_capacity(1);
    for batch in reader {
        batches.push(batch.map_err(|e| format!("Arrow IPC stream: {e}"))?);
    }
    let [batch] = <[RecordBatch; 1]>::try_from(batches)
        .map_err(|b| format!("{} batches in the IPC stream, expected exactly 1", b.len()))?;
    RecordBatch::try_new(schema.clone(), batch.columns().to_vec()).map_err(|e| format!("rebuilding the batch: {e}"))
}

/// A bounds-checked cursor over the header.
struct Reader<'a> {
    bytes: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, len: usize, what: &str) -> Result<&'a [u8], String> {
        let end = self.pos.checked_add(len).filter(|&end| end <= self.bytes.len());
        let end = end.ok_or_else(|| format!("header ends inside {what} (at byte {})", self.pos))?;
        let slice = &self.bytes[self.pos..end];
        self.pos = end;
        Ok(slice)
    }

    fn u8(&mut self, what: &str) -> Result<u8, String> {
        Ok(self.take(1, what)?[0])
    }

    fn u32(&mut self, what: &str) -> Result<u32, String> {
        let mut le = [0; 4];
        le.copy_from_slice(self.take(4, what)?);
        Ok(u32::from_le_bytes(le))
    }

    fn u64(&mut self, what: &str) -> Result<u64, String> {
        let mut le = [0; 8];
        le.copy_from_slice(self.take(8, what)?);
        Ok(u64::from_le_bytes(le))
    }

    fn string(&mut self, what: &str) -> Result<String, String> {
        let len = self.u32(what)? as usize;
        let bytes = self.take(len, what)?;
        String::from_utf8(bytes.to_vec()).map_err(|_| format!("{what} is not UTF-8"))
    }
}
