//! Which address a node listens on and tells the others to reach it at, when the user gives
//! neither `--listen-host` nor `--advertise-host`.
//!
//! Why: a node that listens on 127.0.0.1 (the default on one machine) and says so to a master
//! on another machine forms a cluster whose every cross-machine read and write fails (the
//! others connect to their own loopback). torchrun and Slurm jobs start nodes on several
//! machines with nothing but the master's address, so the default follows it: when the master's
//! address is not a loopback one, a node listens on the address its route to the master leaves
//! from (the interface the other machines reach it through, asked of the kernel with an
//! unconnected UDP socket: no packet is sent), and advertises that. On one machine (a loopback
//! master, a single node) it stays 127.0.0.1.
//!
//! Also the two checks of a node's addresses against the others': a port that is the master's
//! on the master's machine is refused at start, and a member whose advertised name does not
//! resolve here is said once the node has joined.

use std::net::{IpAddr, SocketAddr, ToSocketAddrs, UdpSocket};

use shardwise_cluster::reachable::own_name_on_loopback;
use shardwise_server::Ports;

/// Hosts chosen for a node whose master is on another machine (or may be).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RoutedHosts {
    /// What it listens on (an address, IPv6 without brackets).
    pub listen: String,
    /// What it tells the others (IPv6 in brackets, as in `host:port`).
    pub advertise: String,
    /// Said in the log.
    pub why: String,
}

/// The hosts a node listens on and advertises when none is given: `None` to keep the loopback
/// default (one node, a loopback master, or a master address that does not resolve, which the
/// rendezvous then reports).
///
/// A job across machines whose master address is this machine's own name, mapped to loopback
/// here (`reachable::own_name_on_loopback`: the head node under Debian's `/etc/hosts`): the node
/// listens on every address and advertises that name, which the others resolve to this machine.
pub fn routed_hosts(
    world_size: u32,
    local_world_size: Option<u32>,
    master_addr: &str,
    master_port: u16,
) -> Option<RoutedHosts> {
    if world_size < 2 {
        return None;
    }
    let addrs = (master_addr, master_port).to_socket_addrs().ok()?;
    for master in addrs {
        if own_name_on_loopback(master_addr, master.ip(), world_size, local_world_size) {
            let every = match master.ip() {
                IpAddr::V4(_) => "0.0.0.0",
                IpAddr::V6(_) => "::",
            };
            let why = format!(
                "listening on every address ({every}) and advertising {master_addr}: the master's address is this \
                 machine's name, which resolves here to {}, a loopback address (as /etc/hosts maps it), while the \
                 job spans machines; the others resolve the name to this machine (give --listen-host and \
                 --advertise-host to choose)",
                master.ip()
            );
            return Some(RoutedHosts { listen: every.to_string(), advertise: master_addr.to_string(), why });
        }
        if master.ip().is_loopback() {
            return None;
        }
        if let Some(ip) = route_source(master) {
            let why = format!(
                "listening on {ip}, the address this machine reaches the master at {master_addr} from (no \
                 --listen-host given, and the master is not on a loopback address)"
            );
            return Some(RoutedHosts { listen: ip.to_string(), advertise: host_text(ip), why });
        }
    }
    None
}

/// How long resolving one member's advertised host may take before it counts as unresolvable.
const MEMBER_RESOLVE_TIMEOUT_MS: u64 = 3_000;

/// Says, as an error, each member whose advertised host name does not resolve on this machine:
/// every read and write this node sends there would fail (a node on the master's machine
/// advertises the master's name when that name maps to loopback there, and a machine given the
/// master by address may not know the name). The node serves all the same: the rest of the
/// cluster works, and a resolver may recover. The members are resolved at once, each bounded by
/// [`MEMBER_RESOLVE_TIMEOUT_MS`].
pub async fn warn_of_unresolvable_members(node: &shardwise_cluster::Node) {
    let members = node.view().members().await;
    let named = members.iter().filter(|m| m.rank != node.rank).filter_map(|member| {
        // A member's services share its advertised host: its first named one is enough.
        member
            .addrs
            .iter()
            .find(|(_, addr)| {
                let host = addr.rsplit_once(':').map_or(addr.as_str(), |(host, _)| host);
                host.trim_start_matches('[').trim_end_matches(']').parse::<IpAddr>().is_err()
            })
            .map(|(service, addr)| (member.rank, service, addr))
    });
    let lookups = named.map(|(rank, service, addr)| async move {
        let timeout = std::time::Duration::from_millis(MEMBER_RESOLVE_TIMEOUT_MS);
        let resolved = tokio::time::timeout(timeout, tokio::net::lookup_host(addr.as_str())).await;
        let found = resolved.is_ok_and(|lookup| lookup.is_ok_and(|mut addrs| addrs.next().is_some()));
        (rank, service, addr, found)
    });
    for (rank, service, addr, found) in futures::future::join_all(lookups).await {
        if !found {
            tracing::error!(
                rank,
                "rank {rank} advertises {service} at {addr}, whose host does not resolve on this machine: what this \
                 node sends there will fail. Give every node the same MASTER_ADDR, or that node an --advertise-host \
                 this machine resolves"
            );
        }
    }
}

/// Refuses a node port given as the master's port on the master's machine: on rank 0 the
/// rendezvous could not bind it (and said another job held it), and a worker joined its own
/// port, waiting out the join timeout.
pub fn check_ports_apart_from_master(detected: &shardwise_cluster::Detected, ports: Ports) -> anyhow::Result<()> {
    if detected.world_size < 2 {
        return Ok(());
    }
    let given = [
        ("--flight-port", "flight_port", ports.flight),
        ("--data-port", "data_port", ports.data),
        ("--http-port", "http_port", ports.http),
        ("--pg-port", "pg_port", ports.pg),
    ];
    let Some((flag, key, port)) = given.into_iter().find(|(_, _, p)| *p != 0 && *p == detected.master_port) else {
        return Ok(());
    };
    // The master's address is one of this machine's when a socket binds to it (whatever the
    // listen host: a wildcard one covers it too).
    let here = detected.rank == 0
        || shardwise_cluster::node::resolve(&detected.master_addr, port)
            .is_ok_and(|master| master.ip().is_loopback() || UdpSocket::bind((master.ip(), 0)).is_ok());
    if !here {
        return Ok(());
    }
    let whose = match detected.rank {
        0 => "this node, the master, listens there for the others to join",
        _ => "this node would be joining its own port",
    };
    anyhow::bail!(
        "{flag} {port} ({key} in a config file) is also the master's port (MASTER_PORT, master {}:{}): {whose}; give \
         the node another port, or the cluster another MASTER_PORT",
        detected.master_addr,
        detected.master_port
    )
}

/// The local address the kernel would send from to reach `to`, if it has a route.
fn route_source(to: SocketAddr) -> Option<IpAddr> {
    let any: SocketAddr = match to {
        SocketAddr::V4(_) => (IpAddr::from([0u8; 4]), 0).into(),
        SocketAddr::V6(_) => (IpAddr::from([0u16; 8]), 0).into(),
    };
    let socket = UdpSocket::bind(any).ok()?;
    socket.connect(to).ok()?;
    let ip = socket.local_addr().ok()?.ip();
    (!ip.is_unspecified()).then_some(ip)
}

/// An address as a host in `host:port` text (IPv6 in brackets).
fn host_text(ip: IpAddr) -> String {
    match ip {
        IpAddr::V4(v4) => v4.to_string(),
        IpAddr::V6(v6) => format!("[{v6}]"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_machine_keeps_the_loopback_default() {
        assert_eq!(routed_hosts(3, None, "127.0.0.1", 29500), None);
        assert_eq!(routed_hosts(3, None, "localhost", 29500), None);
        assert_eq!(routed_hosts(1, None, "198.51.100.1", 29500), None);
        // Unresolvable: left to the rendezvous to report.
        assert_eq!(routed_hosts(3, None, "no-such-host.invalid", 29500), None);
    }

    #[test]
    fn a_master_elsewhere_makes_the_node_listen_where_its_route_leaves_from() {
        // Whatever interface this machine reaches a non-loopback address through, if it has one
        // (a sandbox without a route keeps the loopback default).
        if let Some(hosts) = routed_hosts(3, None, "198.51.100.1", 29500) {
            let ip: IpAddr = hosts.listen.parse().expect("an address");
            assert!(!ip.is_loopback() && !ip.is_unspecified(), "{hosts:?}");
            assert_eq!(hosts.advertise, host_text(ip));
            assert!(hosts.why.contains(&hosts.listen) && hosts.why.contains("198.51.100.1"), "{}", hosts.why);
        }
    }

    #[test]
    fn a_master_name_on_loopback_here_in_a_job_across_machines_listens_everywhere() {
        // `localhost` is excluded by name; any other name this machine maps to loopback will do,
        // if it has one (`/etc/hosts`' ip6-localhost is excluded too, so this looks for the
        // machine's own name).
        let Ok(name) = std::fs::read_to_string("/etc/hostname") else { return };
        let name = name.trim();
        let loopback = (name, 1).to_socket_addrs().is_ok_and(|mut a| a.next().is_some_and(|a| a.ip().is_loopback()));
        if name.is_empty() || !loopback || name.eq_ignore_ascii_case("localhost") {
            return;
        }
        let hosts = routed_hosts(3, Some(1), name, 29500).expect("routed");
        assert!(hosts.listen == "0.0.0.0" || hosts.listen == "::", "{hosts:?}");
        assert_eq!(hosts.advertise, name);
        assert!(hosts.why.contains("spans machines"), "{}", hosts.why);
        // Every rank on this machine: the loopback default.
        assert_eq!(routed_hosts(3, Some(3), name, 29500), None);
    }

    #[test]
    fn ipv6_hosts_are_bracketed() {
        assert_eq!(host_text("fe80::1".parse().expect("ip")), "[fe80::1]");
        assert_eq!(host_text("10.0.0.1".parse().expect("ip")), "10.0.0.1");
    }
}
