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
    if !is_afar(peer, local) {
        return None;
    }
    let first = addrs.iter().find(|(_, addr)| is_loopback_host(addr)).map(|(name, addr)| format!("{name} {addr}"))?;
    // The first one is enough to say (a refusal is cut at 500 characters).
    Some(format!(
        "this node connected from {}, another machine than the master's, but advertises loopback addresses ({} \
         ...), which the other machines cannot reach: set --listen-host (or --advertise-host) to an address of \
         its machine they can reach, or leave both out (the node then listens where its route to the master \
         leaves from)",
        peer.ip(),
        first
    ))
}

/// Whether a node that connected from `peer` to the master's `local` end is on another machine
/// than the master's (on the same machine, connections to its own address come from that
/// address; an unknown end is not judged).
pub fn is_afar(peer: SocketAddr, local: Option<SocketAddr>) -> bool {
    local.is_some_and(|local| peer.ip() != local.ip() && !peer.ip().is_loopback())
}

/// Whether any of `addrs` is on a loopback host.
pub fn advertises_loopback(addrs: &BTreeMap<String, String>) -> bool {
    addrs.values().any(|addr| is_loopback_host(addr))
}

/// Why a node cannot join a membership that spans machines, if so: it is on another machine
/// and some members advertise loopback addresses (`afar`: the members that are, `members`:
/// rank and addresses of each member but the joining rank), or it advertises loopback ones
/// itself, from the master's machine, while some members are on others.
pub fn mixed_membership(
    rank: u32,
    afar: bool,
    addrs: &BTreeMap<String, String>,
    members: &[(u32, &BTreeMap<String, String>)],
    members_afar: &[u32],
) -> Option<String> {
    let fix = "start it with --listen-host set to an address of its machine the others reach, or without it (a \
               node then listens where its route to the master leaves from; rank 0 needs MASTER_ADDR to be such an \
               address, or its machine's name with a local world size below the world size: docs/cluster.md)";
    if afar {
        let (lb_rank, lb_addr) = members
            .iter()
            .filter(|(r, _)| *r != rank)
            .find_map(|(r, a)| a.values().find(|addr| is_loopback_host(addr)).map(|addr| (*r, addr.clone())))?;
        return Some(format!(
            "this node is on another machine than the master's, and rank {lb_rank} advertises a loopback address \
             ({lb_addr}) that it cannot reach: {fix}"
        ));
    }
    let remote = members_afar.iter().find(|r| **r != rank)?;
    advertises_loopback(addrs).then(|| {
        format!(
            "this node advertises loopback addresses, and rank {remote} is on another machine, which cannot reach \
             them: {fix}"
        )
    })
}

/// Whether the master's address, `master_addr`, is a host name that resolved to the loopback
/// address `resolved` on this machine while the job spans machines (fewer ranks run here,
/// `local_world_size`, than in all): this machine's own name, mapped to loopback by its
/// `/etc/hosts` (Debian's installer writes `127.0.1.1 <hostname>`). The other machines resolve
/// the name to this machine's network address, so whatever listens here must listen there too:
/// the rendezvous and every node here listen on every address (as torch's TCPStore does), and
/// the nodes here advertise the name. A literal address, or `localhost`, means one machine.
pub fn own_name_on_loopback(
    master_addr: &str,
    resolved: IpAddr,
    world_size: u32,
    local_world_size: Option<u32>,
) -> bool {
    let name = master_addr.trim_end_matches('.').to_ascii_lowercase();
    // Debian's and Red Hat's /etc/hosts names for loopback, besides `localhost`.
    let localhost = [
        "localhost",
        "localhost.localdomain",
        "ip6-localhost",
        "ip6-loopback",
        "localhost4",
        "localhost4.localdomain4",
        "localhost6",
        "localhost6.localdomain6",
    ]
    .contains(&name.as_str())
        || name.ends_with(".localhost");
    resolved.is_loopback()
        && master_addr.parse::<IpAddr>().is_err()
        && !localhost
        && local_world_size.is_some_and(|local| local < world_size)
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
    fn a_membership_that_spans_machines_refuses_loopback_members_either_way() {
        let (lo, far) = (addrs("127.0.0.1"), addrs("10.9.0.2"));
        // The master itself on loopback, a node from afar joining: refused, naming rank 0.
        let why = mixed_membership(1, true, &far, &[(0, &lo)], &[]).expect("refused");
        assert!(why.contains("rank 0 advertises a loopback address (127.0.0.1:"), "{why}");
        // Whole within the 500 characters a refusal carries.
        let why = mixed_membership(1, false, &lo, &[(0, &far), (2, &far)], &[2]).expect("refused");
        assert!(why.chars().count() < 500 && why.ends_with("docs/cluster.md)"), "{}", why.chars().count());
        let why = mixed_membership(1, true, &far, &[(0, &addrs("[::1]")), (2, &addrs("127.100.200.201"))], &[])
            .expect("refused");
        assert!(why.chars().count() < 500, "{}", why.chars().count());
        // A node on the master's machine on loopback, with a member on another machine.
        let why = mixed_membership(1, false, &lo, &[(0, &addrs("10.9.0.1")), (2, &far)], &[2]).expect("refused");
        assert!(why.contains("rank 2 is on another machine"), "{why}");
        // One machine, all on loopback; or every member reachable: admitted.
        assert_eq!(mixed_membership(1, false, &lo, &[(0, &lo)], &[]), None);
        assert_eq!(mixed_membership(2, true, &far, &[(0, &addrs("10.9.0.1")), (1, &far)], &[1]), None);
        // The joining rank's own earlier entry does not count against it.
        assert_eq!(mixed_membership(1, true, &far, &[(1, &lo)], &[]), None);
        assert!(
            is_afar(sock("10.9.0.2:1"), Some(sock("10.9.0.1:2")))
                && !is_afar(sock("10.9.0.1:1"), Some(sock("10.9.0.1:2")))
        );
    }

    #[test]
    fn a_job_across_machines_whose_master_name_maps_to_loopback_here_is_told_apart() {
        let debian: IpAddr = "127.0.1.1".parse().expect("ip");
        // Slurm's head node by its own name, one task on each of 3 machines.
        assert!(own_name_on_loopback("headnode", debian, 3, Some(1)));
        assert!(own_name_on_loopback("headnode.cluster.example", "127.0.0.1".parse().expect("ip"), 8, Some(4)));
        // One machine: every rank here, or nothing says how many are.
        assert!(!own_name_on_loopback("headnode", debian, 3, Some(3)));
        assert!(!own_name_on_loopback("headnode", debian, 3, None));
        // A loopback literal or localhost is a choice of one machine; a routable address is no case.
        assert!(!own_name_on_loopback("127.0.1.1", debian, 3, Some(1)));
        assert!(!own_name_on_loopback("localhost", "127.0.0.1".parse().expect("ip"), 3, Some(1)));
        assert!(!own_name_on_loopback("LOCALHOST.", "::1".parse().expect("ip"), 3, Some(1)));
        assert!(!own_name_on_loopback("localhost4", "127.0.0.1".parse().expect("ip"), 3, Some(1)));
        assert!(!own_name_on_loopback("localhost6.localdomain6", "::1".parse().expect("ip"), 3, Some(1)));
        assert!(!own_name_on_loopback("headnode", "10.0.0.1".parse().expect("ip"), 3, Some(1)));
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
