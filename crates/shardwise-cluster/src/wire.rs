//! The control protocol between a node and the master: a preamble, then length-prefixed JSON
//! frames, each carrying a MAC once the handshake has set up a session key.
//!
//! ```text
//! preamble:  "SHRDWS" u16-be protocol version          (both sides, once)
//! frame:     u32-be length | JSON message | [32-byte HMAC-SHA256 tag]
//! tag:       HMAC(session_key, "frame", direction, u64-be sequence number, JSON)
//! ```
//! The preamble makes a peer that speaks something else (HTTP, a port scanner, an old version)
//! fail with a message that says so instead of a confusing decode error. Frames are bounded by
//! [`MAX_FRAME_BYTES`]. Sequence numbers in the tag stop a recorded frame from being replayed or
//! reordered.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};

use crate::error::{ClusterError, Result};
use crate::membership::MemberInfo;
use crate::metadata::{MetadataSnapshot, ProposeOutcome};
use crate::secret::{Tag, tag_with_key, verify_with_key};

/// Version of the control protocol; a node refuses a peer with another version. (3: a node's
/// proposal is confirmed with its proposer before it is applied, `Confirm` / `Confirmed`.)
pub const PROTOCOL_VERSION: u16 = 3;
const MAGIC: &[u8; 6] = b"SHRDWS";
/// What a node's client endpoint (PostgreSQL) answers a cluster preamble with, followed by the
/// endpoint's name in two bytes: the port a node was told to join is a client port of a node,
/// not the master's rendezvous port, and waiting for it to turn into one is useless.
const CLIENT_ENDPOINT_MAGIC: &[u8; 6] = b"SHRDWC";
/// The frame type of HTTP/2's SETTINGS, the first frame a server sends (RFC 9113 §6.5).
const HTTP2_SETTINGS_FRAME: u8 = 0x04;

/// Whether `first_bytes`, what a client sent first to a node's client endpoint, are a cluster
/// preamble (a node that was given that endpoint's port as the master's).
pub fn is_cluster_preamble(first_bytes: &[u8]) -> bool {
    first_bytes.starts_with(MAGIC)
}

/// The answer a client endpoint (`b"pg"`: PostgreSQL) gives a cluster preamble, before it closes
/// the connection.
pub fn client_endpoint_answer(endpoint: &[u8; 2]) -> [u8; 8] {
    let mut answer = [0u8; 8];
    answer[..6].copy_from_slice(CLIENT_ENDPOINT_MAGIC);
    answer[6..].copy_from_slice(endpoint);
    answer
}
/// Largest control frame accepted, in bytes (a membership list of thousands of nodes fits).
pub const MAX_FRAME_BYTES: usize = 16 << 20;
/// Largest frame accepted before the peer has proved it knows the secret (a hello is small), so
/// an unauthenticated peer cannot make the master allocate much.
pub const PREAUTH_MAX_FRAME_BYTES: usize = 64 << 10;
const TAG_BYTES: usize = 32;
/// Largest message that fits in a frame together with its MAC.
pub const MAX_PAYLOAD_BYTES: usize = MAX_FRAME_BYTES - TAG_BYTES;

/// Messages the master sends to a node.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum MasterMsg {
    /// First message: the master's nonce and what it expects.
    Challenge {
        nonce: String,
        run_id: String,
        world_size: u32,
        secured: bool,
        /// The master's node id: a worker that recorded it as replaced (`masters.json`) leaves
        /// before its hello, so that a stale master's data dir, started again, admits nobody
        /// (each admission raised the rank's epoch there, and its next start fenced the workers
        /// out with them).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        node_id: Option<String>,
    },
    /// The node is in. `proof` proves the master knows the secret.
    Welcome {
        run_id: String,
        epoch: u64,
        proof: Option<String>,
        heartbeat_interval_ms: u64,
        /// The master's `down_after_ms`: how long the node waits for the master's answers
        /// before it reconnects (absent from masters before it was sent: the node's own).
        #[serde(default)]
        down_after_ms: Option<u64>,
        formed: bool,
        view: Vec<MemberInfo>,
    },
    /// The node may not join; it should exit with this reason.
    Refused {
        reason: String,
    },
    /// Progress while the cluster forms.
    Waiting {
        joined: u32,
        world_size: u32,
        missing: Vec<u32>,
    },
    /// Every rank has joined: the membership is final; enter the barrier.
    Formed {
        view: Vec<MemberInfo>,
    },
    /// Every rank entered the barrier.
    Release,
    HeartbeatAck {
        seq: u64,
    },
    Members {
        req: u64,
        view: Vec<MemberInfo>,
    },
    /// A newer incarnation of this rank has joined; this one must stop. Sent before a welcome
    /// (to a stale process that reconnects), it carries `HMAC(secret, "fenced", nonces, reason)`
    /// when the cluster has a secret: a fence nobody proved is retried, not obeyed.
    Fenced {
        reason: String,
        #[serde(default)]
        proof: Option<String>,
    },
    /// The cluster could not form (for example a join timeout); the node should exit.
    Abort {
        reason: String,
    },
    /// The replicated metadata as of now: the first message after `Welcome`, then one per change.
    Metadata {
        snapshot: MetadataSnapshot,
    },
    /// The answer to this node's `Propose` (when applied, the `Metadata` message with the new
    /// version came just before it).
    Proposed {
        req: u64,
        outcome: ProposeOutcome,
    },
    /// Does this node still wait for the answer to its `Propose { req }`? Asked right before the
    /// master applies it: a proposal its proposer gave up on (timed out while the master was
    /// paused, or while the proposal waited behind others) is not applied after the fact.
    Confirm {
        req: u64,
    },
}

/// Messages a node sends to the master.
// A hello is sent once per connection: its size beside the other messages does not matter.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum NodeMsg {
    Hello {
        protocol: u16,
        rank: u32,
        world_size: u32,
        node_id: String,
        run_id: Option<String>,
        addrs: BTreeMap<String, String>,
        nonce: String,
        proof: Option<String>,
        /// The epoch this process held when it lost the master, on a rejoin; `None` on its
        /// first join. The master refuses a rejoin whose epoch is older than the rank's: a newer
        /// incarnation has taken the rank, and this one is fenced out.
        #[serde(default)]
        epoch: Option<u64>,
        /// A token this process drew when it started: a rejoin with an older epoch but the same
        /// token is the same process retrying (its last attempt was cut off after the master
        /// admitted it), not a stale one.
        #[serde(default)]
        incarnation: Option<String>,
        /// The node id of the lost data dir whose rank this fresh one takes (`--replace-node`).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        replaces: Option<String>,
        /// The node id of the master this node last served under (`masters.json`), when it
        /// knows: a master replacing a lost one checks that it is that node it replaces.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        master: Option<String>,
        /// The node that held each rank when this node last saw the membership
        /// (`masters.json`), when it knows: a master replacing a lost one checks against it the
        /// node a `--replace-node` names. Pairs, not a map: this enum is internally tagged, and
        /// serde cannot read a map with number keys inside one.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        ranks: Option<Vec<(u32, String)>>,
    },
    BarrierEnter,
    Heartbeat {
        seq: u64,
    },
    MembersQuery {
        req: u64,
    },
    /// A change to the replicated metadata, for the master's metadata machine.
    Propose {
        req: u64,
        op: serde_json::Value,
    },
    /// The node now runs with this metadata version (sent after each `Metadata` message): the
    /// master answers a change only once every connected node has it, so that a statement sent
    /// to any node after a DDL statement returned sees the DDL's effect.
    MetadataApplied {
        version: u64,
    },
    /// This node holds a newer metadata version than the one the master just sent it: the
    /// master's `metadata.json` was restored from an older backup. The master takes this one
    /// (it refuses changes until it has), so that the cluster keeps one catalog.
    NewerMetadata {
        snapshot: MetadataSnapshot,
    },
    /// The answer to `Confirm { req }`: `waiting` if the proposer still waits for it (it then
    /// waits a while longer for the outcome); if not, the master drops the proposal.
    Confirmed {
        req: u64,
        waiting: bool,
    },
    /// Graceful shutdown.
    Leave,
}

/// Which way a frame travels (part of its MAC, so a frame cannot be reflected back).
#[derive(Debug, Clone, Copy)]
pub enum Direction {
    ToNode,
    ToMaster,
}

impl Direction {
    fn byte(self) -> u8 {
        match self {
            Direction::ToNode => 1,
            Direction::ToMaster => 2,
        }
    }
}

/// Encodes a message as a frame payload.
pub fn encode<T: Serialize>(msg: &T) -> std::result::Result<Vec<u8>, String> {
    serde_json::to_vec(msg).map_err(|e| format!("cannot encode message: {e}"))
}

/// Writes the preamble and checks the peer's.
pub async fn exchange_preamble(
    read: &mut OwnedReadHalf,
    write: &mut OwnedWriteHalf,
    peer: &str,
    timeout: Duration,
) -> Result<()> {
    let mut ours = [0u8; 8];
    ours[..6].copy_from_slice(MAGIC);
    ours[6..].copy_from_slice(&PROTOCOL_VERSION.to_be_bytes());
    let io = |e: std::io::Error| ClusterError::Connection { peer: peer.to_string(), detail: e.to_string() };
    write.write_all(&ours).await.map_err(io)?;
    let mut theirs = [0u8; 8];
    match tokio::time::timeout(timeout, read.read_exact(&mut theirs)).await {
        // A stalled master (stopped, swapping, starved of CPU) and a server that never speaks
        // first look alike here: a timeout, which a rejoin retries, not a protocol mismatch.
        Err(_) => {
            return Err(ClusterError::Timeout {
                op: format!("waiting for the preamble of {peer} (a stalled master, or no shardwise master there)"),
                timeout_ms: timeout.as_millis() as u64,
            });
        }
        Ok(Err(e)) => return Err(io(e)),
        Ok(Ok(_)) => {}
    }
    if &theirs[..6] == CLIENT_ENDPOINT_MAGIC {
        let endpoint = match &theirs[6..] {
            b"pg" => "PostgreSQL",
            _ => "client",
        };
        return Err(ClusterError::WrongProtocol {
            peer: peer.to_string(),
            detail: format!(
                "it is a shardwise node's {endpoint} endpoint, not the master's rendezvous port; give \
                 MASTER_PORT (or --master-port) the port the master listens on for nodes (torchrun's \
                 MASTER_PORT, {} by default)",
                crate::source::DEFAULT_MASTER_PORT
            ),
        });
    }
    if &theirs[..6] != MAGIC {
        // What else answers there, when it can be told: a port of the wrong kind is the usual
        // mistake (MASTER_PORT given a node's Flight SQL, data-plane or HTTP port).
        let what = if theirs[3] == HTTP2_SETTINGS_FRAME && theirs[4] == 0 && theirs[5..8] == [0, 0, 0] {
            "; that is an HTTP/2 (gRPC) server's first frame: a shardwise node's Flight SQL or data-plane port, or \
             another gRPC service"
        } else if theirs.starts_with(b"HTTP/") {
            "; that is an HTTP server's answer: a shardwise node's HTTP port, or another web server"
        } else {
            ""
        };
        let hint = match what.is_empty() {
            true => String::new(),
            false => format!(
                "{what}, not the master's rendezvous port; give MASTER_PORT (or --master-port) the port the master \
                 listens on for nodes ({} by default)",
                crate::source::DEFAULT_MASTER_PORT
            ),
        };
        return Err(ClusterError::WrongProtocol {
            peer: peer.to_string(),
            detail: format!("it sent {:?} instead of the preamble{hint}", String::from_utf8_lossy(&theirs)),
        });
    }
    let version = u16::from_be_bytes([theirs[6], theirs[7]]);
    if version != PROTOCOL_VERSION {
        return Err(ClusterError::ProtocolVersion { peer: peer.to_string(), ours: PROTOCOL_VERSION, theirs: version });
    }
    Ok(())
}

/// Session state for one direction of a connection: the key (once set) and the next sequence.
#[derive(Debug)]
struct Mac {
    key: Option<Tag>,
    seq: u64,
    dir: Direction,
}

impl Mac {
    fn tag(&self, payload: &[u8]) -> Option<Tag> {
        self.key.map(|k| tag_with_key(&k, "frame", &[&[self.dir.byte()], &self.seq.to_be_bytes(), payload]))
    }
}

/// The reading half of a control connection.
#[derive(Debug)]
pub struct FrameReader {
    inner: OwnedReadHalf,
    peer: String,
    mac: Mac,
    /// The handshake is done (with or without a secret): full-size frames are allowed.
    trusted: bool,
}

/// The writing half of a control connection.
#[derive(Debug)]
pub struct FrameWriter {
    inner: OwnedWriteHalf,
    peer: String,
    mac: Mac,
}

impl FrameReader {
    pub fn new(inner: OwnedReadHalf, peer: String, dir: Direction) -> Self {
        FrameReader { inner, peer, mac: Mac { key: None, seq: 0, dir }, trusted: false }
    }

    /// From now on every frame must carry a valid MAC under `key`.
    pub fn set_key(&mut self, key: Tag) {
        self.mac.key = Some(key);
        self.trusted = true;
    }

    /// The handshake is complete without a secret (an `--insecure` cluster).
    pub fn set_trusted(&mut self) {
        self.trusted = true;
    }

    pub fn peer(&self) -> &str {
        &self.peer
    }

    /// Reads one message. End of stream is a `Connection` error.
    pub async fn read<T: for<'de> Deserialize<'de>>(&mut self) -> Result<T> {
        let io =
            |e: std::io::Error, peer: &str| ClusterError::Connection { peer: peer.to_string(), detail: e.to_string() };
        let len = self.inner.read_u32().await.map_err(|e| io(e, &self.peer))? as usize;
        let limit = if self.mac.key.is_some() || self.trusted { MAX_FRAME_BYTES } else { PREAUTH_MAX_FRAME_BYTES };
        if len > limit {
            return Err(ClusterError::WrongProtocol {
                peer: self.peer.clone(),
                detail: format!("frame of {len} bytes exceeds the limit of {limit}"),
            });
        }
        let mut buf = vec![0u8; len];
        self.inner.read_exact(&mut buf).await.map_err(|e| io(e, &self.peer))?;
        let payload = if let Some(key) = self.mac.key {
            if len < TAG_BYTES {
                return Err(self.auth_error("frame too short to carry its MAC"));
            }
            let (payload, tag) = buf.split_at(len - TAG_BYTES);
            let seq = self.mac.seq.to_be_bytes();
            if !verify_with_key(&key, "frame", &[&[self.mac.dir.byte()], &seq, payload], tag) {
                return Err(self.auth_error("frame MAC does not verify (wrong secret, tampering or replay)"));
            }
            self.mac.seq += 1;
            payload
        } else {
            &buf[..]
        };
        serde_json::from_slice(payload).map_err(|e| ClusterError::WrongProtocol {
            peer: self.peer.clone(),
            detail: format!("undecodable message: {e}"),
        })
    }

    fn auth_error(&self, detail: &str) -> ClusterError {
        ClusterError::Auth { peer: self.peer.clone(), detail: detail.to_string() }
    }
}

impl FrameWriter {
    pub fn new(inner: OwnedWriteHalf, peer: String, dir: Direction) -> Self {
        FrameWriter { inner, peer, mac: Mac { key: None, seq: 0, dir } }
    }

    pub fn set_key(&mut self, key: Tag) {
        self.mac.key = Some(key);
    }

    /// Writes one message (and its MAC when a session key is set).
    pub async fn write<T: Serialize>(&mut self, msg: &T) -> Result<()> {
        let payload = encode(msg).map_err(|detail| ClusterError::Connection { peer: self.peer.clone(), detail })?;
        self.write_payload(&payload).await
    }

    /// Writes a message already encoded with [`encode`] (a broadcast encodes once for all).
    pub async fn write_payload(&mut self, payload: &[u8]) -> Result<()> {
        let tag = self.mac.tag(payload);
        let len = payload.len() + tag.map_or(0, |_| TAG_BYTES);
        let mut frame = Vec::with_capacity(4 + len);
        frame.extend_from_slice(&(len as u32).to_be_bytes());
        frame.extend_from_slice(payload);
        if let Some(t) = tag {
            frame.extend_from_slice(&t);
            self.mac.seq += 1;
        }
        self.inner
            .write_all(&frame)
            .await
            .map_err(|e| ClusterError::Connection { peer: self.peer.clone(), detail: e.to_string() })
    }

    /// Flushes and closes the write side.
    pub async fn shutdown(&mut self) {
        let _ = self.inner.shutdown().await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::net::{TcpListener, TcpStream};

    async fn pair() -> (TcpStream, TcpStream) {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        let (a, b) = tokio::join!(TcpStream::connect(addr), l.accept());
        (a.unwrap(), b.unwrap().0)
    }

    #[tokio::test]
    async fn frames_round_trip_with_macs_and_tampering_is_caught() {
        let (a, b) = pair().await;
        let (ar, aw) = a.into_split();
        let (br, bw) = b.into_split();
        let mut w = FrameWriter::new(aw, "b".into(), Direction::ToMaster);
        let mut r = FrameReader::new(br, "a".into(), Direction::ToMaster);
        w.set_key([1; 32]);
        r.set_key([1; 32]);
        w.write(&NodeMsg::Heartbeat { seq: 1 }).await.unwrap();
        w.write(&NodeMsg::Heartbeat { seq: 2 }).await.unwrap();
        assert!(matches!(r.read::<NodeMsg>().await.unwrap(), NodeMsg::Heartbeat { seq: 1 }));
        assert!(matches!(r.read::<NodeMsg>().await.unwrap(), NodeMsg::Heartbeat { seq: 2 }));
        // A writer with another key: the reader refuses the frame.
        w.set_key([2; 32]);
        w.write(&NodeMsg::Leave).await.unwrap();
        let err = r.read::<NodeMsg>().await.unwrap_err();
        assert!(matches!(err, ClusterError::Auth { .. }), "{err}");
        drop((ar, bw));
    }

    #[tokio::test]
    async fn a_peer_speaking_http_is_named_as_such() {
        let (a, b) = pair().await;
        let (mut ar, mut aw) = a.into_split();
        let (_br, mut bw) = b.into_split();
        bw.write_all(b"GET / HTTP/1.1\r\n\r\n").await.unwrap();
        let err = exchange_preamble(&mut ar, &mut aw, "10.0.0.1:1", Duration::from_secs(1)).await.unwrap_err();
        assert!(err.to_string().contains("does not speak the shardwise cluster protocol"), "{err}");
        assert!(err.to_string().contains("GET / HT"), "{err}");
    }

    #[tokio::test]
    async fn a_grpc_port_is_named_as_such() {
        let (a, b) = pair().await;
        let (mut ar, mut aw) = a.into_split();
        let (_br, mut bw) = b.into_split();
        // An HTTP/2 server's SETTINGS frame: length 0x18, type 4, no flags, stream 0.
        bw.write_all(b"\0\0\x18\x04\0\0\0\0\0\x02").await.unwrap();
        let err = exchange_preamble(&mut ar, &mut aw, "10.0.0.1:1", Duration::from_secs(1)).await.unwrap_err();
        assert!(err.to_string().contains("HTTP/2 (gRPC)") && err.to_string().contains("MASTER_PORT"), "{err}");
    }

    #[tokio::test]
    async fn a_client_endpoint_is_named_as_such() {
        let (a, b) = pair().await;
        let (mut ar, mut aw) = a.into_split();
        let (mut br, mut bw) = b.into_split();
        let mut first = [0u8; 8];
        let answer = tokio::spawn(async move {
            br.read_exact(&mut first).await.unwrap();
            assert!(is_cluster_preamble(&first));
            bw.write_all(&client_endpoint_answer(b"pg")).await.unwrap();
        });
        let err = exchange_preamble(&mut ar, &mut aw, "10.0.0.1:1", Duration::from_secs(1)).await.unwrap_err();
        assert!(matches!(err, ClusterError::WrongProtocol { .. }), "{err}");
        assert!(err.to_string().contains("PostgreSQL endpoint, not the master's rendezvous port"), "{err}");
        answer.await.unwrap();
        assert!(!is_cluster_preamble(b"\0\0\0\x08\x04\xd2\x16/"));
    }

    #[tokio::test]
    async fn oversized_frame_is_refused() {
        let (a, b) = pair().await;
        let (_ar, mut aw) = a.into_split();
        let (br, _bw) = b.into_split();
        // Before the handshake even 100 kB is too much for a hello.
        aw.write_all(&100_000u32.to_be_bytes()).await.unwrap();
        let mut r = FrameReader::new(br, "a".into(), Direction::ToMaster);
        let err = r.read::<NodeMsg>().await.unwrap_err().to_string();
        assert!(err.contains("frame of 100000 bytes exceeds the limit of 65536"), "{err}");
    }
}
