//! HTTP/2 frame and flow-control sizes for every gRPC connection shardwise opens or accepts
//! (Flight SQL clients, `shardwise load`, the data plane between nodes).
//!
//! h2's defaults suit small RPCs: 16 KiB frames and 64 KiB-2 MiB windows. An answer of 10M rows
//! (db-benchmark's q10, about 600 MB of Arrow) then crosses as some 40 000 DATA frames, each its
//! own write on the sender, and the receiver's window updates hold the sender back every few
//! hundred KiB. Larger frames and windows let a stream move in megabyte writes. The receiver
//! decides both (it advertises its frame size and windows), so clients and servers each set them.

use tonic::transport::{Endpoint, Server};

/// Largest HTTP/2 frame this side accepts (HTTP/2 allows up to 2^24 - 1).
pub const MAX_FRAME_BYTES: u32 = 1 << 20;
/// Bytes one stream may have in flight towards this side before the sender waits.
pub const STREAM_WINDOW_BYTES: u32 = 16 << 20;
/// Bytes all streams of a connection may have in flight towards a server (what clients send).
pub const CONNECTION_WINDOW_BYTES: u32 = 32 << 20;
/// Bytes all streams of a connection may have in flight towards a client (the answers it reads):
/// the most HTTP/2 allows. A connection's window does not bound its memory (each stream's unread
/// bytes stay under its stream window); it is shared by the connection's streams, and the bytes
/// of a stream its reader has stopped reading hold their share of it. At 32 MiB two unread
/// answers held the whole window of a node's connection to a peer, which every query of the node
/// reads that peer's rows over, and its cross-node queries waited for minutes; see
/// [`RESULTS_STREAM_WINDOW_BYTES`] for how that connection keeps it from happening at all.
pub const CLIENT_CONNECTION_WINDOW_BYTES: u32 = (1 << 31) - 1;

/// The stream window of the connections a node reads other nodes' query rows on: the
/// connection's window shared out among the most streams a node lets one connection open
/// ([`SERVER_MAX_CONCURRENT_STREAMS`]), so that streams nobody reads (cursors left open, clients
/// that stopped reading) can never hold the whole window and stall the other queries on the
/// connection. With 16 MiB windows 128 such streams did (a tester's 150 open PostgreSQL
/// cursors hung every cross-node query of the node). What 2 MiB instead of 16 costs a large
/// cross-node read has not been measured.
pub const RESULTS_STREAM_WINDOW_BYTES: u32 = CLIENT_CONNECTION_WINDOW_BYTES / SERVER_MAX_CONCURRENT_STREAMS;
const _: () = assert!(
    RESULTS_STREAM_WINDOW_BYTES as u64 * SERVER_MAX_CONCURRENT_STREAMS as u64 <= CLIENT_CONNECTION_WINDOW_BYTES as u64
);

/// `endpoint` with shardwise's frame and window sizes.
pub fn client(endpoint: Endpoint) -> Endpoint {
    endpoint
        .max_frame_size(MAX_FRAME_BYTES)
        .initial_stream_window_size(STREAM_WINDOW_BYTES)
        .initial_connection_window_size(CLIENT_CONNECTION_WINDOW_BYTES)
}

/// How often a server pings each of its connections (HTTP/2 PING): a client that does not
/// answer within [`SERVER_PING_TIMEOUT_MS`] is gone, or never was one, and its connection is
/// closed (see `crate::connections`). Live clients answer without their application noticing.
pub const SERVER_PING_INTERVAL_MS: u64 = 10_000;
/// How long a server waits for the answer to its ping.
pub const SERVER_PING_TIMEOUT_MS: u64 = 10_000;
/// Streams (calls) a client may have open at once on one connection: past it, the client waits
/// to open more (HTTP/2's SETTINGS_MAX_CONCURRENT_STREAMS). Unlimited before: 200 000 streams
/// opened and never finished on one connection took 1.6 GB of the node's memory.
pub const SERVER_MAX_CONCURRENT_STREAMS: u32 = 1024;

/// `server` with shardwise's frame and window sizes, its pings and its stream limit.
pub fn server<L>(server: Server<L>) -> Server<L> {
    server
        .max_frame_size(MAX_FRAME_BYTES)
        .initial_stream_window_size(STREAM_WINDOW_BYTES)
        .initial_connection_window_size(CONNECTION_WINDOW_BYTES)
        .http2_keepalive_interval(Some(std::time::Duration::from_millis(SERVER_PING_INTERVAL_MS)))
        .http2_keepalive_timeout(Some(std::time::Duration::from_millis(SERVER_PING_TIMEOUT_MS)))
        .max_concurrent_streams(Some(SERVER_MAX_CONCURRENT_STREAMS))
}
