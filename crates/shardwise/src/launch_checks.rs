//! What `shardwise launch` refuses before it starts a node: settings that would give every node
//! the same value where each needs its own (rank, data dir, a fixed port) or contradict the
//! secret the launcher hands out, from any place a node reads them (flags after `--`, the
//! `--config` file, inherited `SHARDWISE_*` variables).
//!
//! Why: the launcher gives each node its identity through torchrun's variables, which rank below
//! a config file and flags. A config file shared by all nodes that set `rank = 0` made three
//! one-node clusters (and recorded them in the data dirs); two nodes given one `--data-port`
//! both joined, and one died once the cluster had formed.

use std::path::PathBuf;

use anyhow::{Context, bail};

/// Node settings the launcher sets for each node itself: flag, config key.
const LAUNCHER_OWNED: [(&str, &str); 7] = [
    ("--rank", "rank"),
    ("--world-size", "world_size"),
    ("--master-addr", "master_addr"),
    ("--master-port", "master_port"),
    ("--data-dir", "data_dir"),
    ("--local-rank", "local_rank"),
    ("--local-world-size", "local_world_size"),
];

/// Node settings about the cluster secret, which the launcher hands out.
const SECRET_OWNED: [(&str, &str); 2] = [("--insecure", "insecure"), ("--secret-file", "secret_file")];

/// Fixed ports: one machine's nodes cannot share them. Flag, config key, variable.
const PORTS: [(&str, &str, &str); 4] = [
    ("--flight-port", "flight_port", "SHARDWISE_FLIGHT_PORT"),
    ("--data-port", "data_port", "SHARDWISE_DATA_PORT"),
    ("--http-port", "http_port", "SHARDWISE_HTTP_PORT"),
    ("--pg-port", "pg_port", "SHARDWISE_PG_PORT"),
];

/// Inherited variables that would give every node the same identity (the launcher sets
/// `SHARDWISE_DATA_DIR` for each node itself, over an inherited one).
const OWNED_VARS: [&str; 1] = ["SHARDWISE_REPLACE_NODE"];

/// Variables about the secret that the launcher sets for its nodes itself (so an inherited one
/// never contradicts it); removed from each node's environment.
pub const SECRET_VARS: [&str; 2] = ["SHARDWISE_INSECURE", "SHARDWISE_SECRET_FILE"];

/// Refuses node arguments, a node config file or inherited variables the launcher cannot pass
/// on to `nproc` nodes, saying where each came from; `env` reads a variable. `--insecure` after
/// `--` is let through when the launcher runs insecure too (`launcher_insecure`).
pub fn check_node_settings(
    node_args: &[String],
    nproc: u32,
    launcher_insecure: bool,
    env: &dyn Fn(&str) -> Option<String>,
) -> anyhow::Result<()> {
    let name_of = |arg: &str| arg.split('=').next().unwrap_or(arg).to_string();
    let flags: Vec<String> = node_args.iter().filter(|a| a.starts_with("--")).map(|a| name_of(a)).collect();
    let has = |flag: &str| flags.iter().any(|f| f == flag);
    if let Some((flag, _)) =
        SECRET_OWNED.iter().find(|(flag, _)| has(flag) && !(launcher_insecure && *flag == "--insecure"))
    {
        bail!(
            "{flag} is given after --: the launcher gives the nodes their cluster secret; give {flag} to the \
             launcher instead (shardwise launch {flag} ...)"
        );
    }
    if let Some((flag, _)) = LAUNCHER_OWNED.iter().find(|(flag, _)| has(flag)) {
        bail!(
            "{flag} is given after --: the launcher sets each node's rank, world size, master and data dir itself \
             (--nproc, --master-port, --data-dir); every node would get the same {flag}"
        );
    }
    if has("--replace-node") {
        bail!(
            "--replace-node is given after --: every node would take it; start the one node that replaces a lost \
             data dir by hand (shardwise node --replace-node ID, with the rank's variables)"
        );
    }
    if nproc > 1
        && let Some((flag, _, _)) = PORTS.iter().find(|(flag, _, _)| has(flag))
    {
        bail!(
            "{flag} is given after --: the {nproc} nodes run on this machine and cannot share one port; leave it out (each node takes a free one)"
        );
    }
    if let Some(var) = OWNED_VARS.iter().find(|v| env(v).is_some()) {
        bail!(
            "{var} is set in the environment: every node would take it; the launcher sets each node's own (unset it)"
        );
    }
    if nproc > 1
        && let Some((_, _, var)) = PORTS.iter().find(|(_, _, var)| env(var).is_some())
    {
        bail!(
            "{var} is set in the environment: the {nproc} nodes run on this machine and cannot share one port; unset it"
        );
    }
    let (path, origin) = match config_path(node_args) {
        Some(path) => (path, "--config after --".to_string()),
        None => match env("SHARDWISE_CONFIG") {
            Some(path) => (PathBuf::from(path), "SHARDWISE_CONFIG".to_string()),
            None => return Ok(()),
        },
    };
    let text = std::fs::read_to_string(&path)
        .with_context(|| format!("cannot read the node config file {} ({origin})", path.display()))?;
    let table: toml::Table =
        toml::from_str(&text).with_context(|| format!("invalid node config file {} ({origin})", path.display()))?;
    let mut refused: Vec<&str> = LAUNCHER_OWNED.iter().chain(SECRET_OWNED.iter()).map(|(_, key)| *key).collect();
    // `insecure = true` agrees with an insecure launcher, as `-- --insecure` does.
    if launcher_insecure && table.get("insecure").and_then(toml::Value::as_bool) == Some(true) {
        refused.retain(|key| *key != "insecure");
    }
    if nproc > 1 {
        refused.extend(PORTS.iter().map(|(_, key, _)| *key));
    }
    let found: Vec<&str> = refused.into_iter().filter(|key| table.contains_key(*key)).collect();
    if !found.is_empty() {
        bail!(
            "the node config file {} ({origin}) sets {}: the launcher sets each node's rank, world size, master, data \
             dir and cluster secret itself, and its nodes take free ports; every node would take the file's value \
             instead. Remove them from the file (give the launcher --nproc, --master-port, --data-dir, \
             --secret-file or --insecure)",
            path.display(),
            found.join(", ")
        );
    }
    Ok(())
}

/// The `--config` file among node arguments (`--config FILE` or `--config=FILE`).
fn config_path(node_args: &[String]) -> Option<PathBuf> {
    let mut args = node_args.iter();
    while let Some(arg) = args.next() {
        if arg == "--config" {
            return args.next().map(PathBuf::from);
        }
        if let Some(path) = arg.strip_prefix("--config=") {
            return Some(PathBuf::from(path));
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(list: &[&str]) -> Vec<String> {
        list.iter().map(|s| s.to_string()).collect()
    }

    fn no_env(_: &str) -> Option<String> {
        None
    }

    #[test]
    fn flags_after_the_double_dash_that_each_node_needs_its_own_are_refused() {
        let e = check_node_settings(&args(&["--rank=1"]), 3, false, &no_env).unwrap_err().to_string();
        assert!(e.contains("--rank is given after --"), "{e}");
        let e = check_node_settings(&args(&["--secret-file", "s"]), 3, false, &no_env).unwrap_err().to_string();
        assert!(e.contains("cluster secret"), "{e}");
        let e = check_node_settings(&args(&["--data-port", "7000"]), 3, false, &no_env).unwrap_err().to_string();
        assert!(e.contains("--data-port") && e.contains("cannot share one port"), "{e}");
        // --insecure passes on to nodes of an insecure launcher.
        check_node_settings(&args(&["--insecure"]), 3, true, &no_env).unwrap();
        assert!(check_node_settings(&args(&["--insecure"]), 3, false, &no_env).is_err());
        assert!(check_node_settings(&args(&["--replace-node", "x"]), 3, false, &no_env).is_err());
        // One node may have its port; other flags pass.
        check_node_settings(&args(&["--data-port", "7000", "--join-timeout-ms", "100"]), 1, false, &no_env).unwrap();
    }

    #[test]
    fn inherited_variables_that_would_give_every_node_one_value_are_refused() {
        let env = |k: &str| (k == "SHARDWISE_PG_PORT").then(|| "5433".to_string());
        let e = check_node_settings(&[], 2, false, &env).unwrap_err().to_string();
        assert!(e.contains("SHARDWISE_PG_PORT"), "{e}");
        let env = |k: &str| (k == "SHARDWISE_REPLACE_NODE").then(|| "x".to_string());
        assert!(check_node_settings(&[], 2, false, &env).unwrap_err().to_string().contains("SHARDWISE_REPLACE_NODE"));
    }

    #[test]
    fn a_node_config_file_that_sets_a_nodes_identity_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let bad = dir.path().join("bad.toml");
        std::fs::write(&bad, "rank = 0\nworld_size = 1\njoin_timeout_ms = 5\n").unwrap();
        let e = check_node_settings(&args(&["--config", bad.to_str().unwrap()]), 3, false, &no_env)
            .unwrap_err()
            .to_string();
        assert!(e.contains("sets rank, world_size") && e.contains("--config after --"), "{e}");
        let path = bad.to_str().unwrap().to_string();
        let env = move |k: &str| (k == "SHARDWISE_CONFIG").then(|| path.clone());
        let e = check_node_settings(&[], 3, false, &env).unwrap_err().to_string();
        assert!(e.contains("SHARDWISE_CONFIG"), "{e}");
        let ports = dir.path().join("ports.toml");
        std::fs::write(&ports, "pg_port = 5433\n").unwrap();
        let with_ports = args(&[&format!("--config={}", ports.display())]);
        assert!(check_node_settings(&with_ports, 2, false, &no_env).unwrap_err().to_string().contains("pg_port"));
        check_node_settings(&with_ports, 1, false, &no_env).unwrap();
        let insecure = dir.path().join("insecure.toml");
        std::fs::write(&insecure, "insecure = true\n").unwrap();
        let with_insecure = args(&["--config", insecure.to_str().unwrap()]);
        check_node_settings(&with_insecure, 3, true, &no_env).unwrap();
        assert!(check_node_settings(&with_insecure, 3, false, &no_env).is_err());
        let good = dir.path().join("good.toml");
        std::fs::write(&good, "join_timeout_ms = 5000\nlog = \"info\"\n").unwrap();
        check_node_settings(&args(&["--config", good.to_str().unwrap()]), 3, false, &no_env).unwrap();
    }
}
