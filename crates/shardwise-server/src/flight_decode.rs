//! Arrow Flight streams decoded without letting a decoder panic reach the handler.
//!
//! arrow's IPC decoder trusts parts of what it is sent: an Arrow schema whose integer column
//! claims a width of 0x7ffffff0 bits panics it (`arrow-ipc` `convert.rs`). Over HTTP that body is
//! refused with a 400 (`http_insert::typed_rows`); every Flight stream a node decodes, from
//! clients (`DoPut` bulk ingest, a prepared statement's parameters) and from peers (fragment
//! rows), goes through [`decoded`], where such a panic becomes the stream's last item, an error,
//! instead of ending the call's task with a reset stream and a panic message in the log.
//!
//! A panic caught that way is expected: the client sent what does not decode, and it is told so.
//! [`install_panic_hook`] (called by the binary) keeps such panics, raised inside [`quietly`], out
//! of the process's panic output (a message and, under `RUST_BACKTRACE`, a backtrace on stderr
//! for every malformed upload, which a client could repeat at will); they are logged at debug
//! level. Every other panic is printed as before.

use std::any::Any;
use std::cell::Cell;
use std::pin::Pin;
use std::task::{Context, Poll};

use arrow_flight::FlightData;
use arrow_flight::decode::{DecodedFlightData, FlightDataDecoder};
use arrow_flight::error::FlightError;
use futures::stream::{BoxStream, Stream, StreamExt};

/// A decoded Flight stream: messages, or an error (after which it ends).
pub type Decoded = BoxStream<'static, Result<DecodedFlightData, FlightError>>;

/// `stream` decoded; a panic of the decoder is an error that ends it.
pub fn decoded<S>(stream: S) -> Decoded
where
    S: Stream<Item = Result<FlightData, FlightError>> + Send + 'static,
{
    std::panic::AssertUnwindSafe(Quiet(FlightDataDecoder::new(stream)))
        .catch_unwind()
        .map(|message| {
            message.unwrap_or_else(|panic| {
                Err(FlightError::DecodeError(format!("the Arrow data does not decode ({})", panic_text(&*panic))))
            })
        })
        .boxed()
}

thread_local! {
    /// How many [`quietly`] calls the thread is inside.
    static QUIET: Cell<u32> = const { Cell::new(0) };
}

/// Runs `f`, which may panic on purpose-built input and whose panic the caller catches: see the
/// module doc.
pub fn quietly<T>(f: impl FnOnce() -> T) -> T {
    struct Leave;
    impl Drop for Leave {
        fn drop(&mut self) {
            QUIET.with(|q| q.set(q.get().saturating_sub(1)));
        }
    }
    QUIET.with(|q| q.set(q.get() + 1));
    let _leave = Leave;
    f()
}

/// Installs a panic hook that logs panics raised inside [`quietly`] at debug level and passes
/// every other one to the hook there was before.
pub fn install_panic_hook() {
    let before = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| match QUIET.with(Cell::get) {
        0 => before(info),
        _ => tracing::debug!("a decoder panicked on malformed input (answered as an error): {info}"),
    }));
}

/// A stream polled inside [`quietly`].
struct Quiet<S>(S);

impl<S: Stream + Unpin> Stream for Quiet<S> {
    type Item = S::Item;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<S::Item>> {
        quietly(|| self.0.poll_next_unpin(cx))
    }
}

/// What a caught panic said, if it said it in text.
pub fn panic_text(panic: &(dyn Any + Send)) -> &str {
    panic
        .downcast_ref::<String>()
        .map(String::as_str)
        .or_else(|| panic.downcast_ref::<&str>().copied())
        .unwrap_or("the decoder failed")
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use arrow::array::{Int32Array, RecordBatch};
    use arrow::datatypes::{DataType, Field, Schema};
    use arrow_flight::encode::FlightDataEncoderBuilder;
    use futures::TryStreamExt;

    use super::*;

    /// The Flight messages of a one-column Int32 batch.
    async fn messages() -> Vec<FlightData> {
        let schema = Arc::new(Schema::new(vec![Field::new("n", DataType::Int32, true)]));
        let batch = RecordBatch::try_new(schema, vec![Arc::new(Int32Array::from(vec![1, 2]))]).unwrap();
        FlightDataEncoderBuilder::new().build(futures::stream::iter([Ok(batch)])).try_collect().await.unwrap()
    }

    /// A panic inside [`quietly`] leaves the thread as it found it (the next panic is printed).
    #[test]
    fn a_caught_panic_leaves_the_thread_loud_again() {
        let caught = std::panic::catch_unwind(|| quietly(|| quietly(|| panic!("on purpose"))));
        assert!(caught.is_err());
        assert_eq!(QUIET.with(Cell::get), 0);
        assert_eq!(quietly(|| QUIET.with(Cell::get)), 1);
    }

    /// A schema whose Int32 column claims an absurd width (a tester's attack on the HTTP
    /// endpoint, sent as Flight messages): arrow's decoder panics on some variant, [`decoded`]
    /// gives an error for every one.
    #[tokio::test]
    async fn a_stream_that_panics_the_decoder_ends_in_an_error() {
        let good = messages().await;
        let header = &good[0].data_header;
        let widths: Vec<usize> = (0..header.len() - 4).filter(|&i| header[i..i + 4] == 32i32.to_le_bytes()).collect();
        let mut panicked = 0;
        for at in widths {
            let mut patched = header.to_vec();
            patched[at..at + 4].copy_from_slice(&0x7fff_fff0i32.to_le_bytes());
            let mut bad = good.clone();
            bad[0].data_header = patched.into();
            let raw = tokio::spawn(
                FlightDataDecoder::new(futures::stream::iter(bad.clone().into_iter().map(Ok))).collect::<Vec<_>>(),
            );
            let raw_panicked = raw.await.is_err();
            panicked += usize::from(raw_panicked);
            let items: Vec<_> = decoded(futures::stream::iter(bad.into_iter().map(Ok))).collect().await;
            if raw_panicked {
                let last = items.last().map(|item| item.as_ref().map(|_| ()).map_err(ToString::to_string));
                assert!(matches!(&last, Some(Err(e)) if e.contains("the Arrow data does not decode")), "{last:?}");
            }
        }
        assert!(panicked > 0, "no variant panicked the decoder: the test no longer covers the guard");
        let items: Vec<_> = decoded(futures::stream::iter(good.into_iter().map(Ok))).try_collect().await.unwrap();
        assert_eq!(items.len(), 2, "the schema and the batch");
    }
}
