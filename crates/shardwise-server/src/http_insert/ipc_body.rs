//! Arrow IPC bodies from clients (`INSERT ... FORMAT ArrowStream | Arrow`), read without
//! trusting the lengths they claim.
//!
//! arrow's readers allocate what a message's header says it holds before they read it: a 41-byte
//! body whose first message claimed about 2 GiB made the node allocate 2 GiB (a dozen such
//! requests at once, no rows needed, would have the kernel kill the node), and a file whose
//! footer gives a block a negative length panics the reader. The body is already in memory
//! (under the endpoint's size limit), so:
//! - a stream is decoded by arrow's push decoder over the body, which slices the body it is
//!   given and never allocates past what is there: a message longer than the rest of the body
//!   is an unexpected end, not an allocation;
//! - a file's footer is checked first: every block it lists must lie inside the body, so arrow's
//!   file reader then reads no more than the body holds.

use bytes::Bytes;
use datafusion::arrow::array::RecordBatch;
use datafusion::arrow::buffer::Buffer;
use datafusion::arrow::error::ArrowError;
use datafusion::arrow::ipc::reader::{StreamDecoder, read_footer_length};

/// The record batches of an Arrow IPC stream held in `data`, decoded one by one.
pub fn stream_batches(data: &Bytes) -> impl Iterator<Item = Result<RecordBatch, ArrowError>> + use<> {
    let mut buffer = Buffer::from(data.clone());
    let mut decoder = StreamDecoder::new();
    let mut done = false;
    std::iter::from_fn(move || {
        if done {
            return None;
        }
        while !buffer.is_empty() {
            match decoder.decode(&mut buffer) {
                Ok(Some(batch)) => return Some(Ok(batch)),
                Ok(None) => {}
                Err(e) => {
                    done = true;
                    return Some(Err(e));
                }
            }
        }
        done = true;
        // A message cut short (or claiming more than the body holds) fails here.
        decoder.finish().err().map(Err)
    })
}

/// Checks that every block the footer of the Arrow IPC file `data` lists lies inside `data`.
pub fn check_file_blocks(data: &[u8]) -> Result<(), ArrowError> {
    let bad = |why: String| ArrowError::ParseError(why);
    let len = data.len();
    let Some(tail) = len.checked_sub(10).and_then(|at| <[u8; 10]>::try_from(&data[at..]).ok()) else {
        return Err(bad(format!("{len} bytes are too few for an Arrow file")));
    };
    let footer_len = read_footer_length(tail)?;
    let footer_start = (len - 10)
        .checked_sub(footer_len)
        .ok_or_else(|| bad(format!("its footer is said to be {footer_len} bytes, more than the file holds")))?;
    let footer = datafusion::arrow::ipc::root_as_footer(&data[footer_start..len - 10])
        .map_err(|e| bad(format!("its footer does not decode: {e}")))?;
    let blocks = footer.dictionaries().into_iter().flatten().chain(footer.recordBatches().into_iter().flatten());
    for block in blocks {
        let (offset, meta, body) = (block.offset(), block.metaDataLength(), block.bodyLength());
        let end = u64::try_from(offset)
            .ok()
            .zip(u64::try_from(meta).ok())
            .zip(u64::try_from(body).ok())
            .and_then(|((o, m), b)| o.checked_add(m)?.checked_add(b));
        if end.is_none_or(|end| end > footer_start as u64) {
            return Err(bad(format!(
                "its footer lists a block at offset {offset} of {meta} + {body} bytes, outside the {footer_start} \
                 bytes before the footer"
            )));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use datafusion::arrow::array::Int64Array;
    use datafusion::arrow::datatypes::{DataType, Field, Schema};
    use datafusion::arrow::ipc::writer::{FileWriter, StreamWriter};

    use super::*;

    fn batch() -> RecordBatch {
        let schema = Arc::new(Schema::new(vec![Field::new("a", DataType::Int64, false)]));
        RecordBatch::try_new(schema, vec![Arc::new(Int64Array::from(vec![1, 2, 3]))]).unwrap()
    }

    #[test]
    fn a_stream_decodes_and_a_claimed_length_past_the_body_is_an_error() {
        let mut out = Vec::new();
        let mut w = StreamWriter::try_new(&mut out, &batch().schema()).unwrap();
        w.write(&batch()).unwrap();
        w.write(&batch()).unwrap();
        w.finish().unwrap();
        drop(w);
        let got: Vec<RecordBatch> = stream_batches(&Bytes::from(out.clone())).collect::<Result<_, _>>().unwrap();
        assert_eq!(got, vec![batch(), batch()]);
        // The attack: a continuation marker, then a 2 GiB metadata length, and nothing else.
        let claims = Bytes::from_static(b"\xff\xff\xff\xff\xf0\xff\xff\x7f");
        let err = stream_batches(&claims).collect::<Result<Vec<_>, _>>().unwrap_err();
        assert!(err.to_string().contains("Unexpected End of Stream"), "{err}");
        // Cut anywhere: an error, never a panic.
        for cut in 1..out.len() {
            let _ = stream_batches(&Bytes::copy_from_slice(&out[..cut])).collect::<Result<Vec<_>, _>>();
        }
    }

    #[test]
    fn a_file_whose_footer_points_outside_it_is_refused() {
        let mut out = Vec::new();
        let mut w = FileWriter::try_new(&mut out, &batch().schema()).unwrap();
        w.write(&batch()).unwrap();
        w.finish().unwrap();
        drop(w);
        check_file_blocks(&out).unwrap();
        assert!(check_file_blocks(b"ARROW1").unwrap_err().to_string().contains("too few"));
        // Every byte of the footer and its length changed in turn: refused or still in bounds,
        // never a panic.
        let footer_len = read_footer_length(out[out.len() - 10..].try_into().unwrap()).unwrap();
        for at in out.len() - 10 - footer_len..out.len() - 6 {
            for value in [0x00, 0x7f, 0x80, 0xff] {
                let mut bad = out.clone();
                bad[at] = value;
                let _ = check_file_blocks(&bad);
            }
        }
        let mut huge = out.clone();
        let at = out.len() - 10;
        huge[at..at + 4].copy_from_slice(&i32::MAX.to_le_bytes());
        assert!(check_file_blocks(&huge).unwrap_err().to_string().contains("more than the file holds"));
    }
}
