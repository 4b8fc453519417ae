//! What listens at an address a client could not speak Flight SQL to: `shardwise sql` and
//! `shardwise load` given a node's PostgreSQL or HTTP port (each node listens on three) failed
//! with a transport error ("connection closed", "invalid compression flag: 123") that did not
//! say the port was the wrong one. After a failed connect or log-in, the address is asked once
//! as each of the other two protocols would be, and the error names what answered.

use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// How long each probe may take (connect, and then the first bytes of the answer).
pub const PORT_PROBE_TIMEOUT_MS: u64 = 1_000;

/// PostgreSQL's SSLRequest: a server answers it with one byte, `S` or `N`.
const PG_SSL_REQUEST: [u8; 8] = [0, 0, 0, 8, 0x04, 0xd2, 0x16, 0x2f];
/// An HTTP/1.0 request: a server answers with a status line starting `HTTP/`.
const HTTP_REQUEST: &[u8] = b"GET / HTTP/1.0\r\n\r\n";

/// `host:port` of `addr` (`http://host:port` or `host:port`), without a scheme or path.
fn host_port(addr: &str) -> &str {
    let rest = addr.split_once("://").map(|(_, rest)| rest).unwrap_or(addr);
    rest.split('/').next().unwrap_or(rest)
}

/// `Ok` when `addr` names a port (`host:port`, `[v6]:port`, with or without `http://`); else
/// what is wrong with it.
pub fn check_port(addr: &str) -> Result<(), String> {
    let hp = host_port(addr);
    let no_port =
        || format!("{addr} names no port: give HOST:PORT, with a node's flight= port (in its `listening` line)");
    let (host, port) = hp.rsplit_once(':').ok_or_else(no_port)?;
    if host.is_empty() || (host.contains(':') && !host.ends_with(']')) {
        return Err(no_port());
    }
    match port.parse::<u64>() {
        Ok(n) if (1..=u64::from(u16::MAX)).contains(&n) => Ok(()),
        Ok(n) => Err(format!("{addr}: port {n} is out of range (1 to 65535)")),
        Err(_) => Err(no_port()),
    }
}

/// The first bytes `addr` answers `request` with, if it answers within the probe timeout.
async fn answer(addr: &str, request: &[u8]) -> Option<Vec<u8>> {
    let timeout = Duration::from_millis(PORT_PROBE_TIMEOUT_MS);
    let mut stream = tokio::time::timeout(timeout, TcpStream::connect(addr)).await.ok()?.ok()?;
    stream.write_all(request).await.ok()?;
    let mut buf = [0u8; 8];
    let n = tokio::time::timeout(timeout, stream.read(&mut buf)).await.ok()?.ok()?;
    Some(buf[..n].to_vec())
}

/// A hint naming what answered at `addr` when it is PostgreSQL or HTTP; `None` otherwise.
pub async fn wrong_port_hint(addr: &str) -> Option<String> {
    let hp = host_port(addr);
    let what = match answer(hp, &PG_SSL_REQUEST).await.as_deref() {
        Some([b'S'] | [b'N']) => "a PostgreSQL server (a node's pg= port?)",
        // The master greets every connection with the cluster's preamble.
        Some(reply) if shardwise_cluster::wire::is_cluster_preamble(reply) => {
            "the master's rendezvous port (MASTER_PORT), which nodes join through"
        }
        _ => match answer(hp, HTTP_REQUEST).await {
            Some(reply) if reply.starts_with(b"HTTP/") => "an HTTP server (a node's http= port?)",
            _ => return None,
        },
    };
    Some(format!(
        "{hp} answers as {what}, not as Flight SQL: give the node's flight= port (in its `listening` line, and in \
         system.nodes.flight_addr)"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ports_are_found_in_every_form_of_address() {
        for addr in ["127.0.0.1:5", "http://127.0.0.1:5", "localhost:5/x", "[::1]:5", "http://[::1]:5"] {
            assert_eq!(check_port(addr), Ok(()), "{addr}");
        }
        for addr in ["127.0.0.1", "http://127.0.0.1", "localhost:", "::1", "[::1]", ":5", "host:http"] {
            assert!(check_port(addr).unwrap_err().contains("names no port"), "{addr}");
        }
        assert!(check_port("127.0.0.1:99999").unwrap_err().contains("port 99999 is out of range (1 to 65535)"));
        assert!(check_port("127.0.0.1:0").unwrap_err().contains("port 0 is out of range"));
    }

    #[tokio::test]
    async fn a_postgresql_or_http_server_is_named() {
        use tokio::net::TcpListener;
        for (reply, want) in
            [(&b"N"[..], "PostgreSQL"), (b"HTTP/1.1 404 Not Found\r\n", "HTTP"), (b"SHRDWS\x00\x02", "rendezvous")]
        {
            let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
            let addr = listener.local_addr().unwrap().to_string();
            let server = tokio::spawn(async move {
                // Answers each probe connection as the server would answer its own protocol.
                for _ in 0..2 {
                    let (mut s, _) = listener.accept().await.unwrap();
                    let mut buf = [0u8; 64];
                    let n = s.read(&mut buf).await.unwrap();
                    let speaks_to_it = match want {
                        "PostgreSQL" | "rendezvous" => buf[..n] == PG_SSL_REQUEST,
                        _ => buf[..n].starts_with(b"GET "),
                    };
                    if speaks_to_it {
                        let _ = s.write_all(reply).await;
                        return;
                    }
                }
            });
            let hint = wrong_port_hint(&addr).await.unwrap_or_default();
            assert!(hint.contains(want) && hint.contains("flight="), "{want}: {hint:?}");
            server.abort();
        }
    }
}
