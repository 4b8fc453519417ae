//! Timing settings of cluster membership, each with its unit in the name and a check that the
//! combination makes sense (a node is not declared down before it could have sent a heartbeat).

use std::time::Duration;

use crate::error::{ClusterError, Result};

/// Timeouts and intervals of joining and of liveness tracking.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Timeouts {
    /// One TCP connect attempt to the master.
    pub connect_timeout_ms: u64,
    /// From the start of init until every rank has joined and passed the barrier.
    pub join_timeout_ms: u64,
    /// One request/response exchange with a peer (handshake step, membership query).
    pub op_timeout_ms: u64,
    /// How often a node sends a heartbeat to the master.
    pub heartbeat_interval_ms: u64,
    /// Silence after which the master marks a node `suspect`.
    pub suspect_after_ms: u64,
    /// Silence after which the master marks a node `down`.
    pub down_after_ms: u64,
    /// How often the master prints `waiting for k of n ranks` while the cluster forms.
    pub progress_interval_ms: u64,
    /// From proposing a metadata change until the master's answer (including waiting for a
    /// lost master to come back).
    pub propose_timeout_ms: u64,
    /// How long the master waits for every connected node to confirm a new metadata version
    /// before it answers the change anyway (less than `propose_timeout_ms`).
    pub metadata_applied_timeout_ms: u64,
}

impl Default for Timeouts {
    fn default() -> Self {
        Timeouts {
            connect_timeout_ms: 5_000,
            join_timeout_ms: 120_000,
            op_timeout_ms: 10_000,
            heartbeat_interval_ms: 500,
            suspect_after_ms: 2_000,
            down_after_ms: 6_000,
            progress_interval_ms: 2_000,
            propose_timeout_ms: 10_000,
            metadata_applied_timeout_ms: 5_000,
        }
    }
}

impl Timeouts {
    /// Checks every value is positive and that `heartbeat < suspect < down`.
    pub fn validate(&self) -> Result<()> {
        let named = [
            ("connect_timeout_ms", self.connect_timeout_ms),
            ("join_timeout_ms", self.join_timeout_ms),
            ("op_timeout_ms", self.op_timeout_ms),
            ("heartbeat_interval_ms", self.heartbeat_interval_ms),
            ("suspect_after_ms", self.suspect_after_ms),
            ("down_after_ms", self.down_after_ms),
            ("progress_interval_ms", self.progress_interval_ms),
            ("propose_timeout_ms", self.propose_timeout_ms),
            ("metadata_applied_timeout_ms", self.metadata_applied_timeout_ms),
        ];
        for (name, value) in named {
            if value == 0 {
                return Err(invalid(name, value, "it must be a positive number of milliseconds"));
            }
        }
        if self.suspect_after_ms <= self.heartbeat_interval_ms {
            return Err(invalid(
                "suspect_after_ms",
                self.suspect_after_ms,
                &format!(
                    "it must be more than heartbeat_interval_ms ({}; --suspect-after-ms, --heartbeat-interval-ms)",
                    self.heartbeat_interval_ms
                ),
            ));
        }
        if self.down_after_ms <= self.suspect_after_ms {
            return Err(invalid(
                "down_after_ms",
                self.down_after_ms,
                &format!(
                    "it must be more than suspect_after_ms ({}; --down-after-ms, --suspect-after-ms)",
                    self.suspect_after_ms
                ),
            ));
        }
        Ok(())
    }

    pub fn connect_timeout(&self) -> Duration {
        Duration::from_millis(self.connect_timeout_ms)
    }
    pub fn join_timeout(&self) -> Duration {
        Duration::from_millis(self.join_timeout_ms)
    }
    pub fn op_timeout(&self) -> Duration {
        Duration::from_millis(self.op_timeout_ms)
    }
    pub fn heartbeat_interval(&self) -> Duration {
        Duration::from_millis(self.heartbeat_interval_ms)
    }
    pub fn propose_timeout(&self) -> Duration {
        Duration::from_millis(self.propose_timeout_ms)
    }
}

fn invalid(name: &str, value: u64, expected: &str) -> ClusterError {
    ClusterError::InvalidSetting { name: name.to_string(), value: value.to_string(), expected: expected.to_string() }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_valid() {
        Timeouts::default().validate().unwrap();
    }

    #[test]
    fn down_must_exceed_suspect() {
        let t = Timeouts { suspect_after_ms: 3000, down_after_ms: 3000, ..Timeouts::default() };
        let err = t.validate().unwrap_err().to_string();
        assert!(
            err.contains("down_after_ms=3000") && err.contains("must be more than suspect_after_ms (3000;"),
            "{err}"
        );
        assert!(err.contains("--down-after-ms"), "{err}");
    }

    #[test]
    fn zero_is_refused() {
        let t = Timeouts { join_timeout_ms: 0, ..Timeouts::default() };
        assert!(t.validate().unwrap_err().to_string().contains("join_timeout_ms=0"));
        let t = Timeouts { propose_timeout_ms: 0, ..Timeouts::default() };
        assert!(t.validate().unwrap_err().to_string().contains("propose_timeout_ms=0"));
    }
}
