//! The master's check that a joining node's advertised addresses can be reached by the others.
//!
//! Why: a node on another machine that advertises a loopback address (its default listen host,
//! 127.0.0.1, kept by a `--listen-host 127.0.0.1` or a config file) would join, the cluster would
//! form, and every read and write that crosses machines would then fail connecting to the
//! caller's own loopback. The master sees that the node came from another machine (the
//! connection's two ends have different addresses) and refuses it with what to set.

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};

/// Why a node that connected from `peer` (to the master's `local` end) cannot be reached at the
/// addresses it advertises, if so: it is on another machine and advertises loopback ones.
pub fn loopback_from_afar(
    peer: SocketAddr,
    local: Option<SocketAddr>,
    addrs: &BTreeMap<String, String>,
) -> Option<String> {
    let local = local?;
    // The same machine: connections to its own address come from that address.
    if peer.ip() == local.ip() || peer.ip().is_loopback() {
        return None;
    }
    let loopback: Vec<String> =
        addrs.iter().filter(|(_, addr)| is_loopback_host(addr)).map(|(name, addr)| format!("{name} {addr}")).collect();
    if loopback.is_empty() {
        return None;
    }
    // The first one is enough to say (a refusal is cut at 500 characters).
    Some(format!(
        "this node connected from {}, another machine than the master's, but advertises loopback addresses ({} \
         ...), which the other machines cannot reach: set --listen-host to an address of its machine they can \
         reach, or leave it out (the node then listens where its route to the master leaves from)",
        peer.ip(),
        loopback[0]
    ))
}

/// Whether `host:port` names a loopback host (127.0.0.0/8, ::1, localhost).
fn is_loopback_host(addr: &str) -> bool {
    let host = match addr.rsplit_once(':') {
        Some((host, port)) if port.bytes().all(|b| b.is_ascii_digit()) => host,
        _ => addr,
    };
    let host = host.trim_start_matches('[').trim_end_matches(']');
    host.eq_ignore_ascii_case("localhost") || host.parse::<IpAddr>().is_ok_and(|ip| ip.is_loopback())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn addrs(host: &str) -> BTreeMap<String, String> {
        [("data", 7001), ("flight", 7002)].into_iter().map(|(k, p)| (k.to_string(), format!("{host}:{p}"))).collect()
    }

    fn sock(text: &str) -> SocketAddr {
        text.parse().expect("socket address")
    }

    #[test]
    fn a_node_on_another_machine_advertising_loopback_is_refused_with_what_to_set() {
        let why = loopback_from_afar(sock("10.77.0.2:40000"), Some(sock("10.77.0.1:29500")), &addrs("127.0.0.1"))
            .expect("refused");
        assert!(why.contains("10.77.0.2") && why.contains("data 127.0.0.1:7001") && why.contains("--listen-host"));
        assert!(why.chars().count() < 500, "{why}");
        assert!(loopback_from_afar(sock("10.77.0.2:1"), Some(sock("10.77.0.1:2")), &addrs("localhost")).is_some());
        assert!(loopback_from_afar(sock("[fd00::2]:1"), Some(sock("[fd00::1]:2")), &addrs("[::1]")).is_some());
    }

    #[test]
    fn the_same_machine_or_reachable_addresses_pass() {
        // On the master's machine: over loopback, or to its own address.
        assert_eq!(loopback_from_afar(sock("127.0.0.1:1"), Some(sock("127.0.0.1:2")), &addrs("127.0.0.1")), None);
        assert_eq!(loopback_from_afar(sock("10.77.0.1:1"), Some(sock("10.77.0.1:2")), &addrs("127.0.0.1")), None);
        // From afar, reachable.
        assert_eq!(loopback_from_afar(sock("10.77.0.2:1"), Some(sock("10.77.0.1:2")), &addrs("10.77.0.2")), None);
        assert_eq!(loopback_from_afar(sock("10.77.0.2:1"), Some(sock("10.77.0.1:2")), &addrs("node2.example")), None);
        // The master's end unknown: not judged.
        assert_eq!(loopback_from_afar(sock("10.77.0.2:1"), None, &addrs("127.0.0.1")), None);
    }
}
