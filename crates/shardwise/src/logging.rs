//! Log setup: human-readable lines on stderr. The master logs at `info`, other ranks at `warn`
//! (the seed's "only the master prints", done as a filter so `--log` can open it up again).

use tracing_subscriber::EnvFilter;

/// Installs the global subscriber. `directive` (from `--log`, `SHARDWISE_LOG` or `RUST_LOG`)
/// wins over the rank's default.
pub fn init(rank: u32, directive: Option<&str>) -> anyhow::Result<()> {
    let default = if rank == 0 { "info" } else { "warn" };
    let filter = match directive {
        Some(d) => EnvFilter::try_new(d).map_err(|e| anyhow::anyhow!("invalid log filter {d:?}: {e}"))?,
        None => EnvFilter::new(default),
    };
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_target(false)
        .try_init()
        .map_err(|e| anyhow::anyhow!("cannot install the logger: {e}"))
}
