//! What the benchmarks read of a process from `/proc/PID`: its CPU time (`stat`) and its memory
//! (`status`).
//!
//! CPU time: on this project's 2-core machines the nodes, the client and the host share the
//! CPUs, and a latency tail follows how busy they are; the CPU a phase costs moves much less with
//! the host's noise than a p99 does, so a change to the insert path can be weighed by it
//! (`shardwise bench insert` prints CPU milliseconds per insert per node). Memory: resident and
//! peak sizes for `shardwise bench memory` and the idle-node figure of `shardwise bench`.

/// User plus system CPU time of a process so far, in seconds; `None` where `/proc` does not
/// have it (not Linux, or the process is gone).
pub fn cpu_seconds(pid: u32) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let ticks = utime_plus_stime_ticks(&stat)?;
    // SAFETY: sysconf reads a configuration value and has no preconditions.
    let per_second = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    (per_second > 0).then(|| ticks as f64 / per_second as f64)
}

/// A `kB` field of `/proc/PID/status` (`VmRSS:`, `VmHWM:`, ...), in KiB.
pub fn status_kib(pid: u32, field: &str) -> anyhow::Result<u64> {
    use anyhow::Context;
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .with_context(|| format!("cannot read /proc/{pid}/status"))?;
    status_field_kib(&status, field).with_context(|| format!("no {field} in /proc/{pid}/status"))
}

use shardwise_query::resident_memory::status_field_kib;

/// Fields 14 and 15 (utime, stime) of a `/proc/PID/stat` line. The command name (field 2) is in
/// parentheses and may hold spaces or parentheses itself, so fields are counted after its last `)`.
fn utime_plus_stime_ticks(stat: &str) -> Option<u64> {
    let after_name = &stat[stat.rfind(')')? + 1..];
    // After the name: field 3 (state) is the first, so utime (14) and stime (15) are the 12th
    // and 13th.
    let mut fields = after_name.split_whitespace().skip(11);
    let utime: u64 = fields.next()?.parse().ok()?;
    let stime: u64 = fields.next()?.parse().ok()?;
    Some(utime + stime)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn utime_and_stime_are_read_after_the_name() {
        let line = "4242 (tokio (rt) x) S 1 4242 4242 0 -1 4194560 1000 0 0 0 250 75 0 0 20 0 9 0 100 1 1";
        assert_eq!(utime_plus_stime_ticks(line), Some(325));
        assert_eq!(utime_plus_stime_ticks("4242 (x) S 1 2"), None);
        assert_eq!(utime_plus_stime_ticks("no name here"), None);
    }

    #[test]
    fn this_process_has_a_resident_size() {
        assert!(status_kib(std::process::id(), "VmRSS:").is_ok_and(|kib| kib > 0));
        assert!(status_kib(std::process::id(), "NoSuchField:").is_err());
    }

    #[test]
    fn this_process_has_used_some_cpu() {
        let me = std::process::id();
        let spin = (0..2_000_000u64).fold(0u64, |a, b| a.wrapping_add(b * b));
        assert!(spin > 0);
        assert!(cpu_seconds(me).is_some_and(|s| s >= 0.0));
        assert_eq!(cpu_seconds(u32::MAX), None);
    }
}
