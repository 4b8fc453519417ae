//! Launch-environment detection: the first step of `init_distributed_mode`.
//!
//! A shardwise node can be started by hand (flags or the TOML config), by `torchrun`, by Slurm's
//! `srun`, by Open MPI's `mpirun`, or by an MPICH/Intel MPI (PMI) launcher. Each of these puts
//! rank, world size and so on in different places. The ML "anchors" (DETR, DeiT, MAE) look
//! for them with a few unchecked `if "RANK" in os.environ` tests and quietly fall back to
//! non-distributed mode. This module reads all of them in a fixed order and *validates* what it
//! finds, so a misconfigured launch fails at once with a message that names the variable at fault.
//!
//! Order (the first source that is present wins; every lower source that is also present is
//! named in a warning):
//!
//! 1. explicit values ([`Explicit`]: command-line flags merged over the config file);
//! 2. torchrun: `RANK`, `WORLD_SIZE`, `LOCAL_RANK`, `LOCAL_WORLD_SIZE`, `TORCHELASTIC_RUN_ID`;
//! 3. Slurm: `SLURM_PROCID`, `SLURM_NTASKS` (or `SLURM_NPROCS`), `SLURM_LOCALID`,
//!    `SLURM_STEP_TASKS_PER_NODE` (or `SLURM_TASKS_PER_NODE`, `SLURM_NTASKS_PER_NODE`, with
//!    `SLURM_NODEID` when the counts differ by node), `SLURM_STEP_NODELIST` (with `SLURM_STEP_NUM_NODES`), else
//!    `SLURM_JOB_NODELIST` (or `SLURM_NODELIST`, with `SLURM_JOB_NUM_NODES` or `SLURM_NNODES`),
//!    `SLURM_JOB_ID`;
//! 4. Open MPI: `OMPI_COMM_WORLD_{RANK,SIZE,LOCAL_RANK,LOCAL_SIZE}`;
//! 5. PMI (MPICH/Hydra, Intel MPI): `PMI_RANK`, `PMI_SIZE`, `MPI_LOCALRANKID`, `MPI_LOCALNRANKS`;
//! 6. nothing: a single process (rank 0 of 1) at `127.0.0.1:29500`.
//!
//! One exception: when Slurm wins and a complete Open MPI or PMI source disagrees with it on rank
//! or world size, the MPI source is used (with a warning), with Slurm's master rules: `mpirun`
//! inside an `sbatch` script passes the batch step's `SLURM_PROCID=0` to every process. Likewise
//! Slurm variables without a rank (an `salloc` shell's) beside a complete MPI source.
//!
//! A source is *present* when any of its rank / world-size variables is set. Rank and world
//! size must be given together (as Horovod and DINOv2 require): if the first present source has
//! only one of them, that is an error, not a silent fallback.
//!
//! Explicit `local_rank` / `local_world_size` override whatever the winning source says. This
//! is the legacy `torch.distributed.launch --local-rank=N` pattern, where the rank and world size
//! come from the environment but the local rank comes from a flag.
//!
//! The master address and port are chosen in this order, whatever the source: explicit
//! `master_addr` / `master_port`, then the `MASTER_ADDR` / `MASTER_PORT` variables (set by
//! torchrun, and honoured under Slurm and MPI too), then a source-specific fallback:
//!
//! * Slurm: the first host of the expanded `SLURM_STEP_NODELIST` (else `SLURM_JOB_NODELIST`), and port
//!   `15000 + (last four digits of SLURM_JOB_ID)`, which is PyTorch Lightning's rule
//!   (`SLURMEnvironment.resolve_root_node_address` / `main_port`). The port is a function of
//!   job-wide inputs, so every rank computes the same value without talking to the others. It can
//!   still collide with another job on the same node whose id has the same last four digits; set
//!   `MASTER_PORT` to avoid that.
//! * Open MPI and PMI set no master address. With more than one rank, one must be given.
//! * otherwise [`DEFAULT_MASTER_ADDR`] and [`DEFAULT_MASTER_PORT`].
//!
//! No DNS lookup happens here: the address is carried as written, and the caller resolves it.

use crate::hostlist::{self, HostlistError};
use serde::Serialize;
use thiserror::Error;

/// torch's default rendezvous port (`TORCH_DISTRIBUTED_DEFAULT_PORT`).
pub const DEFAULT_MASTER_PORT: u16 = 29500;
/// The master address used when nothing names one (single-node runs).
pub const DEFAULT_MASTER_ADDR: &str = "127.0.0.1";

/// Base of the Slurm port derivation: `SLURM_PORT_BASE + (last four digits of SLURM_JOB_ID)`.
const SLURM_PORT_BASE: u16 = 15000;

/// Where the rank and world size came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum LaunchSource {
    Flags,
    Config,
    Torchrun,
    Slurm,
    #[serde(rename = "openmpi")]
    OpenMpi,
    Pmi,
    None,
}

impl LaunchSource {
    /// The same lowercase name serde uses: `"flags"`, `"config"`, `"torchrun"`, `"slurm"`,
    /// `"openmpi"`, `"pmi"`, `"none"`.
    pub fn as_str(&self) -> &'static str {
        match self {
            LaunchSource::Flags => "flags",
            LaunchSource::Config => "config",
            LaunchSource::Torchrun => "torchrun",
            LaunchSource::Slurm => "slurm",
            LaunchSource::OpenMpi => "openmpi",
            LaunchSource::Pmi => "pmi",
            LaunchSource::None => "none",
        }
    }

    /// Human name used in messages ("the Slurm source", "Open MPI variables").
    fn label(&self) -> &'static str {
        match self {
            LaunchSource::Flags => "command-line",
            LaunchSource::Config => "config-file",
            LaunchSource::Torchrun => "torchrun",
            LaunchSource::Slurm => "Slurm",
            LaunchSource::OpenMpi => "Open MPI",
            LaunchSource::Pmi => "PMI",
            LaunchSource::None => "no",
        }
    }

    /// What "takes precedence" in the warning about an ignored lower source.
    fn precedence_phrase(&self) -> &'static str {
        match self {
            LaunchSource::Flags => "command-line flags",
            LaunchSource::Config => "config-file settings",
            LaunchSource::Torchrun => "torchrun variables",
            LaunchSource::Slurm => "Slurm variables",
            LaunchSource::OpenMpi => "Open MPI variables",
            LaunchSource::Pmi => "PMI variables",
            LaunchSource::None => "defaults",
        }
    }
}

impl std::fmt::Display for LaunchSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Values given explicitly on the command line or in the TOML config file (the binary merges
/// flags over config, and sets each field's origin).
#[derive(Debug, Clone, Default)]
pub struct Explicit {
    pub rank: Option<Given<i64>>,
    pub world_size: Option<Given<i64>>,
    pub local_rank: Option<Given<i64>>,
    pub local_world_size: Option<Given<i64>>,
    pub master_addr: Option<Given<String>>,
    pub master_port: Option<Given<i64>>,
}

/// One explicitly given value, with where it came from.
#[derive(Debug, Clone)]
pub struct Given<T> {
    pub value: T,
    /// [`LaunchSource::Flags`] or [`LaunchSource::Config`].
    pub origin: LaunchSource,
    /// How to name it in messages, e.g. `"--rank"` or `"rank in shardwise.toml"`.
    pub name: String,
}

/// The result of [`detect`]: who this process is and where the master is.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Detected {
    pub source: LaunchSource,
    pub rank: u32,
    pub world_size: u32,
    pub local_rank: Option<u32>,
    pub local_world_size: Option<u32>,
    /// As written (host name or IP); not resolved.
    pub master_addr: String,
    pub master_port: u16,
    /// `TORCHELASTIC_RUN_ID` under torchrun, `SLURM_JOB_ID` under Slurm; `None` otherwise.
    #[serde(skip)]
    pub run_id: Option<String>,
    /// Things the caller should log (ignored lower-priority sources, fallbacks taken).
    #[serde(skip)]
    pub warnings: Vec<String>,
}

/// Why the launch environment could not be used. Each message names the variable (or flag) and
/// the value at fault and says what was expected.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum SourceError {
    /// A rank/size value that is not a non-negative integer (includes negative explicit values).
    #[error("{name} is `{value}`: expected a non-negative integer")]
    NotANonNegativeInteger { name: String, value: String },

    /// A non-negative integer too large for its field.
    #[error("{name} is `{value}`: expected a non-negative integer no larger than {max}")]
    NumberTooLarge { name: String, value: String, max: u64 },

    /// The first present source has a rank but no world size, or the reverse.
    #[error(
        "{set_name}={set_value} is set but {missing} is not: the {launcher} source is incomplete (rank and world size must be given together)"
    )]
    IncompleteSource { launcher: &'static str, set_name: String, set_value: String, missing: String },

    #[error("{name} is 0: expected a world size of at least 1")]
    ZeroWorldSize { name: String },

    /// Several processes on this host (a local rank or local world size) without any rank and
    /// world size.
    #[error(
        "{given} is given, but no rank and world size: a node of a cluster needs RANK and WORLD_SIZE (torchrun), \
         SLURM_PROCID and SLURM_NTASKS (srun), OMPI_COMM_WORLD_RANK and OMPI_COMM_WORLD_SIZE (mpirun), PMI_RANK \
         and PMI_SIZE, or --rank and --world-size; for a single node give --rank 0 --world-size 1 (or unset them)"
    )]
    PartialLaunch { given: String },

    #[error(
        "rank {rank} (from {rank_name}) is not below world size {world_size} (from {world_name}): expected 0 <= rank < world size"
    )]
    RankOutOfRange { rank: u32, rank_name: String, world_size: u32, world_name: String },

    #[error("{name} is 0: expected a local world size of at least 1")]
    ZeroLocalWorldSize { name: String },

    #[error(
        "local rank {local_rank} (from {local_rank_name}) is not below local world size {local_world_size} (from {local_world_name}): expected 0 <= local rank < local world size"
    )]
    LocalRankOutOfRange { local_rank: u32, local_rank_name: String, local_world_size: u32, local_world_name: String },

    #[error(
        "{local_name} = {local} does not fit in a world of {world_size} ranks (from {world_name}): a host cannot run more ranks than the whole job has"
    )]
    LocalOverWorld { local_name: String, local: u32, world_size: u32, world_name: String },

    #[error("master port `{value}` from {origin} is out of range: expected a port in 1..=65535")]
    InvalidPort { value: String, origin: String },

    #[error("master address from {origin} is empty: expected a host name or IP address")]
    EmptyMasterAddr { origin: String },

    #[error("master address from {origin} is `{value}`: {why}")]
    BadMasterAddr { origin: String, value: String, why: &'static str },

    #[error(
        "SLURM_JOB_ID is `{value}`: expected a numeric job id to derive the master port (15000 + its last four digits); set MASTER_PORT or pass --master-port instead"
    )]
    NonNumericJobId { value: String },

    #[error(
        "the Slurm job has {world_size} tasks but neither SLURM_JOB_NODELIST nor SLURM_NODELIST is set, so there is no first host to use as master: set MASTER_ADDR or pass --master-addr"
    )]
    MissingSlurmNodelist { world_size: u32 },

    // The cause is in the message, not a `source` as well: the binary prints the chain, and it
    // would print the cause twice.
    #[error("{name} could not be expanded: {cause}")]
    Hostlist { name: &'static str, cause: HostlistError },

    #[error(
        "{nodelist_name}=`{nodelist}` expands to {expanded} hosts but {num_nodes_name} is {num_nodes}: expected the same number of nodes"
    )]
    NodeCountMismatch {
        nodelist_name: &'static str,
        nodelist: String,
        expanded: usize,
        num_nodes_name: &'static str,
        num_nodes: u32,
    },

    /// Open MPI / PMI with more than one rank and no master address from anywhere.
    #[error("{launcher} sets no master address: set MASTER_ADDR (and MASTER_PORT) or pass --master-addr")]
    NoMasterAddr { launcher: &'static str },
}

/// Environment-variable names of one launcher. Where a field lists several names, the first set
/// one is used (Slurm's older aliases come second).
struct EnvSpec {
    source: LaunchSource,
    rank: &'static [&'static str],
    world: &'static [&'static str],
    local_rank: &'static [&'static str],
    /// Read as a plain integer. Slurm's `SLURM_NTASKS_PER_NODE` is handled apart.
    local_world: &'static [&'static str],
    run_id: Option<&'static str>,
}

const TORCHRUN: EnvSpec = EnvSpec {
    source: LaunchSource::Torchrun,
    rank: &["RANK"],
    world: &["WORLD_SIZE"],
    local_rank: &["LOCAL_RANK"],
    local_world: &["LOCAL_WORLD_SIZE"],
    run_id: Some("TORCHELASTIC_RUN_ID"),
};

const SLURM: EnvSpec = EnvSpec {
    source: LaunchSource::Slurm,
    rank: &["SLURM_PROCID"],
    world: &["SLURM_NTASKS", "SLURM_NPROCS"],
    local_rank: &["SLURM_LOCALID"],
    local_world: &[],
    run_id: Some("SLURM_JOB_ID"),
};

const OPEN_MPI: EnvSpec = EnvSpec {
    source: LaunchSource::OpenMpi,
    rank: &["OMPI_COMM_WORLD_RANK"],
    world: &["OMPI_COMM_WORLD_SIZE"],
    local_rank: &["OMPI_COMM_WORLD_LOCAL_RANK"],
    local_world: &["OMPI_COMM_WORLD_LOCAL_SIZE"],
    run_id: None,
};

const PMI: EnvSpec = EnvSpec {
    source: LaunchSource::Pmi,
    rank: &["PMI_RANK"],
    world: &["PMI_SIZE"],
    local_rank: &["MPI_LOCALRANKID"],
    local_world: &["MPI_LOCALNRANKS"],
    run_id: None,
};

const ENV_SOURCES: [&EnvSpec; 4] = [&TORCHRUN, &SLURM, &OPEN_MPI, &PMI];

type Env<'a> = &'a dyn Fn(&str) -> Option<String>;

/// A number together with the name of the variable or flag it came from.
#[derive(Debug, Clone)]
struct Named {
    value: u32,
    name: String,
}

/// Rank and sizes of the winning source, before master resolution.
struct Winner {
    source: LaunchSource,
    rank: Named,
    world: Named,
    local_rank: Option<Named>,
    local_world: Option<Named>,
    run_id: Option<String>,
}

/// Detects the launch environment. `env` looks up one environment variable (pass
/// `&|k| std::env::var(k).ok()` in production, a map in tests).
///
/// Returns the rank, sizes and master endpoint of this process, or an error naming the
/// variable or flag that is missing, malformed or inconsistent. See the module documentation
/// for the order of sources and the master-address rules.
pub fn detect(explicit: &Explicit, env: Env<'_>) -> Result<Detected, SourceError> {
    let mut warnings = Vec::new();

    let mut winner = resolve_explicit(explicit)?;
    // Set when an MPI launcher's variables replace Slurm's: the master is still found as
    // under Slurm (the job's nodes, the job id's port).
    let mut inside_slurm = false;
    for spec in ENV_SOURCES {
        let present = present_vars(spec, env);
        if present.is_empty() {
            continue;
        }
        let Some(w) = &winner else {
            match resolve_env(spec, env) {
                Ok(found) => winner = Some(found),
                // An `salloc` shell sets SLURM_NTASKS but no SLURM_PROCID, and `mpirun` run from
                // it passes that on: with a complete MPI source below, Slurm's half is the shell's.
                Err(e @ SourceError::IncompleteSource { .. })
                    if spec.source == LaunchSource::Slurm && mpi_source_complete(env) =>
                {
                    warnings.push(format!(
                        "ignoring Slurm variables ({}): {e}; an MPI launcher's variables are complete, so this \
                         process was started by mpirun inside a Slurm allocation",
                        present.join(", ")
                    ));
                    inside_slurm = true;
                }
                Err(e) => return Err(e),
            }
            continue;
        };
        if let Some(mpi) = mpirun_inside_slurm(w, spec, env) {
            warnings.push(format!(
                "Slurm's {} = {} and {} = {} disagree with {}'s {} = {} and {} = {}: this process was started \
                 by mpirun inside a Slurm job step, whose variables it inherited, so {} variables are used",
                w.rank.name,
                w.rank.value,
                w.world.name,
                w.world.value,
                spec.source.label(),
                mpi.rank.name,
                mpi.rank.value,
                mpi.world.name,
                mpi.world.value,
                spec.source.label()
            ));
            inside_slurm = true;
            winner = Some(mpi);
            continue;
        }
        warnings.push(format!(
            "ignoring {} variables ({}): {} take precedence",
            spec.source.label(),
            present.join(", "),
            w.source.precedence_phrase()
        ));
    }

    let mut w = match winner {
        Some(w) => w,
        None => {
            refuse_partial_launch(explicit, env, &mut warnings)?;
            Winner {
                source: LaunchSource::None,
                rank: Named { value: 0, name: "the default rank".into() },
                world: Named { value: 1, name: "the default world size".into() },
                local_rank: Some(Named { value: 0, name: "the default local rank".into() }),
                local_world: Some(Named { value: 1, name: "the default local world size".into() }),
                run_id: None,
            }
        }
    };

    // Explicit local values override the source's (torch.distributed.launch's --local-rank).
    if let Some(g) = &explicit.local_rank {
        w.local_rank = Some(given_u32(g)?);
    }
    if let Some(g) = &explicit.local_world_size {
        w.local_world = Some(given_u32(g)?);
    }

    validate(&w)?;

    let (master_addr, master_port) = resolve_master(explicit, env, &w, inside_slurm, &mut warnings)?;

    Ok(Detected {
        source: w.source,
        rank: w.rank.value,
        world_size: w.world.value,
        local_rank: w.local_rank.map(|n| n.value),
        local_world_size: w.local_world.map(|n| n.value),
        master_addr,
        master_port,
        run_id: w.run_id,
        warnings,
    })
}

/// With no rank and world size from any source: refuses a local rank above 0 or a local world
/// size above 1 (several processes on this host, so a node of a cluster: a script that forgot
/// `RANK`/`WORLD_SIZE`, or exported them in another shell), which would otherwise make a
/// single-node cluster and record it in the data dir; and warns of a master address or port,
/// which a single node does not use.
fn refuse_partial_launch(explicit: &Explicit, env: Env<'_>, warnings: &mut Vec<String>) -> Result<(), SourceError> {
    let number = |flag: &Option<Given<i64>>, var: &str| -> Option<(String, i64)> {
        match flag {
            Some(g) => Some((g.name.clone(), g.value)),
            None => env(var).and_then(|v| v.trim().parse().ok()).map(|v| (var.to_string(), v)),
        }
    };
    let local_rank = number(&explicit.local_rank, "LOCAL_RANK").filter(|(_, v)| *v > 0);
    let local_world = number(&explicit.local_world_size, "LOCAL_WORLD_SIZE").filter(|(_, v)| *v > 1);
    let several: Vec<String> =
        [local_rank, local_world].into_iter().flatten().map(|(n, v)| format!("{n}={v}")).collect();
    if !several.is_empty() {
        return Err(SourceError::PartialLaunch { given: several.join(", ") });
    }
    let master: Vec<String> =
        [explicit.master_addr.as_ref().map(|g| g.name.clone()), explicit.master_port.as_ref().map(|g| g.name.clone())]
            .into_iter()
            .flatten()
            .chain(["MASTER_ADDR", "MASTER_PORT"].into_iter().filter(|k| env(k).is_some()).map(str::to_string))
            .collect();
    if !master.is_empty() {
        warnings.push(format!(
            "{} given, but no rank and world size: starting as a single node (a node of a cluster needs RANK and \
             WORLD_SIZE, or --rank and --world-size)",
            master.join(", ")
        ));
    }
    Ok(())
}

/// `spec`'s rank and world size when they should replace the Slurm ones `w` holds: `mpirun`
/// (or `mpiexec`) run inside an `sbatch` script passes the batch step's `SLURM_PROCID=0` and
/// `SLURM_NTASKS` to every process it starts, so when a complete MPI source disagrees with
/// Slurm, the MPI launcher is the one that started this process (as torchrun is preferred over
/// Slurm for the same reason). When they agree (`srun` with PMI), Slurm stays.
fn mpirun_inside_slurm(w: &Winner, spec: &EnvSpec, env: Env<'_>) -> Option<Winner> {
    if w.source != LaunchSource::Slurm || !matches!(spec.source, LaunchSource::OpenMpi | LaunchSource::Pmi) {
        return None;
    }
    let mpi = resolve_env(spec, env).ok()?;
    ((mpi.rank.value, mpi.world.value) != (w.rank.value, w.world.value)).then_some(mpi)
}

/// True when Open MPI's or PMI's rank and world size are both set and valid.
fn mpi_source_complete(env: Env<'_>) -> bool {
    [&OPEN_MPI, &PMI].iter().any(|spec| resolve_env(spec, env).is_ok())
}

/// The explicit source, if rank or world size was given; an error if only one of them was.
fn resolve_explicit(explicit: &Explicit) -> Result<Option<Winner>, SourceError> {
    match (&explicit.rank, &explicit.world_size) {
        (None, None) => Ok(None),
        (Some(r), Some(ws)) => Ok(Some(Winner {
            source: r.origin,
            rank: given_u32(r)?,
            world: given_u32(ws)?,
            local_rank: None,
            local_world: None,
            run_id: None,
        })),
        (Some(r), None) => Err(SourceError::IncompleteSource {
            launcher: r.origin.label(),
            set_name: r.name.clone(),
            set_value: r.value.to_string(),
            missing: "a world size".into(),
        }),
        (None, Some(ws)) => Err(SourceError::IncompleteSource {
            launcher: ws.origin.label(),
            set_name: ws.name.clone(),
            set_value: ws.value.to_string(),
            missing: "a rank".into(),
        }),
    }
}

/// Names of the rank / world-size variables of `spec` that are set, in spec order.
fn present_vars(spec: &EnvSpec, env: Env<'_>) -> Vec<&'static str> {
    spec.rank.iter().chain(spec.world.iter()).copied().filter(|name| env(name).is_some()).collect()
}

/// The first set variable among `names`, with its value.
fn first_set(names: &[&'static str], env: Env<'_>) -> Option<(&'static str, String)> {
    names.iter().find_map(|&n| env(n).map(|v| (n, v)))
}

/// How to name the missing variable(s): `WORLD_SIZE`, or `SLURM_NTASKS (or SLURM_NPROCS)`.
fn describe_names(names: &[&'static str]) -> String {
    match names {
        [] => String::new(),
        [one] => (*one).to_owned(),
        [first, rest @ ..] => format!("{first} (or {})", rest.join(" or ")),
    }
}

fn resolve_env(spec: &EnvSpec, env: Env<'_>) -> Result<Winner, SourceError> {
    let rank = first_set(spec.rank, env);
    let world = first_set(spec.world, env);
    let (rank, world) = match (rank, world) {
        (Some(r), Some(w)) => (r, w),
        (Some((name, value)), None) => {
            return Err(SourceError::IncompleteSource {
                launcher: spec.source.label(),
                set_name: name.into(),
                set_value: value,
                missing: describe_names(spec.world),
            });
        }
        (None, Some((name, value))) => {
            return Err(SourceError::IncompleteSource {
                launcher: spec.source.label(),
                set_name: name.into(),
                set_value: value,
                missing: describe_names(spec.rank),
            });
        }
        // Callers only resolve a present source; treat "nothing" as incomplete anyway.
        (None, None) => {
            return Err(SourceError::IncompleteSource {
                launcher: spec.source.label(),
                set_name: describe_names(spec.rank),
                set_value: "<unset>".into(),
                missing: describe_names(spec.world),
            });
        }
    };
    let rank = env_u32(rank.0, &rank.1)?;
    let world = env_u32(world.0, &world.1)?;
    let local_rank = match first_set(spec.local_rank, env) {
        Some((n, v)) => Some(env_u32(n, &v)?),
        None => None,
    };
    let local_world = match first_set(spec.local_world, env) {
        Some((n, v)) => Some(env_u32(n, &v)?),
        None => None,
    };
    let local_world = if spec.source == LaunchSource::Slurm { slurm_local_world(env) } else { local_world };
    Ok(Winner { source: spec.source, rank, world, local_rank, local_world, run_id: spec.run_id.and_then(env) })
}

/// Where Slurm says how many tasks each node runs, most specific first: the step's own counts
/// (what `srun` started), the job's, and the `--ntasks-per-node` request.
const SLURM_TASKS_PER_NODE: [&str; 3] = ["SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE", "SLURM_NTASKS_PER_NODE"];

/// This node's task count as the local world size: from the first of [`SLURM_TASKS_PER_NODE`]
/// that is set, in Slurm's compressed form (`2(x3),1`: two tasks on each of three nodes, then
/// one). When the counts differ across nodes, `SLURM_NODEID` picks this node's; without it (or
/// with a value that does not parse) there is no single local world size.
fn slurm_local_world(env: Env<'_>) -> Option<Named> {
    let (name, raw) = SLURM_TASKS_PER_NODE.iter().find_map(|name| env(name).map(|raw| (*name, raw)))?;
    let counts = parse_tasks_per_node(&raw)?;
    let first = *counts.first()?;
    if counts.iter().all(|&c| c == first) {
        return Some(Named { value: first, name: name.into() });
    }
    let node = env("SLURM_NODEID")?.trim().parse::<usize>().ok()?;
    let value = *counts.get(node)?;
    Some(Named { value, name: format!("{name} for SLURM_NODEID={node}") })
}

/// Expands Slurm's compressed per-node counts (`2(x3),1` → `[2, 2, 2, 1]`); `None` when malformed
/// or when it names more nodes than [`MAX_SLURM_NODES`].
fn parse_tasks_per_node(raw: &str) -> Option<Vec<u32>> {
    let mut counts = Vec::new();
    for group in raw.trim().split(',') {
        let (count, repeat) = match group.trim().split_once("(x") {
            Some((count, rest)) => (count, rest.strip_suffix(')')?.parse::<usize>().ok()?),
            None => (group.trim(), 1),
        };
        if !count.bytes().all(|b| b.is_ascii_digit()) || repeat == 0 || counts.len() + repeat > MAX_SLURM_NODES {
            return None;
        }
        let count = count.parse::<u32>().ok()?;
        counts.extend(std::iter::repeat_n(count, repeat));
    }
    Some(counts)
}

/// The most nodes a per-node task list may expand to (a bound on what a malformed value costs).
const MAX_SLURM_NODES: usize = 1 << 20;

/// Parses an environment value as a u32 (surrounding whitespace allowed).
fn env_u32(name: &str, raw: &str) -> Result<Named, SourceError> {
    let t = raw.trim();
    if t.is_empty() || !t.bytes().all(|b| b.is_ascii_digit()) {
        return Err(SourceError::NotANonNegativeInteger { name: name.into(), value: raw.into() });
    }
    match t.parse::<u32>() {
        Ok(value) => Ok(Named { value, name: name.into() }),
        Err(_) => Err(SourceError::NumberTooLarge { name: name.into(), value: raw.into(), max: u64::from(u32::MAX) }),
    }
}

fn given_u32(g: &Given<i64>) -> Result<Named, SourceError> {
    if g.value < 0 {
        return Err(SourceError::NotANonNegativeInteger { name: g.name.clone(), value: g.value.to_string() });
    }
    match u32::try_from(g.value) {
        Ok(value) => Ok(Named { value, name: g.name.clone() }),
        Err(_) => Err(SourceError::NumberTooLarge {
            name: g.name.clone(),
            value: g.value.to_string(),
            max: u64::from(u32::MAX),
        }),
    }
}

fn validate(w: &Winner) -> Result<(), SourceError> {
    if w.world.value == 0 {
        return Err(SourceError::ZeroWorldSize { name: w.world.name.clone() });
    }
    if w.rank.value >= w.world.value {
        return Err(SourceError::RankOutOfRange {
            rank: w.rank.value,
            rank_name: w.rank.name.clone(),
            world_size: w.world.value,
            world_name: w.world.name.clone(),
        });
    }
    // The world size bounds the local rank. (Not the local world size: Slurm's
    // SLURM_NTASKS_PER_NODE is the job's, and a step may run fewer tasks than that.)
    if let Some(local) = w.local_rank.as_ref().filter(|lr| lr.value >= w.world.value) {
        return Err(SourceError::LocalOverWorld {
            local_name: local.name.clone(),
            local: local.value,
            world_size: w.world.value,
            world_name: w.world.name.clone(),
        });
    }
    if let Some(lw) = &w.local_world {
        if lw.value == 0 {
            return Err(SourceError::ZeroLocalWorldSize { name: lw.name.clone() });
        }
        if let Some(lr) = w.local_rank.as_ref().filter(|lr| lr.value >= lw.value) {
            return Err(SourceError::LocalRankOutOfRange {
                local_rank: lr.value,
                local_rank_name: lr.name.clone(),
                local_world_size: lw.value,
                local_world_name: lw.name.clone(),
            });
        }
    }
    Ok(())
}

/// A port from an explicit value or a variable, checked to be in 1..=65535.
fn port_from(value: &str, origin: &str) -> Result<u16, SourceError> {
    let t = value.trim();
    let negative_digits = t.strip_prefix('-').is_some_and(|d| !d.is_empty() && d.bytes().all(|b| b.is_ascii_digit()));
    if negative_digits {
        return Err(SourceError::InvalidPort { value: value.into(), origin: origin.into() });
    }
    if t.is_empty() || !t.bytes().all(|b| b.is_ascii_digit()) {
        return Err(SourceError::NotANonNegativeInteger { name: origin.into(), value: value.into() });
    }
    match t.parse::<u16>() {
        Ok(p) if p >= 1 => Ok(p),
        _ => Err(SourceError::InvalidPort { value: value.into(), origin: origin.into() }),
    }
}

fn check_addr(addr: String, origin: &str) -> Result<String, SourceError> {
    let trimmed = addr.trim();
    if trimmed.is_empty() {
        return Err(SourceError::EmptyMasterAddr { origin: origin.into() });
    }
    let bad = |why| Err(SourceError::BadMasterAddr { origin: origin.into(), value: trimmed.into(), why });
    // `[::1]`, as in a URL, is the address inside the brackets.
    let unbracketed = trimmed.strip_prefix('[').and_then(|a| a.strip_suffix(']')).unwrap_or(trimmed);
    if unbracketed.parse::<std::net::IpAddr>().is_ok() {
        return Ok(unbracketed.to_owned());
    }
    if trimmed.contains("://") {
        return bad("it has a scheme; give only a host name or IP address");
    }
    // `1.2.3` is not a host name, and the resolver would read it as 1.2.0.3; nor `0x7f.1`, or
    // `2130706433`, which it reads as 127.0.0.1 (inet_aton's numbers: decimal, 0x hex, 0 octal).
    let inet_aton_number = |label: &str| {
        let hex = label.strip_prefix("0x").or_else(|| label.strip_prefix("0X"));
        match hex {
            Some(digits) => digits.bytes().all(|b| b.is_ascii_hexdigit()),
            None => !label.is_empty() && label.bytes().all(|b| b.is_ascii_digit()),
        }
    };
    if trimmed.bytes().all(|b| b.is_ascii_digit() || b == b'.') || trimmed.split('.').all(inet_aton_number) {
        return bad("it is not an IPv4 address (four numbers from 0 to 255, separated by dots, without leading zeros)");
    }
    if trimmed.ends_with(':') {
        return bad("it ends with ':'; give the port in MASTER_PORT (or --master-port) and only the host here");
    }
    let with_port = trimmed.parse::<std::net::SocketAddr>().is_ok()
        || trimmed.rsplit_once(':').is_some_and(|(host, port)| {
            !host.contains(':') && !port.is_empty() && port.bytes().all(|b| b.is_ascii_digit())
        });
    if with_port {
        return bad("it has a port; give the port in MASTER_PORT (or --master-port) and only the host here");
    }
    if trimmed.contains(|c: char| c.is_whitespace() || c == '/' || c == '@') {
        return bad("expected a host name or IP address");
    }
    Ok(trimmed.to_owned())
}

/// Master address and port, by the precedence in the module documentation. Slurm's
/// consistency checks (hostlist parses, node count matches) run whenever Slurm won, even if
/// the master comes from elsewhere: an inconsistent Slurm environment is a problem in itself.
fn resolve_master(
    explicit: &Explicit,
    env: Env<'_>,
    w: &Winner,
    inside_slurm: bool,
    warnings: &mut Vec<String>,
) -> Result<(String, u16), SourceError> {
    let mut addr = match &explicit.master_addr {
        Some(g) => Some(check_addr(g.value.clone(), &g.name)?),
        None => match env("MASTER_ADDR") {
            Some(v) => Some(check_addr(v, "MASTER_ADDR")?),
            None => None,
        },
    };
    let mut port = match &explicit.master_port {
        Some(g) => Some(port_from(&g.value.to_string(), &g.name)?),
        None => match env("MASTER_PORT") {
            Some(v) => Some(port_from(&v, "MASTER_PORT")?),
            None => None,
        },
    };
    let multi = w.world.value > 1;

    match w.source {
        _ if w.source == LaunchSource::Slurm || inside_slurm => {
            let first_host = slurm_first_host(env)?;
            if addr.is_none() {
                match first_host {
                    Some(h) => addr = Some(h),
                    None if multi => {
                        return Err(SourceError::MissingSlurmNodelist { world_size: w.world.value });
                    }
                    None => {}
                }
            }
            if port.is_none() {
                match env("SLURM_JOB_ID") {
                    Some(id) => port = Some(slurm_port(&id)?),
                    None if multi => warnings.push(format!(
                        "SLURM_JOB_ID is not set, so no master port can be derived from it: using the default {DEFAULT_MASTER_PORT}"
                    )),
                    None => {}
                }
            }
        }
        LaunchSource::OpenMpi | LaunchSource::Pmi if multi && addr.is_none() => {
            return Err(SourceError::NoMasterAddr { launcher: w.source.label() });
        }
        LaunchSource::Flags | LaunchSource::Config | LaunchSource::Torchrun if multi && addr.is_none() => {
            warnings.push(format!(
                "no master address is set (MASTER_ADDR or --master-addr) for a world of {} ranks: using {DEFAULT_MASTER_ADDR}, which only works if every rank runs on this host",
                w.world.value
            ));
        }
        _ => {}
    }

    Ok((addr.unwrap_or_else(|| DEFAULT_MASTER_ADDR.to_owned()), port.unwrap_or(DEFAULT_MASTER_PORT)))
}

/// Expands the Slurm node list (if set), checks it against the node count (if set), and
/// returns its first host. The step's list comes first: an `srun` step may run on some of the
/// job's nodes only (`srun -r 2`, `-w`, `-x`, concurrent steps), and its task 0 runs on the
/// step's first node, not the job's.
fn slurm_first_host(env: Env<'_>) -> Result<Option<String>, SourceError> {
    let step = first_set(&["SLURM_STEP_NODELIST"], env);
    let (counts, found): (&[&'static str], _) = match step {
        Some(found) => (&["SLURM_STEP_NUM_NODES"], Some(found)),
        None => (&["SLURM_JOB_NUM_NODES", "SLURM_NNODES"], first_set(&["SLURM_JOB_NODELIST", "SLURM_NODELIST"], env)),
    };
    let Some((nodelist_name, nodelist)) = found else {
        return Ok(None);
    };
    let hosts = hostlist::expand(&nodelist).map_err(|cause| SourceError::Hostlist { name: nodelist_name, cause })?;
    if let Some((num_nodes_name, raw)) = first_set(counts, env) {
        let num_nodes = env_u32(num_nodes_name, &raw)?.value;
        if usize::try_from(num_nodes).ok() != Some(hosts.len()) {
            return Err(SourceError::NodeCountMismatch {
                nodelist_name,
                nodelist,
                expanded: hosts.len(),
                num_nodes_name,
                num_nodes,
            });
        }
    }
    Ok(hosts.into_iter().next())
}

/// Lightning's rule: `15000 + int(SLURM_JOB_ID[-4:])`, giving a port in 15000..=24999.
fn slurm_port(job_id: &str) -> Result<u16, SourceError> {
    let t = job_id.trim();
    if t.is_empty() || !t.bytes().all(|b| b.is_ascii_digit()) {
        return Err(SourceError::NonNumericJobId { value: job_id.into() });
    }
    // All ASCII digits, so byte slicing is on char boundaries.
    let last4 = &t[t.len().saturating_sub(4)..];
    let n: u16 = last4.parse().map_err(|_| SourceError::NonNumericJobId { value: job_id.into() })?;
    Ok(SLURM_PORT_BASE + n)
}

#[cfg(test)]
mod tests;
