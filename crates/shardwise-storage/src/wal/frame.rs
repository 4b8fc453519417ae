//! The WAL record frame: how one record is laid out on disk, and how a reader tells an intact
//! record from a torn or corrupted one.
//!
//! Layout, all little-endian:
//! ```text
//! len: u32 | crc: u32 | lsn: u64 | payload
//! ```
//! `len` counts `lsn + payload`; `crc` is CRC-32C over the four `len` bytes followed by
//! `lsn + payload`. Checksumming the length catches a flipped length bit, and keeping the LSN in
//! the checksummed body means a record can never be replayed under the wrong LSN.

use super::Lsn;

/// The largest payload one WAL record may carry.
pub const WAL_RECORD_MAX_BYTES: usize = 64 * 1024 * 1024;

const FRAME_HEADER_BYTES: usize = 8;
const LSN_BYTES: usize = 8;
/// The smallest possible frame: a header and an LSN with an empty payload.
pub(crate) const FRAME_MIN_BYTES: usize = FRAME_HEADER_BYTES + LSN_BYTES;
const BODY_MAX_BYTES: usize = LSN_BYTES + WAL_RECORD_MAX_BYTES;

/// Why the bytes at some offset are not a valid record.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RecordDefect {
    /// The file ends inside the frame (typical of a torn write).
    #[error("frame cut short: {available_bytes} bytes left, {needed_bytes} needed")]
    Truncated { available_bytes: usize, needed_bytes: usize },
    /// The length field is outside `[8, 8 + WAL_RECORD_MAX_BYTES]` (e.g. a zero-filled tail).
    #[error("length field {len_bytes} out of range")]
    LengthOutOfRange { len_bytes: u32 },
    /// The checksum does not match the bytes.
    #[error("checksum mismatch: stored {stored:#010x}, computed {computed:#010x}")]
    ChecksumMismatch { stored: u32, computed: u32 },
    /// An intact record with an LSN other than the next one expected in its segment.
    #[error("intact record with LSN {found}, expected {expected}")]
    UnexpectedLsn { expected: Lsn, found: Lsn },
}

/// One decoded record, borrowing its payload from the segment bytes.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Frame<'a> {
    pub lsn: Lsn,
    pub payload: &'a [u8],
    /// The whole frame's size on disk.
    pub frame_bytes: usize,
}

/// The on-disk size of a record with a `payload_bytes` payload.
pub(crate) fn frame_len_bytes(payload_bytes: usize) -> usize {
    FRAME_MIN_BYTES + payload_bytes
}

/// Appends the frame of one record to `out`. The caller has checked the payload size.
pub(crate) fn encode(out: &mut Vec<u8>, lsn: Lsn, payload: &[u8]) {
    out.extend_from_slice(&header(lsn, payload));
    out.extend_from_slice(payload);
}

/// The bytes of a record's frame that come before its payload. The caller has checked the
/// payload size.
pub(crate) fn header(lsn: Lsn, payload: &[u8]) -> [u8; FRAME_MIN_BYTES] {
    assert!(payload.len() <= WAL_RECORD_MAX_BYTES, "caller must check WAL_RECORD_MAX_BYTES");
    // Fits: BODY_MAX_BYTES is far below u32::MAX.
    let len = (LSN_BYTES + payload.len()) as u32;
    let len_bytes = len.to_le_bytes();
    let lsn_bytes = lsn.0.to_le_bytes();
    let crc = crc32c::crc32c_append(crc32c::crc32c(&len_bytes), &lsn_bytes);
    let crc = crc32c::crc32c_append(crc, payload);
    let mut out = [0; FRAME_MIN_BYTES];
    out[..4].copy_from_slice(&len_bytes);
    out[4..8].copy_from_slice(&crc.to_le_bytes());
    out[8..].copy_from_slice(&lsn_bytes);
    out
}

fn u32_at(bytes: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_le_bytes(bytes.get(at..at + 4)?.try_into().ok()?))
}

fn u64_at(bytes: &[u8], at: usize) -> Option<u64> {
    Some(u64::from_le_bytes(bytes.get(at..at + 8)?.try_into().ok()?))
}

/// Decodes the frame at the start of `bytes`.
pub(crate) fn decode(bytes: &[u8]) -> Result<Frame<'_>, RecordDefect> {
    let truncated = |needed_bytes| RecordDefect::Truncated { available_bytes: bytes.len(), needed_bytes };
    let (Some(len), Some(stored)) = (u32_at(bytes, 0), u32_at(bytes, 4)) else {
        return Err(truncated(FRAME_HEADER_BYTES));
    };
    let body_bytes = len as usize;
    if !(LSN_BYTES..=BODY_MAX_BYTES).contains(&body_bytes) {
        return Err(RecordDefect::LengthOutOfRange { len_bytes: len });
    }
    let frame_bytes = FRAME_HEADER_BYTES + body_bytes;
    let Some(body) = bytes.get(FRAME_HEADER_BYTES..frame_bytes) else {
        return Err(truncated(frame_bytes));
    };
    let computed = crc32c::crc32c_append(crc32c::crc32c(&len.to_le_bytes()), body);
    if computed != stored {
        return Err(RecordDefect::ChecksumMismatch { stored, computed });
    }
    let lsn = u64_at(body, 0).map(Lsn).ok_or_else(|| truncated(frame_bytes))?;
    Ok(Frame { lsn, payload: &body[LSN_BYTES..], frame_bytes })
}

/// The first intact frame at or after `from` whose LSN is at least `lsn_min`, with its offset.
///
/// Used after a defect to tell a torn tail (nothing intact follows) from mid-log corruption.
/// Candidates must carry an LSN in `lsn_min ..= lsn_min + (bytes left / FRAME_MIN_BYTES)`, the
/// only LSNs a later record of this segment can have, so random bytes almost never pass even
/// before the checksum is computed.
pub(crate) fn find_intact_frame(bytes: &[u8], from: usize, lsn_min: Lsn) -> Option<(usize, Frame<'_>)> {
    let last_start = bytes.len().checked_sub(FRAME_MIN_BYTES)?;
    (from..=last_start).find_map(|pos| {
        let rest = &bytes[pos..];
        let lsn = u64_at(rest, FRAME_HEADER_BYTES)?;
        let lsn_max = lsn_min.0.saturating_add((rest.len() / FRAME_MIN_BYTES) as u64);
        if lsn < lsn_min.0 || lsn > lsn_max {
            return None;
        }
        decode(rest).ok().map(|frame| (pos, frame))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn encoded(lsn: u64, payload: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        encode(&mut out, Lsn(lsn), payload);
        out
    }

    #[test]
    fn round_trip_and_size() {
        let bytes = encoded(42, b"payload");
        assert_eq!(bytes.len(), frame_len_bytes(7));
        let frame = decode(&bytes).expect("intact frame");
        assert_eq!((frame.lsn, frame.payload, frame.frame_bytes), (Lsn(42), &b"payload"[..], bytes.len()));
        let empty = encoded(1, b"");
        assert_eq!(decode(&empty).map(|f| f.payload.len()), Ok(0));
    }

    #[test]
    fn every_cut_is_truncated_and_every_bit_flip_is_caught() {
        let bytes = encoded(7, b"some payload bytes");
        for cut in 0..bytes.len() {
            assert!(matches!(decode(&bytes[..cut]), Err(RecordDefect::Truncated { .. })), "cut {cut}");
        }
        for bit in 0..bytes.len() * 8 {
            let mut flipped = bytes.clone();
            flipped[bit / 8] ^= 1 << (bit % 8);
            assert!(decode(&flipped).is_err(), "bit {bit} not caught");
        }
    }

    #[test]
    fn zeros_are_not_a_record() {
        assert_eq!(decode(&[0u8; 32]), Err(RecordDefect::LengthOutOfRange { len_bytes: 0 }));
    }

    #[test]
    fn find_intact_frame_skips_garbage_and_respects_lsn_range() {
        let mut bytes = vec![0xAB; 13];
        bytes.extend(encoded(5, b"x"));
        let (pos, frame) = find_intact_frame(&bytes, 1, Lsn(4)).expect("frame after garbage");
        assert_eq!((pos, frame.lsn), (13, Lsn(5)));
        assert!(find_intact_frame(&bytes, 0, Lsn(6)).is_none(), "LSN below the minimum");
        assert!(find_intact_frame(&bytes, 14, Lsn(0)).is_none());
        assert!(find_intact_frame(&[1, 2, 3], 0, Lsn(0)).is_none());
    }
}
