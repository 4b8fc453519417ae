//! Picking a rendezvous port for clusters this binary starts itself (`launch`, `bench`, the
//! embedded cluster of `demo`).

use anyhow::Context;

/// Lowest port `free_port` picks from.
const LAUNCH_PORT_MIN: u16 = 10_000;
/// Attempts to find a free port before falling back to one the kernel assigns.
const LAUNCH_PORT_TRIES: u32 = 64;

/// A port that is free right now on `host` (the master binds it a moment later). It is picked
/// below the kernel's ephemeral range (`/proc/sys/net/ipv4/ip_local_port_range`), so a port the
/// kernel hands to some `bind(0)` in between (every node's own listeners, say) cannot take it.
pub fn free_port(host: &str) -> anyhow::Result<u16> {
    // Resolved once: each bind by name would look it up again (seconds each for a bad name).
    use std::net::ToSocketAddrs;
    let ip = (host, 0)
        .to_socket_addrs()
        .with_context(|| format!("the master address {host} does not resolve"))?
        .next()
        .with_context(|| format!("the master address {host} resolves to no address"))?
        .ip();
    let ephemeral_low = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|s| s.split_whitespace().next().and_then(|v| v.parse::<u16>().ok()))
        .unwrap_or(32_768);
    if ephemeral_low > LAUNCH_PORT_MIN + 1 {
        for _ in 0..LAUNCH_PORT_TRIES {
            let port = rand::random_range(LAUNCH_PORT_MIN..ephemeral_low);
            if std::net::TcpListener::bind((ip, port)).is_ok() {
                return Ok(port);
            }
        }
    }
    let l = std::net::TcpListener::bind((ip, 0)).with_context(|| format!("cannot find a free port on {host}"))?;
    Ok(l.local_addr()?.port())
}
