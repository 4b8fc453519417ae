//! A PostgreSQL connection's messages, checked one by one before pgwire decodes them.
//!
//! pgwire 0.42's decoders trust the counts and lengths inside a message and read past its end:
//! a `Bind` whose parameter claimed 1000 bytes, or a `Parse` with a negative type count, panicked
//! the connection's task (the client saw the connection drop, the log a panic), and so did a
//! malformed SCRAM message before login; a `Query` was read up to its first NUL byte, and what
//! followed in the same message ran as further messages (a proxy that frames by length would see
//! one statement where the node ran two). So the node relays each connection: the client's
//! bytes are read here message by message, each checked against its declared length and its
//! type's layout, and handed to pgwire over a socket pair; one that does not fit gets a `FATAL`
//! protocol-violation error (SQLSTATE 08P01) naming what is wrong, and the connection closes, as
//! PostgreSQL closes it. pgwire's answers go to the client unchanged, read here only until
//! login, to know which kind of password message the server asked for. Requests for SSL or GSS
//! encryption are answered "no" here, as pgwire answered them.

use std::sync::Arc;
use std::sync::atomic::{AtomicU8, Ordering};
use std::time::Duration;

use bytes::{Buf, BytesMut};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::net::UnixStream;

/// The request code of an SSLRequest, of a GSSENCRequest and of a CancelRequest.
const SSL_REQUEST_CODE: i32 = 80_877_103;
const GSSENC_REQUEST_CODE: i32 = 80_877_104;
const CANCEL_REQUEST_CODE: i32 = 80_877_102;
/// The longest startup packet (PostgreSQL's `MAX_STARTUP_PACKET_LENGTH`).
pub const PG_STARTUP_MAX_BYTES: usize = 10_000;
/// The longest message before login (pgwire's limit for small messages).
pub const PG_BEFORE_LOGIN_MAX_BYTES: usize = 10_000;
/// The longest message after login (PostgreSQL's and pgwire's, just under 1 GiB).
pub const PG_MESSAGE_MAX_BYTES: usize = 0x3fff_fffe;
/// How long a client may take over its startup packets (pgwire's startup timeout).
const PG_STARTUP_TIMEOUT_MS: u64 = 60_000;
/// How long pgwire may take to answer what it was sent once the client has gone or been cut off.
const PG_DRAIN_TIMEOUT_MS: u64 = 5_000;
/// How long a client's socket may take none of a [`PG_SEND_CHUNK_BYTES`] piece of its answers
/// before the connection is closed and its query cancelled (ClickHouse's `send_timeout`, 300 s,
/// `DBMS_DEFAULT_SEND_TIMEOUT_SEC` in its `Core/Defines.h`): an
/// answer nobody reads holds its query, and the query what it reads from other nodes.
pub const PG_SEND_TIMEOUT_MS: u64 = 300_000;
/// How long a client may leave the node waiting, in milliseconds, for the rest of a message it
/// began, or for the next message of a `COPY ... FROM STDIN` whose data it began sending
/// (ClickHouse's `receive_timeout`, 300 s, `DBMS_DEFAULT_RECEIVE_TIMEOUT_SEC`): then the connection closes with an error, and what
/// the COPY had sent is dropped. A COPY's data is held until its end (up to
/// `COPY_IN_MAX_BYTES`), and a client that stops half-way would otherwise hold it for good.
/// Between statements a connection may stay idle as long as the client likes, as in PostgreSQL
/// (whose `idle_session_timeout` is off by default; shardwise accepts the setting and ignores
/// it).
pub const PG_RECEIVE_TIMEOUT_MS: u64 = 300_000;
/// The most of pgwire's answers passed on to the client in one write.
const PG_SEND_CHUNK_BYTES: usize = 64 << 10;

/// What a password message (`p`) must be: what the server's last authentication request asked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
enum Asked {
    Nothing = 0,
    Password = 1,
    SaslInitial = 2,
    SaslResponse = 3,
    LoggedIn = 4,
}

impl Asked {
    fn load(cell: &AtomicU8) -> Asked {
        match cell.load(Ordering::SeqCst) {
            1 => Asked::Password,
            2 => Asked::SaslInitial,
            3 => Asked::SaslResponse,
            4 => Asked::LoggedIn,
            _ => Asked::Nothing,
        }
    }
}

/// Relays `client` to pgwire's end of a socket pair (`pgwire`) until either side is done, or
/// until the client has taken nothing of an answer for `send_timeout`.
pub async fn relay(
    mut client: TcpStream,
    mut pgwire: UnixStream,
    (send_timeout, receive_timeout): (Duration, Duration),
) {
    let startup =
        tokio::time::timeout(Duration::from_millis(PG_STARTUP_TIMEOUT_MS), negotiate(&mut client, &mut pgwire)).await;
    match startup {
        Ok(Ok(true)) => {}
        Ok(Ok(false)) | Err(_) => return,
        Ok(Err(violation)) => {
            let _ = client.write_all(&fatal_error(PROTOCOL_VIOLATION, &violation)).await;
            return;
        }
    }
    let asked = Arc::new(AtomicU8::new(Asked::Nothing as u8));
    let (client_in, client_out) = client.into_split();
    let (pgwire_in, mut pgwire_out) = pgwire.into_split();
    let mut answers = tokio::spawn(answers(pgwire_in, client_out, Arc::clone(&asked), send_timeout));
    let client_in = std::pin::pin!(tokio_io_timeout::TimeoutReader::new(client_in));
    let violation = tokio::select! {
        // pgwire closed the connection (the client said goodbye, or it failed), or the client
        // stopped reading its answers.
        _ = &mut answers => return,
        ended = requests(client_in, &mut pgwire_out, &asked, receive_timeout) => ended.err(),
    };
    // The client has gone, or sent what cannot be passed on: pgwire answers what it was sent,
    // then closes its side.
    let _ = pgwire_out.shutdown().await;
    let drained = tokio::time::timeout(Duration::from_millis(PG_DRAIN_TIMEOUT_MS), &mut answers).await;
    let Ok(Ok(mut client_out)) = drained else {
        answers.abort();
        return;
    };
    if let Some((code, violation)) = violation {
        tracing::debug!("postgres connection: {violation}");
        let _ = client_out.write_all(&fatal_error(code, &violation)).await;
    }
    let _ = client_out.shutdown().await;
}

/// The startup phase: SSL and GSS requests are answered "no"; the startup packet (or a cancel
/// request) is passed on. `Ok(false)` if the client went away first.
async fn negotiate(client: &mut TcpStream, pgwire: &mut UnixStream) -> Result<bool, String> {
    loop {
        let Some(len) = read_len(client).await else { return Ok(false) };
        if !(8..=PG_STARTUP_MAX_BYTES as i32).contains(&len) {
            return Err(format!("invalid length of startup packet: {len} (8 to {PG_STARTUP_MAX_BYTES} bytes)"));
        }
        let mut body = vec![0u8; len as usize - 4];
        if client.read_exact(&mut body).await.is_err() {
            return Ok(false);
        }
        let code = i32::from_be_bytes([body[0], body[1], body[2], body[3]]);
        if len == 8 && (code == SSL_REQUEST_CODE || code == GSSENC_REQUEST_CODE) {
            if client.write_all(b"N").await.is_err() {
                return Ok(false);
            }
            continue;
        }
        check_startup(code, &body[4..])?;
        let mut packet = len.to_be_bytes().to_vec();
        packet.extend_from_slice(&body);
        return Ok(pgwire.write_all(&packet).await.is_ok());
    }
}

/// A startup packet's protocol version and parameters (name and value pairs, then a NUL byte
/// that ends the packet), or a cancel request's key.
fn check_startup(code: i32, rest: &[u8]) -> Result<(), String> {
    if code == CANCEL_REQUEST_CODE {
        return match rest.len() {
            8 => Ok(()),
            n => Err(format!("invalid length of cancel request: {} bytes", n + 8)),
        };
    }
    let (major, minor) = (code >> 16, code & 0xffff);
    if major != 3 {
        return Err(format!("unsupported frontend protocol {major}.{minor}: server supports 3.0"));
    }
    let mut r = Reader(rest);
    loop {
        if r.cstring()?.is_empty() {
            break;
        }
        r.cstring()?;
    }
    match r.0.len() {
        0 => Ok(()),
        n => Err(format!("invalid startup packet: {n} bytes follow the end of its parameters")),
    }
}

/// Passes the client's messages on, each checked; returns when the client is done (or pgwire's
/// end is gone), or with what was wrong.
async fn requests<R: AsyncRead>(
    mut client: std::pin::Pin<&mut tokio_io_timeout::TimeoutReader<R>>,
    pgwire: &mut (impl AsyncWrite + Unpin),
    asked: &AtomicU8,
    receive_timeout: Duration,
) -> Result<(), (&'static str, String)> {
    // Inside a COPY's data (after a CopyData, until CopyDone or CopyFail).
    let mut copying = false;
    loop {
        client.as_mut().set_timeout_pinned(copying.then_some(receive_timeout));
        let mut kind = [0u8; 1];
        if let Err(e) = client.read_exact(&mut kind).await {
            return ended(&e, receive_timeout, "the next message of a COPY's data");
        }
        let kind = kind[0];
        client.as_mut().set_timeout_pinned(Some(receive_timeout));
        let mut len = [0u8; 4];
        if let Err(e) = client.read_exact(&mut len).await {
            return ended(&e, receive_timeout, "the rest of a message");
        }
        let len = i32::from_be_bytes(len);
        let asked_now = Asked::load(asked);
        let max = if asked_now == Asked::LoggedIn { PG_MESSAGE_MAX_BYTES } else { PG_BEFORE_LOGIN_MAX_BYTES };
        if len < 4 || len as usize - 4 > max {
            let why = format!("message '{}' has an invalid length, {len} (4 to {max} bytes)", kind as char);
            return Err((PROTOCOL_VIOLATION, why));
        }
        let mut message = vec![kind];
        message.extend_from_slice(&len.to_be_bytes());
        // Read as it arrives, never allocated ahead by the length the client claims (a logged-in
        // client claiming 1 GiB and sending ten bytes would have had the node zero 1 GiB).
        let body = (len - 4) as u64;
        match client.as_mut().take(body).read_to_end(&mut message).await {
            Ok(n) if n as u64 == body => {}
            Ok(_) => return Ok(()),
            Err(e) => return ended(&e, receive_timeout, "the rest of a message"),
        }
        check(kind, &message[5..], asked_now)
            .map_err(|why| (PROTOCOL_VIOLATION, format!("malformed '{}' message: {why}", kind as char)))?;
        copying = kind == b'd';
        if pgwire.write_all(&message).await.is_err() {
            return Ok(());
        }
    }
}

/// SQLSTATE of a message that breaks the protocol.
const PROTOCOL_VIOLATION: &str = "08P01";

/// Reading from the client failed with `e`: it went away (`Ok`), or it sent nothing for
/// `receive_timeout` while the node waited for `waiting_for` (an error for the client, SQLSTATE
/// 08006, connection failure).
fn ended(e: &std::io::Error, receive_timeout: Duration, waiting_for: &str) -> Result<(), (&'static str, String)> {
    match e.kind() {
        std::io::ErrorKind::TimedOut => Err((
            "08006",
            format!(
                "the client sent nothing for {} s while the node waited for {waiting_for} (PG_RECEIVE_TIMEOUT_MS); \
                 the connection is closed, and a COPY's data sent so far is dropped",
                receive_timeout.as_secs_f64()
            ),
        )),
        _ => Ok(()),
    }
}

/// pgwire's answers to the client: read message by message until login (to record what each
/// authentication request asks for), then copied as they come. Returns the client's half.
async fn answers(
    mut pgwire: tokio::net::unix::OwnedReadHalf,
    mut client: tokio::net::tcp::OwnedWriteHalf,
    asked: Arc<AtomicU8>,
    send_timeout: Duration,
) -> tokio::net::tcp::OwnedWriteHalf {
    let mut buf = BytesMut::new();
    'login: loop {
        while buf.len() >= 5 {
            let len = i32::from_be_bytes([buf[1], buf[2], buf[3], buf[4]]).max(4) as usize;
            if buf.len() < len + 1 {
                break;
            }
            if buf[0] == b'R' && len >= 8 {
                let now = match i32::from_be_bytes([buf[5], buf[6], buf[7], buf[8]]) {
                    0 => Asked::LoggedIn,
                    3 | 5 => Asked::Password,
                    10 => Asked::SaslInitial,
                    11 => Asked::SaslResponse,
                    _ => Asked::Nothing,
                };
                asked.store(now as u8, Ordering::SeqCst);
            }
            let message = buf.split_to(len + 1);
            if !sent(&mut client, &message, send_timeout).await {
                return client;
            }
            if Asked::load(&asked) == Asked::LoggedIn {
                break 'login;
            }
        }
        match pgwire.read_buf(&mut buf).await {
            Ok(0) | Err(_) => return client,
            Ok(_) => {}
        }
    }
    if !sent(&mut client, &buf, send_timeout).await {
        return client;
    }
    let mut chunk = vec![0u8; PG_SEND_CHUNK_BYTES];
    loop {
        match pgwire.read(&mut chunk).await {
            Ok(0) | Err(_) => return client,
            Ok(n) => {
                if !sent(&mut client, &chunk[..n], send_timeout).await {
                    return client;
                }
            }
        }
    }
}

/// Writes `bytes` to the client; false if it failed, or took longer than `send_timeout`.
async fn sent(client: &mut tokio::net::tcp::OwnedWriteHalf, bytes: &[u8], send_timeout: Duration) -> bool {
    match tokio::time::timeout(send_timeout, client.write_all(bytes)).await {
        Ok(written) => written.is_ok(),
        Err(_) => {
            tracing::debug!("postgres connection: the client took none of its answers for {send_timeout:?}: closed");
            false
        }
    }
}

/// Whether `body` fits the layout of a message of type `kind` exactly.
fn check(kind: u8, body: &[u8], asked: Asked) -> Result<(), String> {
    let mut r = Reader(body);
    match kind {
        // Query: one statement, ended by the message's only NUL byte.
        b'Q' => {
            r.cstring()?;
        }
        // Parse: name, statement, parameter types.
        b'P' => {
            r.cstring()?;
            r.cstring()?;
            let types = r.count()?;
            r.take(types * 4)?;
        }
        // Bind: portal, statement, parameter formats, parameters, result formats.
        b'B' => {
            r.cstring()?;
            r.cstring()?;
            let formats = r.count()?;
            r.take(formats * 2)?;
            for _ in 0..r.count()? {
                match r.i32()? {
                    -1 => {}
                    n if n >= 0 => {
                        r.take(n as usize)?;
                    }
                    n => return Err(format!("a parameter of {n} bytes")),
                }
            }
            let results = r.count()?;
            r.take(results * 2)?;
        }
        // Execute: portal, row limit.
        b'E' => {
            r.cstring()?;
            r.i32()?;
        }
        // Describe, Close: statement or portal, and its name.
        b'D' | b'C' => {
            if !matches!(r.take(1)?, [b'S' | b'P']) {
                return Err("it names neither a statement ('S') nor a portal ('P')".into());
            }
            r.cstring()?;
        }
        // Sync, Flush, Terminate, CopyDone: nothing.
        b'S' | b'H' | b'X' | b'c' => {}
        // CopyData: anything.
        b'd' => r.0 = &[],
        // CopyFail: the reason.
        b'f' => {
            r.cstring()?;
        }
        b'p' => check_password(&mut r, asked)?,
        other => return Err(format!("'{}' is not a message type a client sends", other as char)),
    }
    if !r.0.is_empty() {
        return Err(format!("{} bytes follow the end of its contents", r.0.len()));
    }
    Ok(())
}

/// A password message, of the kind the server asked for.
fn check_password(r: &mut Reader<'_>, asked: Asked) -> Result<(), String> {
    match asked {
        Asked::Password => {
            r.cstring()?;
        }
        Asked::SaslInitial => {
            r.cstring()?;
            match r.i32()? {
                -1 => {}
                n if n >= 0 => {
                    r.take(n as usize)?;
                }
                n => return Err(format!("SASL data of {n} bytes")),
            }
        }
        Asked::SaslResponse => r.0 = &[],
        Asked::Nothing | Asked::LoggedIn => return Err("the server asked for no password".into()),
    }
    Ok(())
}

/// Reads a message's fields, never past its end.
struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], String> {
        if n > self.0.len() {
            return Err(format!("it ends {} bytes early", n - self.0.len()));
        }
        let (taken, rest) = self.0.split_at(n);
        self.0 = rest;
        Ok(taken)
    }

    fn cstring(&mut self) -> Result<&'a [u8], String> {
        let end = self.0.iter().position(|&b| b == 0).ok_or("a string is not ended by a NUL byte")?;
        let s = self.take(end + 1)?;
        Ok(&s[..end])
    }

    fn i32(&mut self) -> Result<i32, String> {
        let mut bytes = self.take(4)?;
        Ok(bytes.get_i32())
    }

    /// A 16-bit count, which may not be negative.
    fn count(&mut self) -> Result<usize, String> {
        let mut bytes = self.take(2)?;
        match bytes.get_i16() {
            n if n >= 0 => Ok(n as usize),
            n => Err(format!("a count of {n}")),
        }
    }
}

/// The 4-byte length that starts a message, or `None` at the end of the stream.
async fn read_len(from: &mut (impl AsyncRead + Unpin)) -> Option<i32> {
    let mut len = [0u8; 4];
    from.read_exact(&mut len).await.ok()?;
    Some(i32::from_be_bytes(len))
}

/// A `FATAL` ErrorResponse with SQLSTATE `code` and `message`.
pub fn fatal_error(code: &str, message: &str) -> Vec<u8> {
    let mut fields = Vec::new();
    for (field, value) in [(b'S', "FATAL"), (b'V', "FATAL"), (b'C', code), (b'M', message)] {
        fields.push(field);
        fields.extend_from_slice(value.replace('\0', " ").as_bytes());
        fields.push(0);
    }
    fields.push(0);
    let mut out = vec![b'E'];
    out.extend_from_slice(&(fields.len() as i32 + 4).to_be_bytes());
    out.extend_from_slice(&fields);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn msg(kind: u8, body: &[u8]) -> Vec<u8> {
        let mut out = vec![kind];
        out.extend_from_slice(&(body.len() as i32 + 4).to_be_bytes());
        out.extend_from_slice(body);
        out
    }

    fn bind(params: &[(i32, &[u8])]) -> Vec<u8> {
        let mut b = b"\0\0".to_vec();
        b.extend_from_slice(&0i16.to_be_bytes());
        b.extend_from_slice(&(params.len() as i16).to_be_bytes());
        for (len, bytes) in params {
            b.extend_from_slice(&len.to_be_bytes());
            b.extend_from_slice(bytes);
        }
        b.extend_from_slice(&0i16.to_be_bytes());
        b
    }

    #[test]
    fn messages_are_checked_against_their_layout() {
        let logged_in = Asked::LoggedIn;
        check(b'Q', b"SELECT 1\0", logged_in).unwrap();
        // The smuggled second query, and a query with no end.
        let mut hidden = b"SELECT 1\0".to_vec();
        hidden.extend_from_slice(&msg(b'Q', b"SELECT 777\0"));
        assert!(check(b'Q', &hidden, logged_in).unwrap_err().contains("follow the end"));
        assert!(check(b'Q', b"SELECT 1", logged_in).unwrap_err().contains("NUL"));
        // Parse with types, and with counts that do not fit.
        let mut parse = b"\0SELECT $1\0".to_vec();
        parse.extend_from_slice(&1i16.to_be_bytes());
        parse.extend_from_slice(&20i32.to_be_bytes());
        check(b'P', &parse, logged_in).unwrap();
        let mut negative = b"\0SELECT 1\0".to_vec();
        negative.extend_from_slice(&(-3i16).to_be_bytes());
        assert!(check(b'P', &negative, logged_in).unwrap_err().contains("count of -3"));
        let mut short = b"\0SELECT 1\0".to_vec();
        short.extend_from_slice(&100i16.to_be_bytes());
        assert!(check(b'P', &short, logged_in).unwrap_err().contains("early"));
        // Bind: a NULL and a value; then a parameter longer than the message.
        check(b'B', &bind(&[(-1, b""), (2, b"42")]), logged_in).unwrap();
        assert!(check(b'B', &bind(&[(1000, b"42")]), logged_in).unwrap_err().contains("early"));
        assert!(check(b'B', &bind(&[(-7, b"")]), logged_in).unwrap_err().contains("-7 bytes"));
        check(b'E', b"\0\0\0\0\0", logged_in).unwrap();
        check(b'D', b"S\0", logged_in).unwrap();
        assert!(check(b'D', b"Z\0", logged_in).is_err());
        check(b'S', b"", logged_in).unwrap();
        assert!(check(b'S', b"x", logged_in).is_err());
        check(b'd', b"any\0bytes", logged_in).unwrap();
        assert!(check(b'Z', b"", logged_in).unwrap_err().contains("not a message type"));
        // Password messages, as asked.
        check(b'p', b"secret\0", Asked::Password).unwrap();
        let mut sasl = b"SCRAM-SHA-256\0".to_vec();
        sasl.extend_from_slice(&3i32.to_be_bytes());
        sasl.extend_from_slice(b"n,,");
        check(b'p', &sasl, Asked::SaslInitial).unwrap();
        assert!(check(b'p', b"SCRAM-SHA-256\0xy", Asked::SaslInitial).unwrap_err().contains("early"));
        check(b'p', b"c=biws,r=abc", Asked::SaslResponse).unwrap();
        assert!(check(b'p', b"secret\0", logged_in).is_err());
    }

    #[test]
    fn startup_packets_are_checked() {
        check_startup(196_608, b"user\0x\0database\0shardwise\0\0").unwrap();
        check_startup(196_610, b"user\0x\0\0").unwrap();
        check_startup(CANCEL_REQUEST_CODE, &[0; 8]).unwrap();
        assert!(check_startup(131_072, b"user\0x\0\0").unwrap_err().contains("unsupported frontend protocol 2.0"));
        assert!(check_startup(196_608, b"user\0x\0").unwrap_err().contains("NUL"));
        assert!(check_startup(196_608, b"user\0x\0\0Q").unwrap_err().contains("follow the end"));
    }

    /// Runs [`relay`] with `sent` from the client; what reached pgwire's end and what the
    /// client got back. pgwire's end answers nothing and closes when the relay shuts it.
    /// A protocol 3.0 startup packet for user `x`.
    fn startup_packet() -> Vec<u8> {
        let mut startup = 196_608i32.to_be_bytes().to_vec();
        startup.extend_from_slice(b"user\0x\0\0");
        let mut packet = (startup.len() as i32 + 4).to_be_bytes().to_vec();
        packet.extend_from_slice(&startup);
        packet
    }

    async fn relayed(sent: Vec<u8>) -> (Vec<u8>, Vec<u8>) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let mut client = TcpStream::connect(listener.local_addr().unwrap()).await.unwrap();
        let (server, _) = listener.accept().await.unwrap();
        let (ours, mut theirs) = UnixStream::pair().unwrap();
        // pgwire's stand-in: logs the client in at once, as pgwire without users does.
        theirs.write_all(&msg(b'R', &0i32.to_be_bytes())).await.unwrap();
        let relay = tokio::spawn(relay(server, ours, (Duration::from_secs(30), Duration::from_secs(30))));
        client.write_all(&sent).await.unwrap();
        let mut received = Vec::new();
        let mut got = Vec::new();
        let reading = async {
            let _ = client.read_to_end(&mut got).await;
        };
        let forwarding = async {
            let _ = theirs.read_to_end(&mut received).await;
            drop(theirs);
        };
        let _ = tokio::time::timeout(Duration::from_secs(5), futures::future::join(reading, forwarding)).await;
        let _ = tokio::time::timeout(Duration::from_secs(5), relay).await;
        (received, got)
    }

    #[tokio::test]
    async fn good_messages_pass_unchanged_and_a_bad_one_ends_the_connection_with_an_error() {
        let startup_packet = startup_packet();
        let ssl_request = [0, 0, 0, 8, 4, 210, 22, 47];
        let query = msg(b'Q', b"SELECT 1\0");
        let bad_bind = msg(b'B', &bind(&[(1000, b"42")]));
        let after = msg(b'Q', b"SELECT 2\0");
        let sent = [&ssl_request[..], &startup_packet, &query, &bad_bind, &after].concat();
        let (received, got) = relayed(sent).await;
        // pgwire got the startup packet and the good query; not the bad Bind, nor what followed.
        assert_eq!(received, [startup_packet, query].concat());
        // The client: "no SSL", the login, then the error.
        assert!(got.starts_with(b"N"), "{got:?}");
        let text = String::from_utf8_lossy(&got);
        assert!(text.contains("08P01") && text.contains("malformed 'B' message: it ends"), "{text}");
    }

    /// A client that stops reading its answers is cut off after the send timeout, and pgwire's
    /// end sees the connection close (so the query behind the answers ends).
    #[tokio::test]
    async fn a_client_that_reads_no_answers_is_cut_off() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let mut client = TcpStream::connect(listener.local_addr().unwrap()).await.unwrap();
        let (server, _) = listener.accept().await.unwrap();
        let (ours, mut theirs) = UnixStream::pair().unwrap();
        let relay = tokio::spawn(relay(server, ours, (Duration::from_millis(300), Duration::from_secs(30))));
        let startup_packet = startup_packet();
        client.write_all(&startup_packet).await.unwrap();
        client.write_all(&msg(b'Q', b"SELECT * FROM big\0")).await.unwrap();
        // pgwire's stand-in logs the client in, then answers rows until its writes fail.
        theirs.write_all(&msg(b'R', &0i32.to_be_bytes())).await.unwrap();
        let row = msg(b'D', &[b'x'; 8192]);
        let started = std::time::Instant::now();
        let flooding = async {
            let mut written = 0usize;
            while theirs.write_all(&row).await.is_ok() {
                written += row.len();
                assert!(written < 1 << 30, "1 GiB written to a client that reads nothing");
            }
        };
        let ended = tokio::time::timeout(Duration::from_secs(10), flooding).await;
        assert!(ended.is_ok(), "pgwire's end could still write after 10 s");
        assert!(started.elapsed() >= Duration::from_millis(250), "cut off before the timeout");
        let _ = tokio::time::timeout(Duration::from_secs(5), relay).await.expect("the relay ended");
    }

    /// A COPY whose data stops half-way is cut off after the receive timeout, with an error that
    /// says why; a connection idle between statements is not (as in PostgreSQL), nor one whose
    /// COPY ended.
    #[tokio::test]
    async fn a_copy_whose_data_stops_is_cut_off_and_an_idle_connection_is_not() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let mut client = TcpStream::connect(listener.local_addr().unwrap()).await.unwrap();
        let (server, _) = listener.accept().await.unwrap();
        let (ours, mut theirs) = UnixStream::pair().unwrap();
        let relay = tokio::spawn(relay(server, ours, (Duration::from_secs(30), Duration::from_millis(300))));
        let startup_packet = startup_packet();
        client.write_all(&startup_packet).await.unwrap();
        theirs.write_all(&msg(b'R', &0i32.to_be_bytes())).await.unwrap();
        // Idle for twice the timeout between statements, and after a whole COPY: still served.
        let copy = [msg(b'Q', b"COPY t FROM STDIN\0"), msg(b'd', b"1\n"), msg(b'c', b"")].concat();
        client.write_all(&copy).await.unwrap();
        tokio::time::sleep(Duration::from_millis(600)).await;
        let query = msg(b'Q', b"SELECT 1\0");
        client.write_all(&query).await.unwrap();
        let mut forwarded = vec![0u8; startup_packet.len() + copy.len() + query.len()];
        let read = tokio::time::timeout(Duration::from_secs(5), theirs.read_exact(&mut forwarded)).await;
        assert!(matches!(read, Ok(Ok(_))), "the idle connection's statement was not passed on: {read:?}");
        assert_eq!(forwarded, [startup_packet, copy, query].concat());
        // A COPY that sends one piece of data and then nothing.
        let started = std::time::Instant::now();
        client.write_all(&[msg(b'Q', b"COPY t FROM STDIN\0"), msg(b'd', b"1\n")].concat()).await.unwrap();
        let mut got = Vec::new();
        let answered = async {
            let mut skipped = Vec::new();
            let _ = theirs.read_to_end(&mut skipped).await;
            drop(theirs);
            let _ = client.read_to_end(&mut got).await;
        };
        assert!(tokio::time::timeout(Duration::from_secs(10), answered).await.is_ok(), "not cut off within 10 s");
        assert!(started.elapsed() >= Duration::from_millis(250), "cut off before the timeout");
        let text = String::from_utf8_lossy(&got);
        assert!(text.contains("08006") && text.contains("PG_RECEIVE_TIMEOUT_MS"), "{text}");
        let _ = tokio::time::timeout(Duration::from_secs(5), relay).await.expect("the relay ended");
    }
}
