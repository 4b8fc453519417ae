//! CPU time stolen by the hypervisor during a benchmark, from `/proc/stat`.
//!
//! On a virtual machine whose host is busy, the guest's CPUs stall for stretches it does not
//! control (the `steal` column); timings taken then are slower and their tails longer for reasons
//! outside the program. Every `shardwise bench` prints the share of CPU time stolen while it ran,
//! so a figure can be read with it (and a run at 50 % steal retaken).

/// The `cpu` line of `/proc/stat`: all jiffies, and the stolen ones.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CpuTimes {
    total: u64,
    steal: u64,
}

impl CpuTimes {
    /// Now, or `None` where `/proc/stat` is missing or unreadable (not Linux).
    pub fn now() -> Option<Self> {
        parse(&std::fs::read_to_string("/proc/stat").ok()?)
    }

    /// Percent of CPU time stolen between `earlier` and `self`.
    pub fn steal_percent_since(&self, earlier: &CpuTimes) -> Option<f64> {
        let total = self.total.checked_sub(earlier.total)?;
        let steal = self.steal.checked_sub(earlier.steal)?;
        (total > 0).then(|| steal as f64 * 100.0 / total as f64)
    }
}

/// Reads the aggregate `cpu` line: user nice system idle iowait irq softirq steal [guest ..].
/// Guest time is already counted in user and nice, so it is left out of the total.
fn parse(stat: &str) -> Option<CpuTimes> {
    let line = stat.lines().find(|l| l.starts_with("cpu "))?;
    let fields: Vec<u64> = line.split_whitespace().skip(1).take(8).map(|f| f.parse().ok()).collect::<Option<_>>()?;
    (fields.len() == 8).then(|| CpuTimes { total: fields.iter().sum(), steal: fields[7] })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn steal_share_between_two_readings() {
        let a = parse("cpu  100 0 50 800 10 0 0 40 0 0\ncpu0 1 2 3\n").expect("cpu line");
        let b = parse("cpu  200 0 100 1540 20 0 0 140 7 0\n").expect("cpu line");
        assert_eq!(a, CpuTimes { total: 1000, steal: 40 });
        assert_eq!(b.steal_percent_since(&a), Some(10.0));
        assert_eq!(a.steal_percent_since(&b), None);
        assert_eq!(a.steal_percent_since(&a), None);
        assert_eq!(parse("cpu 1 2 3\n"), None);
        assert_eq!(parse("intr 5\n"), None);
    }
}
