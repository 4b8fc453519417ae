//! The outbox's WAL record payloads: how an append, an ack, a discard and a batch of carried items
//! are laid out inside one WAL record (the WAL frame around them adds length, CRC-32C and LSN).
//!
//! All integers little-endian; strings are UTF-8 with a `u32` byte length in front:
//! ```text
//! append  = 0x01 | seq u64 | appended_unix_ms u64 | count u32 | item × count
//! ack     = 0x02 | count u32 | (dest u32 | up_to_seq u64) × count
//! discard = 0x03 | table str
//! carry   = 0x04 | count u32 | (seq u64 | appended_unix_ms u64 | item) × count
//! acked   = 0x05 | count u32 | (dest u32 | seq u64) × count
//! item    = dest u32 | rows u64 | table str | payload_len u32 | payload
//! ```
//! An append's items share its seq. A carry record re-writes still-pending items under their
//! original seqs so that old segments can be deleted (see the parent module). An ack marks every
//! item of a destination up to a seq delivered; an acked record marks single items delivered (a
//! shipment of which some items could not be applied: their tables' replicas at the destination
//! refused them, the others' went in).
//! Decoding rejects anything that does not parse exactly: unknown tags, counts that do not fit the
//! bytes, trailing bytes, invalid UTF-8, an append with no item or a destination twice.

use std::collections::BTreeSet;

use super::OutboxItem;
use crate::error::StorageError;
use crate::wal::WAL_RECORD_MAX_BYTES;

const TAG_APPEND: u8 = 0x01;
const TAG_ACK: u8 = 0x02;
const TAG_DISCARD: u8 = 0x03;
const TAG_CARRY: u8 = 0x04;
const TAG_ACKED_ITEMS: u8 = 0x05;

/// Encoded bytes of an item besides its table name and payload.
const ITEM_FIXED_BYTES: usize = 4 + 8 + 4 + 4;
/// Encoded bytes a carried item adds to an item (seq and append time).
const CARRY_ITEM_EXTRA_BYTES: usize = 8 + 8;
/// An append record's tag, seq, append time and item count.
pub(super) const APPEND_HEADER_BYTES: usize = 1 + 8 + 8 + 4;
/// A carry record's tag and item count.
pub(super) const CARRY_HEADER_BYTES: usize = 1 + 4;

/// One item as written: where it goes and what it carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct ItemRef<'a> {
    pub dest: u32,
    pub rows: u64,
    pub table: &'a str,
    pub payload: &'a [u8],
}

/// One item read back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct DecodedItem {
    pub dest: u32,
    pub rows: u64,
    pub table: String,
    pub payload: Vec<u8>,
}

/// A pending item re-written by a carry record, under its original seq and append time.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct CarriedItem {
    pub seq: u64,
    pub appended_unix_ms: u64,
    pub item: DecodedItem,
}

/// A decoded outbox record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Record {
    Append {
        seq: u64,
        appended_unix_ms: u64,
        items: Vec<DecodedItem>,
    },
    Ack {
        acks: Vec<(u32, u64)>,
    },
    /// Single items `(dest, seq)` delivered.
    AckedItems {
        items: Vec<(u32, u64)>,
    },
    Discard {
        table: String,
    },
    Carry {
        items: Vec<CarriedItem>,
    },
}

/// The encoded size of one item inside an append record.
pub(super) fn item_encoded_bytes(table: &str, payload_len: usize) -> usize {
    ITEM_FIXED_BYTES + table.len() + payload_len
}

/// The encoded size of one item inside a carry record.
pub(super) fn carried_item_encoded_bytes(table: &str, payload_len: usize) -> usize {
    CARRY_ITEM_EXTRA_BYTES + item_encoded_bytes(table, payload_len)
}

pub(super) fn encode_append(seq: u64, appended_unix_ms: u64, items: &[ItemRef<'_>]) -> Vec<u8> {
    let len = APPEND_HEADER_BYTES + items.iter().map(|i| item_encoded_bytes(i.table, i.payload.len())).sum::<usize>();
    let mut out = Vec::with_capacity(len);
    out.push(TAG_APPEND);
    out.extend_from_slice(&seq.to_le_bytes());
    out.extend_from_slice(&appended_unix_ms.to_le_bytes());
    put_len(&mut out, items.len());
    for item in items {
        put_item(&mut out, item);
    }
    out
}

pub(super) fn encode_ack(acks: &[(u32, u64)]) -> Vec<u8> {
    encode_pairs(TAG_ACK, acks)
}

/// Encodes an acked record: the single items `(dest, seq)` delivered.
pub(super) fn encode_acked_items(items: &[(u32, u64)]) -> Vec<u8> {
    encode_pairs(TAG_ACKED_ITEMS, items)
}

/// `tag | count u32 | (u32 | u64) × count`: the layout of an ack and an acked record.
fn encode_pairs(tag: u8, pairs: &[(u32, u64)]) -> Vec<u8> {
    let mut out = Vec::with_capacity(5 + pairs.len() * 12);
    out.push(tag);
    put_len(&mut out, pairs.len());
    for (dest, seq) in pairs {
        out.extend_from_slice(&dest.to_le_bytes());
        out.extend_from_slice(&seq.to_le_bytes());
    }
    out
}

pub(super) fn encode_discard(table: &str) -> Vec<u8> {
    let mut out = Vec::with_capacity(5 + table.len());
    out.push(TAG_DISCARD);
    put_str(&mut out, table);
    out
}

/// Encodes a carry record of `(seq, appended_unix_ms, item)`.
pub(super) fn encode_carry(items: &[(u64, u64, ItemRef<'_>)]) -> Vec<u8> {
    let len = CARRY_HEADER_BYTES
        + items.iter().map(|(_, _, i)| carried_item_encoded_bytes(i.table, i.payload.len())).sum::<usize>();
    let mut out = Vec::with_capacity(len);
    out.push(TAG_CARRY);
    put_len(&mut out, items.len());
    for (seq, appended_unix_ms, item) in items {
        out.extend_from_slice(&seq.to_le_bytes());
        out.extend_from_slice(&appended_unix_ms.to_le_bytes());
        put_item(&mut out, item);
    }
    out
}

/// Decodes a record payload; the error says what is wrong and at which byte.
pub(super) fn decode(bytes: &[u8]) -> Result<Record, String> {
    let mut r = Reader { bytes, pos: 0 };
    let record = match r.u8("tag")? {
        TAG_APPEND => {
            let seq = r.u64("seq")?;
            let appended_unix_ms = r.u64("appended_unix_ms")?;
            let count = r.count("item count", ITEM_FIXED_BYTES)?;
            if count == 0 {
                return Err("append record with no item".to_string());
            }
            let items = (0..count).map(|_| r.item()).collect::<Result<Vec<_>, _>>()?;
            let mut dests = BTreeSet::new();
            if let Some(item) = items.iter().find(|i| !dests.insert(i.dest)) {
                return Err(format!("append record names destination {} twice", item.dest));
            }
            Record::Append { seq, appended_unix_ms, items }
        }
        TAG_ACK => {
            let count = r.count("ack count", 12)?;
            let acks = (0..count).map(|_| Ok((r.u32("dest")?, r.u64("up_to_seq")?))).collect::<Result<_, String>>()?;
            Record::Ack { acks }
        }
        TAG_ACKED_ITEMS => {
            let count = r.count("acked item count", 12)?;
            let items = (0..count).map(|_| Ok((r.u32("dest")?, r.u64("seq")?))).collect::<Result<_, String>>()?;
            Record::AckedItems { items }
        }
        TAG_DISCARD => Record::Discard { table: r.str("table")? },
        TAG_CARRY => {
            let count = r.count("item count", CARRY_ITEM_EXTRA_BYTES + ITEM_FIXED_BYTES)?;
            let items = (0..count)
                .map(|_| {
                    Ok(CarriedItem {
                        seq: r.u64("seq")?,
                        appended_unix_ms: r.u64("appended_unix_ms")?,
                        item: r.item()?,
                    })
                })
                .collect::<Result<_, String>>()?;
            Record::Carry { items }
        }
        tag => {
            return Err(format!(
                "unknown record tag {tag:#04x} (expected 0x01 append, 0x02 ack, 0x03 discard, 0x04 carry, 0x05 \
                 acked items)"
            ));
        }
    };
    if r.pos != bytes.len() {
        return Err(format!("{} trailing bytes after the record at byte {}", bytes.len() - r.pos, r.pos));
    }
    Ok(record)
}

pub(super) fn item_ref(item: &OutboxItem) -> ItemRef<'_> {
    ItemRef { dest: item.dest, rows: item.rows, table: &item.table, payload: &item.payload }
}

/// Rejects an append that is empty, repeats a destination, or would not fit a WAL record (as an
/// append, or any of its items later as a carry record).
pub(super) fn check_items(items: &[OutboxItem]) -> Result<(), StorageError> {
    if items.is_empty() {
        let problem = "no items: an append needs at least one destination's item".to_string();
        return Err(StorageError::OutboxAppendInvalid { problem });
    }
    let mut dests = BTreeSet::new();
    if let Some(item) = items.iter().find(|i| !dests.insert(i.dest)) {
        let problem = format!(
            "destination {} appears twice; receivers dedup by (origin_id, seq) and the items of one append share \
             a seq, so merge one destination's payloads into one item",
            item.dest
        );
        return Err(StorageError::OutboxAppendInvalid { problem });
    }
    let item_bytes = |i: &OutboxItem| item_encoded_bytes(&i.table, i.payload.len());
    let carried = items.iter().map(|i| CARRY_HEADER_BYTES + carried_item_encoded_bytes(&i.table, i.payload.len()));
    let append_bytes = items.iter().map(item_bytes).fold(APPEND_HEADER_BYTES, usize::saturating_add);
    let len_bytes = carried.fold(append_bytes, usize::max);
    if len_bytes > WAL_RECORD_MAX_BYTES {
        return Err(StorageError::RecordTooLarge { len_bytes, max_bytes: WAL_RECORD_MAX_BYTES });
    }
    Ok(())
}

fn put_len(out: &mut Vec<u8>, len: usize) {
    // Every length is bounded by WAL_RECORD_MAX_BYTES (64 MiB), checked before encoding.
    out.extend_from_slice(&u32::try_from(len).unwrap_or(u32::MAX).to_le_bytes());
}

fn put_str(out: &mut Vec<u8>, s: &str) {
    put_len(out, s.len());
    out.extend_from_slice(s.as_bytes());
}

fn put_item(out: &mut Vec<u8>, item: &ItemRef<'_>) {
    out.extend_from_slice(&item.dest.to_le_bytes());
    out.extend_from_slice(&item.rows.to_le_bytes());
    put_str(out, item.table);
    put_len(out, item.payload.len());
    out.extend_from_slice(item.payload);
}

struct Reader<'a> {
    bytes: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, len: usize, what: &str) -> Result<&'a [u8], String> {
        let rest = &self.bytes[self.pos..];
        if rest.len() < len {
            return Err(format!(
                "record ends inside {what} at byte {}: {len} bytes needed, {} left",
                self.pos,
                rest.len()
            ));
        }
        self.pos += len;
        Ok(&rest[..len])
    }

    fn array<const N: usize>(&mut self, what: &str) -> Result<[u8; N], String> {
        let mut out = [0; N];
        out.copy_from_slice(self.take(N, what)?);
        Ok(out)
    }

    fn u8(&mut self, what: &str) -> Result<u8, String> {
        Ok(self.array::<1>(what)?[0])
    }

    fn u32(&mut self, what: &str) -> Result<u32, String> {
        Ok(u32::from_le_bytes(self.array(what)?))
    }

    fn u64(&mut self, what: &str) -> Result<u64, String> {
        Ok(u64::from_le_bytes(self.array(what)?))
    }

    /// A count of elements of at least `min_bytes` each, checked against the bytes left so a bad
    /// count cannot make the decoder allocate more than the record holds.
    fn count(&mut self, what: &str, min_bytes: usize) -> Result<usize, String> {
        let at = self.pos;
        let count = self.u32(what)? as usize;
        let left = self.bytes.len() - self.pos;
        if count.saturating_mul(min_bytes) > left {
            return Err(format!("{what} {count} at byte {at} does not fit the {left} bytes left"));
        }
        Ok(count)
    }

    fn str(&mut self, what: &str) -> Result<String, String> {
        let len = self.u32(what)? as usize;
        let at = self.pos;
        let bytes = self.take(len, what)?;
        String::from_utf8(bytes.to_vec()).map_err(|e| format!("{what} at byte {at} is not UTF-8: {e}"))
    }

    fn item(&mut self) -> Result<DecodedItem, String> {
        let dest = self.u32("dest")?;
        let rows = self.u64("rows")?;
        let table = self.str("table")?;
        let len = self.u32("payload length")? as usize;
        let payload = self.take(len, "payload")?.to_vec();
        Ok(DecodedItem { dest, rows, table, payload })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn item(dest: u32, table: &'static str, payload: &'static [u8]) -> ItemRef<'static> {
        ItemRef { dest, rows: u64::from(dest) * 10 + 1, table, payload }
    }

    fn decoded(i: ItemRef<'_>) -> DecodedItem {
        DecodedItem { dest: i.dest, rows: i.rows, table: i.table.to_string(), payload: i.payload.to_vec() }
    }

    #[test]
    fn every_record_kind_round_trips_and_sizes_are_exact() -> Result<(), String> {
        let items = [item(1, "t", b"abc"), item(7, "événements", b""), item(u32::MAX, "", &[0, 255])];
        let bytes = encode_append(77, 123, &items);
        let expected_len =
            APPEND_HEADER_BYTES + items.iter().map(|i| item_encoded_bytes(i.table, i.payload.len())).sum::<usize>();
        assert_eq!(bytes.len(), expected_len);
        let want =
            Record::Append { seq: 77, appended_unix_ms: 123, items: items.iter().copied().map(decoded).collect() };
        assert_eq!(decode(&bytes)?, want);

        let acks = vec![(1, 5), (u32::MAX, u64::MAX)];
        assert_eq!(decode(&encode_ack(&acks))?, Record::Ack { acks: acks.clone() });
        assert_eq!(decode(&encode_acked_items(&acks))?, Record::AckedItems { items: acks });
        assert_eq!(decode(&encode_discard("t"))?, Record::Discard { table: "t".to_string() });

        let carried = [(4, 9, items[0]), (5, 0, items[1])];
        let bytes = encode_carry(&carried);
        let expected_len = CARRY_HEADER_BYTES
            + carried.iter().map(|(_, _, i)| carried_item_encoded_bytes(i.table, i.payload.len())).sum::<usize>();
        assert_eq!(bytes.len(), expected_len);
        let want = carried
            .iter()
            .map(|&(seq, appended_unix_ms, i)| CarriedItem { seq, appended_unix_ms, item: decoded(i) })
            .collect();
        assert_eq!(decode(&bytes)?, Record::Carry { items: want });
        Ok(())
    }

    #[test]
    fn every_truncation_and_extension_of_a_record_is_rejected() {
        let records = [
            encode_append(9, 1, &[item(1, "t", b"abc"), item(2, "u", b"de")]),
            encode_ack(&[(1, 2)]),
            encode_discard("table"),
            encode_carry(&[(3, 4, item(1, "t", b"xyz"))]),
        ];
        for bytes in &records {
            for cut in 0..bytes.len() {
                assert!(decode(&bytes[..cut]).is_err(), "cut at {cut} of {bytes:?}");
            }
            let mut longer = bytes.clone();
            longer.push(0);
            let err = decode(&longer).err().unwrap_or_default();
            assert!(err.contains("trailing"), "{err}");
        }
    }

    #[test]
    fn malformed_records_say_what_is_wrong() {
        let cases: [(Vec<u8>, &str); 5] = [
            (vec![0x09], "unknown record tag 0x09"),
            (encode_append(9, 1, &[]), "no item"),
            (encode_append(9, 1, &[item(3, "t", b"a"), item(3, "u", b"b")]), "destination 3 twice"),
            ([&[TAG_ACK][..], &u32::MAX.to_le_bytes()].concat(), "does not fit"),
            ([&[TAG_DISCARD][..], &2u32.to_le_bytes(), &[0xff, 0xfe]].concat(), "not UTF-8"),
        ];
        for (bytes, want) in cases {
            let err = decode(&bytes).err().unwrap_or_default();
            assert!(err.contains(want), "{err:?} should mention {want:?}");
        }
    }
}
