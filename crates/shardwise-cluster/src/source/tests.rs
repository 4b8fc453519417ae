//! Unit tests of [`super`].
use super::*;
use std::collections::HashMap;

fn env_of(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
    let map: HashMap<String, String> = pairs.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect();
    move |k: &str| map.get(k).cloned()
}

fn run(explicit: &Explicit, pairs: &[(&str, &str)]) -> Result<Detected, SourceError> {
    let env = env_of(pairs);
    detect(explicit, &env)
}

fn ok(explicit: &Explicit, pairs: &[(&str, &str)]) -> Detected {
    match run(explicit, pairs) {
        Ok(d) => d,
        Err(e) => panic!("detect failed for {pairs:?}: {e}"),
    }
}

fn err(explicit: &Explicit, pairs: &[(&str, &str)]) -> SourceError {
    match run(explicit, pairs) {
        Ok(d) => panic!("detect should fail for {pairs:?}, got {d:?}"),
        Err(e) => e,
    }
}

fn flag<T>(value: T, name: &str) -> Option<Given<T>> {
    Some(Given { value, origin: LaunchSource::Flags, name: name.into() })
}

fn conf<T>(value: T, name: &str) -> Option<Given<T>> {
    Some(Given { value, origin: LaunchSource::Config, name: name.into() })
}

fn none() -> Explicit {
    Explicit::default()
}

const TORCH: &[(&str, &str)] = &[
    ("RANK", "3"),
    ("WORLD_SIZE", "8"),
    ("LOCAL_RANK", "1"),
    ("LOCAL_WORLD_SIZE", "2"),
    ("MASTER_ADDR", "10.0.0.1"),
    ("MASTER_PORT", "29400"),
    ("TORCHELASTIC_RUN_ID", "run-42"),
];

const SLURM_ENV: &[(&str, &str)] = &[
    ("SLURM_PROCID", "5"),
    ("SLURM_NTASKS", "8"),
    ("SLURM_LOCALID", "1"),
    ("SLURM_NTASKS_PER_NODE", "2"),
    ("SLURM_JOB_NODELIST", "gnode[10,20,25,37]"),
    ("SLURM_JOB_NUM_NODES", "4"),
    ("SLURM_JOB_ID", "1234567"),
];

fn with(
    base: &[(&'static str, &'static str)],
    extra: &[(&'static str, &'static str)],
) -> Vec<(&'static str, &'static str)> {
    let mut v: Vec<_> = base.iter().filter(|(k, _)| !extra.iter().any(|(ek, _)| ek == k)).copied().collect();
    v.extend_from_slice(extra);
    v
}

fn without(base: &[(&'static str, &'static str)], drop: &[&str]) -> Vec<(&'static str, &'static str)> {
    base.iter().filter(|(k, _)| !drop.contains(k)).copied().collect()
}

// ---- LaunchSource ----

#[test]
fn launch_source_names() {
    for (s, name) in [
        (LaunchSource::Flags, "flags"),
        (LaunchSource::Config, "config"),
        (LaunchSource::Torchrun, "torchrun"),
        (LaunchSource::Slurm, "slurm"),
        (LaunchSource::OpenMpi, "openmpi"),
        (LaunchSource::Pmi, "pmi"),
        (LaunchSource::None, "none"),
    ] {
        assert_eq!(s.as_str(), name);
        assert_eq!(s.to_string(), name);
        assert_eq!(serde_json::to_string(&s).ok(), Some(format!("\"{name}\"")));
    }
}

#[test]
fn detected_serializes_without_run_id_and_warnings() {
    let d = ok(&none(), TORCH);
    let json = serde_json::to_value(&d).unwrap_or_default();
    assert_eq!(json["source"], "torchrun");
    assert_eq!(json["rank"], 3);
    assert_eq!(json["master_port"], 29400);
    assert!(json.get("run_id").is_none());
    assert!(json.get("warnings").is_none());
}

// ---- each source alone ----

#[test]
fn no_source() {
    let d = ok(&none(), &[]);
    assert_eq!(
        d,
        Detected {
            source: LaunchSource::None,
            rank: 0,
            world_size: 1,
            local_rank: Some(0),
            local_world_size: Some(1),
            master_addr: "127.0.0.1".into(),
            master_port: 29500,
            run_id: None,
            warnings: vec![],
        }
    );
    // Unrelated variables do not make a source present.
    let d = ok(&none(), &[("SLURM_JOB_ID", "7"), ("LOCAL_RANK", "0"), ("PATH", "/bin")]);
    assert_eq!(d.source, LaunchSource::None);
    assert!(d.warnings.is_empty());
}

#[test]
fn master_addresses_that_are_no_host_are_refused() {
    let cases = [
        ("1.2.3", "not an IPv4 address"),
        ("127.0.0.1:", "ends with ':'"),
        ("10.0.0.256", "IPv4"),
        // inet_aton's forms, which the resolver would read as 127.0.0.1.
        ("0x7f.1", "IPv4"),
        ("0X7F.0.0.01", "IPv4"),
        ("2130706433", "IPv4"),
    ];
    for (addr, why) in cases {
        let e = err(&none(), &[("RANK", "1"), ("WORLD_SIZE", "2"), ("MASTER_ADDR", addr), ("MASTER_PORT", "29500")]);
        assert!(e.to_string().contains(why), "{addr}: {e}");
    }
    let d = ok(&none(), &[("RANK", "1"), ("WORLD_SIZE", "2"), ("MASTER_ADDR", "node-1.example"), ("MASTER_PORT", "1")]);
    assert_eq!(d.master_addr, "node-1.example");
    // Names that only begin like numbers are names.
    for name in ["4gpu", "0xcafe-node", "deadbeef", "10g.example"] {
        let d = ok(&none(), &[("RANK", "1"), ("WORLD_SIZE", "2"), ("MASTER_ADDR", name), ("MASTER_PORT", "1")]);
        assert_eq!(d.master_addr, name);
    }
}

#[test]
fn several_processes_on_this_host_without_a_rank_are_refused() {
    // A script that forgot RANK and WORLD_SIZE: not a single node.
    let e = err(&none(), &[("MASTER_ADDR", "10.0.0.5"), ("MASTER_PORT", "29500"), ("LOCAL_RANK", "1")]);
    assert!(matches!(&e, SourceError::PartialLaunch { given } if given == "LOCAL_RANK=1"), "{e}");
    assert!(e.to_string().contains("RANK and WORLD_SIZE") && e.to_string().contains("--rank 0 --world-size 1"), "{e}");
    let e = err(&none(), &[("LOCAL_WORLD_SIZE", "4")]);
    assert!(e.to_string().contains("LOCAL_WORLD_SIZE=4"), "{e}");
    let ex = Explicit { local_rank: flag(2, "--local-rank"), ..none() };
    assert!(err(&ex, &[]).to_string().contains("--local-rank=2"));
    // A master without a rank: a single node, said.
    let d = ok(&none(), &[("MASTER_ADDR", "10.0.0.5"), ("LOCAL_RANK", "0"), ("LOCAL_WORLD_SIZE", "1")]);
    assert_eq!((d.source, d.world_size), (LaunchSource::None, 1));
    assert!(d.warnings.iter().any(|w| w.contains("MASTER_ADDR") && w.contains("single node")), "{:?}", d.warnings);
    // With a rank and world size given, as the error says, nothing is refused.
    let ex = Explicit { rank: flag(0, "--rank"), world_size: flag(1, "--world-size"), ..none() };
    assert_eq!(ok(&ex, &[("LOCAL_RANK", "1"), ("LOCAL_WORLD_SIZE", "4")]).world_size, 1);
}

#[test]
fn torchrun_alone() {
    let d = ok(&none(), TORCH);
    assert_eq!(
        d,
        Detected {
            source: LaunchSource::Torchrun,
            rank: 3,
            world_size: 8,
            local_rank: Some(1),
            local_world_size: Some(2),
            master_addr: "10.0.0.1".into(),
            master_port: 29400,
            run_id: Some("run-42".into()),
            warnings: vec![],
        }
    );
}

#[test]
fn torchrun_minimal_defaults_master_and_warns() {
    let d = ok(&none(), &[("RANK", "1"), ("WORLD_SIZE", "2")]);
    assert_eq!(d.source, LaunchSource::Torchrun);
    assert_eq!((d.local_rank, d.local_world_size), (None, None));
    assert_eq!((d.master_addr.as_str(), d.master_port), (DEFAULT_MASTER_ADDR, DEFAULT_MASTER_PORT));
    assert_eq!(d.run_id, None);
    assert_eq!(d.warnings.len(), 1);
    assert!(d.warnings[0].contains("no master address"), "{:?}", d.warnings);
    // world 1: nothing to warn about
    let d = ok(&none(), &[("RANK", "0"), ("WORLD_SIZE", "1")]);
    assert!(d.warnings.is_empty());
}

#[test]
fn slurm_alone_derives_master() {
    let d = ok(&none(), SLURM_ENV);
    assert_eq!(
        d,
        Detected {
            source: LaunchSource::Slurm,
            rank: 5,
            world_size: 8,
            local_rank: Some(1),
            local_world_size: Some(2),
            master_addr: "gnode10".into(),
            master_port: 15000 + 4567,
            run_id: Some("1234567".into()),
            warnings: vec![],
        }
    );
}

#[test]
fn slurm_fallback_variable_names() {
    let env = [
        ("SLURM_PROCID", "0"),
        ("SLURM_NPROCS", "2"),
        ("SLURM_NODELIST", "n[1-2]-ib"),
        ("SLURM_NNODES", "2"),
        ("SLURM_JOB_ID", "42"),
    ];
    let d = ok(&none(), &env);
    assert_eq!((d.rank, d.world_size), (0, 2));
    assert_eq!(d.master_addr, "n1-ib");
    assert_eq!(d.master_port, 15042);
    // SLURM_NTASKS beats SLURM_NPROCS
    let d = ok(&none(), &with(&env, &[("SLURM_NTASKS", "4")]));
    assert_eq!(d.world_size, 4);
}

#[test]
fn slurm_step_nodelist_names_the_master() {
    // `srun -r 2 -N 2` in a 4-node job: the step runs on n3 and n4, and its task 0 on n3.
    let env = with(
        SLURM_ENV,
        &[("SLURM_STEP_NODELIST", "gnode[25,37]"), ("SLURM_STEP_NUM_NODES", "2"), ("SLURM_PROCID", "0")],
    );
    assert_eq!(ok(&none(), &env).master_addr, "gnode25");
    let e = err(&none(), &with(&env, &[("SLURM_STEP_NUM_NODES", "3")]));
    assert!(e.to_string().contains("SLURM_STEP_NODELIST"), "{e}");
}

#[test]
fn mpirun_inside_an_sbatch_script_uses_the_mpi_rank() {
    // The batch step's SLURM_PROCID=0 reaches every process mpirun starts.
    let ompi =
        [("OMPI_COMM_WORLD_RANK", "2"), ("OMPI_COMM_WORLD_SIZE", "3"), ("SLURM_PROCID", "0"), ("SLURM_NTASKS", "3")];
    let d = ok(&none(), &with(SLURM_ENV, &ompi));
    assert_eq!((d.source, d.rank, d.world_size), (LaunchSource::OpenMpi, 2, 3));
    // The master as under Slurm: the job's first node and the job id's port.
    assert_eq!((d.master_addr.as_str(), d.master_port), ("gnode10", 15000 + 4567));
    assert!(
        d.warnings.iter().any(|w| w.contains("SLURM_PROCID = 0") && w.contains("OMPI_COMM_WORLD_RANK = 2")),
        "{:?}",
        d.warnings
    );
    // srun with PMI sets both alike: Slurm stays, the PMI variables are named as ignored.
    let d = ok(&none(), &with(SLURM_ENV, &[("PMI_RANK", "5"), ("PMI_SIZE", "8")]));
    assert_eq!((d.source, d.rank), (LaunchSource::Slurm, 5));
    assert!(d.warnings.iter().any(|w| w.contains("ignoring PMI variables")), "{:?}", d.warnings);
}

#[test]
fn mpirun_inside_an_salloc_shell_uses_the_mpi_rank() {
    // salloc's shell has SLURM_NTASKS but no SLURM_PROCID; mpirun's processes inherit both.
    let env =
        with(&without(SLURM_ENV, &["SLURM_PROCID"]), &[("OMPI_COMM_WORLD_RANK", "3"), ("OMPI_COMM_WORLD_SIZE", "8")]);
    let d = ok(&none(), &env);
    assert_eq!((d.source, d.rank, d.world_size), (LaunchSource::OpenMpi, 3, 8));
    assert_eq!(d.master_addr, "gnode10");
    assert!(d.warnings.iter().any(|w| w.contains("ignoring Slurm variables")), "{:?}", d.warnings);
    // Without an MPI source, the incomplete Slurm one is still an error.
    assert!(matches!(err(&none(), &without(SLURM_ENV, &["SLURM_PROCID"])), SourceError::IncompleteSource { .. }));
}

#[test]
fn slurm_compressed_tasks_per_node() {
    // Uneven counts and no SLURM_NODEID: no single local world size.
    let d = ok(&none(), &with(SLURM_ENV, &[("SLURM_NTASKS_PER_NODE", "2(x3),1")]));
    assert_eq!(d.local_world_size, None);
    assert_eq!(d.local_rank, Some(1));
    let d = ok(&none(), &without(SLURM_ENV, &["SLURM_NTASKS_PER_NODE"]));
    assert_eq!(d.local_world_size, None);
    // Even counts, compressed: every node runs 2.
    let d = ok(&none(), &with(&without(SLURM_ENV, &["SLURM_NTASKS_PER_NODE"]), &[("SLURM_TASKS_PER_NODE", "2(x4)")]));
    assert_eq!(d.local_world_size, Some(2));
    // Uneven counts: this node's, by SLURM_NODEID (node 3 of 2,2,2,1 runs 1; local rank 0).
    let uneven = with(SLURM_ENV, &[("SLURM_TASKS_PER_NODE", "2(x3),1"), ("SLURM_NODEID", "3"), ("SLURM_LOCALID", "0")]);
    assert_eq!(ok(&none(), &uneven).local_world_size, Some(1));
    let d = ok(&none(), &with(&uneven, &[("SLURM_NODEID", "1"), ("SLURM_LOCALID", "1")]));
    assert_eq!(d.local_world_size, Some(2));
    // The step's counts are the ones srun started, before the job's.
    let d = ok(&none(), &with(&uneven, &[("SLURM_STEP_TASKS_PER_NODE", "3(x2)"), ("SLURM_LOCALID", "2")]));
    assert_eq!(d.local_world_size, Some(3));
    // A local rank at or over this node's count is the error it always was.
    let e = err(&none(), &with(&uneven, &[("SLURM_LOCALID", "1")]));
    assert!(e.to_string().contains("SLURM_TASKS_PER_NODE for SLURM_NODEID=3"), "{e}");
}

#[test]
fn slurm_tasks_per_node_forms() {
    use super::parse_tasks_per_node as parse;
    assert_eq!(parse("2(x3),1"), Some(vec![2, 2, 2, 1]));
    assert_eq!(parse("1(x4)"), Some(vec![1, 1, 1, 1]));
    assert_eq!(parse("4"), Some(vec![4]));
    assert_eq!(parse(" 2,3 "), Some(vec![2, 3]));
    for bad in ["", "x", "2(x)", "2(x0)", "2(x3", "-1", "2(x99999999999)"] {
        assert_eq!(parse(bad), None, "{bad:?}");
    }
}

#[test]
fn slurm_port_derivation() {
    for (id, port) in [("1234567", 19567), ("42", 15042), ("9999", 24999), ("10000", 15000), ("0", 15000)] {
        let d = ok(&none(), &with(SLURM_ENV, &[("SLURM_JOB_ID", id)]));
        assert_eq!(d.master_port, port, "job id {id}");
    }
    // MASTER_PORT beats the derivation, and then a bad job id does not matter.
    let d = ok(&none(), &with(SLURM_ENV, &[("MASTER_PORT", "1234"), ("SLURM_JOB_ID", "abc")]));
    assert_eq!(d.master_port, 1234);
    assert_eq!(d.run_id.as_deref(), Some("abc"));
}

#[test]
fn slurm_non_numeric_job_id() {
    let e = err(&none(), &with(SLURM_ENV, &[("SLURM_JOB_ID", "12_3")]));
    assert_eq!(e, SourceError::NonNumericJobId { value: "12_3".into() });
    assert!(e.to_string().contains("`12_3`"));
}

#[test]
fn slurm_missing_job_id_defaults_port_with_warning() {
    let d = ok(&none(), &without(SLURM_ENV, &["SLURM_JOB_ID"]));
    assert_eq!(d.master_port, DEFAULT_MASTER_PORT);
    assert_eq!(d.run_id, None);
    assert_eq!(d.warnings.len(), 1);
    assert!(d.warnings[0].contains("SLURM_JOB_ID"));
}

#[test]
fn slurm_nodelist_mismatch() {
    let e = err(&none(), &with(SLURM_ENV, &[("SLURM_JOB_NUM_NODES", "3")]));
    assert_eq!(
        e,
        SourceError::NodeCountMismatch {
            nodelist_name: "SLURM_JOB_NODELIST",
            nodelist: "gnode[10,20,25,37]".into(),
            expanded: 4,
            num_nodes_name: "SLURM_JOB_NUM_NODES",
            num_nodes: 3,
        }
    );
    let msg = e.to_string();
    assert!(msg.contains("4 hosts") && msg.contains("SLURM_JOB_NUM_NODES is 3"), "{msg}");
    // Checked even when MASTER_ADDR is given.
    let e = err(&none(), &with(SLURM_ENV, &[("SLURM_JOB_NUM_NODES", "3"), ("MASTER_ADDR", "x")]));
    assert!(matches!(e, SourceError::NodeCountMismatch { num_nodes: 3, .. }), "{e}");
    // SLURM_JOB_NUM_NODES is preferred over SLURM_NNODES.
    let d = ok(&none(), &with(SLURM_ENV, &[("SLURM_NNODES", "3")]));
    assert_eq!(d.master_addr, "gnode10");
    let e = err(&none(), &without(&with(SLURM_ENV, &[("SLURM_NNODES", "9")]), &["SLURM_JOB_NUM_NODES"]));
    assert!(matches!(e, SourceError::NodeCountMismatch { num_nodes_name: "SLURM_NNODES", num_nodes: 9, .. }), "{e}");
    // No node count at all: no check.
    let d = ok(&none(), &without(SLURM_ENV, &["SLURM_JOB_NUM_NODES"]));
    assert_eq!(d.master_addr, "gnode10");
    // Non-numeric node count.
    let e = err(&none(), &with(SLURM_ENV, &[("SLURM_JOB_NUM_NODES", "four")]));
    assert!(matches!(e, SourceError::NotANonNegativeInteger { ref name, .. } if name == "SLURM_JOB_NUM_NODES"));
}

#[test]
fn slurm_bad_nodelist() {
    let e = err(&none(), &with(SLURM_ENV, &[("SLURM_JOB_NODELIST", "gnode[10-")]));
    assert!(
        matches!(
            &e,
            SourceError::Hostlist { name: "SLURM_JOB_NODELIST", cause: HostlistError::UnbalancedBrackets { .. } }
        ),
        "{e}"
    );
    assert!(e.to_string().contains("SLURM_JOB_NODELIST could not be expanded"), "{e}");
    // The cause once, in the message (the binary prints an error's chain).
    assert!(e.to_string().contains("`[` is never closed"), "{e}");
    assert!(std::error::Error::source(&e).is_none());
}

#[test]
fn slurm_missing_nodelist() {
    let e = err(&none(), &without(SLURM_ENV, &["SLURM_JOB_NODELIST"]));
    assert_eq!(e, SourceError::MissingSlurmNodelist { world_size: 8 });
    assert!(e.to_string().contains("MASTER_ADDR"));
    // Fine with MASTER_ADDR...
    let d = ok(&none(), &with(&without(SLURM_ENV, &["SLURM_JOB_NODELIST"]), &[("MASTER_ADDR", "head")]));
    assert_eq!(d.master_addr, "head");
    // ...or with a single task.
    let d = ok(&none(), &[("SLURM_PROCID", "0"), ("SLURM_NTASKS", "1")]);
    assert_eq!(d.master_addr, DEFAULT_MASTER_ADDR);
    assert_eq!(d.master_port, DEFAULT_MASTER_PORT);
    assert!(d.warnings.is_empty());
}

#[test]
fn slurm_honours_master_env() {
    let d = ok(&none(), &with(SLURM_ENV, &[("MASTER_ADDR", "10.1.1.1"), ("MASTER_PORT", "4000")]));
    assert_eq!((d.master_addr.as_str(), d.master_port), ("10.1.1.1", 4000));
}

#[test]
fn open_mpi_alone() {
    let env = [
        ("OMPI_COMM_WORLD_RANK", "2"),
        ("OMPI_COMM_WORLD_SIZE", "4"),
        ("OMPI_COMM_WORLD_LOCAL_RANK", "0"),
        ("OMPI_COMM_WORLD_LOCAL_SIZE", "2"),
        ("MASTER_ADDR", "mpi-head"),
    ];
    let d = ok(&none(), &env);
    assert_eq!(
        d,
        Detected {
            source: LaunchSource::OpenMpi,
            rank: 2,
            world_size: 4,
            local_rank: Some(0),
            local_world_size: Some(2),
            master_addr: "mpi-head".into(),
            master_port: DEFAULT_MASTER_PORT,
            run_id: None,
            warnings: vec![],
        }
    );
}

#[test]
fn open_mpi_without_master_addr() {
    let env = [("OMPI_COMM_WORLD_RANK", "2"), ("OMPI_COMM_WORLD_SIZE", "4"), ("MASTER_PORT", "4000")];
    let e = err(&none(), &env);
    assert_eq!(e, SourceError::NoMasterAddr { launcher: "Open MPI" });
    assert_eq!(
        e.to_string(),
        "Open MPI sets no master address: set MASTER_ADDR (and MASTER_PORT) or pass --master-addr"
    );
    // An explicit address satisfies it.
    let ex = Explicit { master_addr: flag("head".to_string(), "--master-addr"), ..none() };
    let d = ok(&ex, &env);
    assert_eq!((d.master_addr.as_str(), d.master_port), ("head", 4000));
    // A single rank needs no master.
    let d = ok(&none(), &[("OMPI_COMM_WORLD_RANK", "0"), ("OMPI_COMM_WORLD_SIZE", "1")]);
    assert_eq!(d.master_addr, DEFAULT_MASTER_ADDR);
}

#[test]
fn pmi_alone() {
    let env = [
        ("PMI_RANK", "1"),
        ("PMI_SIZE", "2"),
        ("MPI_LOCALRANKID", "1"),
        ("MPI_LOCALNRANKS", "2"),
        ("MASTER_ADDR", "hydra-head"),
        ("MASTER_PORT", "23456"),
    ];
    let d = ok(&none(), &env);
    assert_eq!(d.source, LaunchSource::Pmi);
    assert_eq!((d.rank, d.world_size, d.local_rank, d.local_world_size), (1, 2, Some(1), Some(2)));
    assert_eq!((d.master_addr.as_str(), d.master_port), ("hydra-head", 23456));
    assert_eq!(d.run_id, None);
    let e = err(&none(), &[("PMI_RANK", "1"), ("PMI_SIZE", "2")]);
    assert_eq!(e, SourceError::NoMasterAddr { launcher: "PMI" });
}

// ---- precedence ----

#[test]
fn torchrun_inside_slurm() {
    let env = with(SLURM_ENV, TORCH);
    let d = ok(&none(), &env);
    assert_eq!(d.source, LaunchSource::Torchrun);
    assert_eq!((d.rank, d.world_size), (3, 8));
    assert_eq!((d.master_addr.as_str(), d.master_port), ("10.0.0.1", 29400));
    assert_eq!(d.run_id.as_deref(), Some("run-42"));
    assert_eq!(
        d.warnings,
        vec!["ignoring Slurm variables (SLURM_PROCID, SLURM_NTASKS): torchrun variables take precedence".to_string()]
    );
}

#[test]
fn lower_partial_source_is_only_a_warning() {
    // e.g. torchrun inside salloc, which sets SLURM_NTASKS but not SLURM_PROCID
    let env = with(TORCH, &[("SLURM_NTASKS", "4"), ("OMPI_COMM_WORLD_SIZE", "x")]);
    let d = ok(&none(), &env);
    assert_eq!(d.source, LaunchSource::Torchrun);
    assert_eq!(
        d.warnings,
        vec![
            "ignoring Slurm variables (SLURM_NTASKS): torchrun variables take precedence".to_string(),
            "ignoring Open MPI variables (OMPI_COMM_WORLD_SIZE): torchrun variables take precedence".to_string(),
        ]
    );
}

#[test]
fn slurm_over_mpi() {
    // srun with PMI: both say the same, and Slurm's stay (they disagree under mpirun in an
    // sbatch script: `mpirun_inside_an_sbatch_script_uses_the_mpi_rank`).
    let env = with(SLURM_ENV, &[("PMI_RANK", "5"), ("PMI_SIZE", "8")]);
    let d = ok(&none(), &env);
    assert_eq!(d.source, LaunchSource::Slurm);
    assert_eq!(
        d.warnings,
        vec!["ignoring PMI variables (PMI_RANK, PMI_SIZE): Slurm variables take precedence".to_string()]
    );
}

#[test]
fn flags_over_env() {
    let ex = Explicit {
        rank: flag(1, "--rank"),
        world_size: flag(2, "--world-size"),
        master_addr: flag("flag-host".to_string(), "--master-addr"),
        master_port: flag(1111, "--master-port"),
        ..none()
    };
    let d = ok(&ex, &with(SLURM_ENV, TORCH));
    assert_eq!(d.source, LaunchSource::Flags);
    assert_eq!((d.rank, d.world_size), (1, 2));
    assert_eq!((d.local_rank, d.local_world_size), (None, None));
    assert_eq!((d.master_addr.as_str(), d.master_port), ("flag-host", 1111));
    assert_eq!(d.run_id, None);
    assert_eq!(
        d.warnings,
        vec![
            "ignoring torchrun variables (RANK, WORLD_SIZE): command-line flags take precedence".to_string(),
            "ignoring Slurm variables (SLURM_PROCID, SLURM_NTASKS): command-line flags take precedence".to_string(),
        ]
    );
}

#[test]
fn explicit_source_uses_env_master() {
    let ex = Explicit { rank: flag(0, "--rank"), world_size: flag(2, "--world-size"), ..none() };
    let d = ok(&ex, &[("MASTER_ADDR", "envhost"), ("MASTER_PORT", "2222")]);
    assert_eq!((d.master_addr.as_str(), d.master_port), ("envhost", 2222));
    assert!(d.warnings.is_empty());
    // and warns when it must default with world > 1
    let d = ok(&ex, &[]);
    assert_eq!(d.master_addr, DEFAULT_MASTER_ADDR);
    assert_eq!(d.warnings.len(), 1);
}

#[test]
fn explicit_master_over_env_master() {
    let ex = Explicit {
        master_addr: conf("cfg-host".to_string(), "master_addr in shardwise.toml"),
        master_port: conf(3333, "master_port in shardwise.toml"),
        ..none()
    };
    let d = ok(&ex, TORCH);
    assert_eq!(d.source, LaunchSource::Torchrun);
    assert_eq!((d.master_addr.as_str(), d.master_port), ("cfg-host", 3333));
    // Explicit master applies with Slurm too, skipping the derivation.
    let d = ok(&ex, SLURM_ENV);
    assert_eq!((d.master_addr.as_str(), d.master_port), ("cfg-host", 3333));
    // And with no source at all.
    let d = ok(&ex, &[]);
    assert_eq!(d.source, LaunchSource::None);
    assert_eq!((d.master_addr.as_str(), d.master_port), ("cfg-host", 3333));
}

#[test]
fn config_origin() {
    let ex = Explicit {
        rank: conf(2, "rank in shardwise.toml"),
        world_size: conf(4, "world_size in shardwise.toml"),
        local_rank: conf(0, "local_rank in shardwise.toml"),
        local_world_size: conf(1, "local_world_size in shardwise.toml"),
        master_addr: conf("h".to_string(), "master_addr in shardwise.toml"),
        ..none()
    };
    let d = ok(&ex, &[("RANK", "0"), ("WORLD_SIZE", "1")]);
    assert_eq!(d.source, LaunchSource::Config);
    assert_eq!((d.rank, d.world_size, d.local_rank, d.local_world_size), (2, 4, Some(0), Some(1)));
    assert_eq!(
        d.warnings,
        vec!["ignoring torchrun variables (RANK, WORLD_SIZE): config-file settings take precedence".to_string()]
    );
    // Source follows rank's origin when rank and world differ in origin.
    let ex = Explicit { rank: flag(0, "--rank"), world_size: conf(1, "world_size in shardwise.toml"), ..none() };
    assert_eq!(ok(&ex, &[]).source, LaunchSource::Flags);
    let ex = Explicit { rank: conf(0, "rank in shardwise.toml"), world_size: flag(1, "--world-size"), ..none() };
    assert_eq!(ok(&ex, &[]).source, LaunchSource::Config);
}

#[test]
fn explicit_local_values_override_env() {
    let ex =
        Explicit { local_rank: flag(0, "--local-rank"), local_world_size: flag(4, "--local-world-size"), ..none() };
    let d = ok(&ex, TORCH);
    assert_eq!(d.source, LaunchSource::Torchrun);
    assert_eq!((d.local_rank, d.local_world_size), (Some(0), Some(4)));
    let ex = Explicit { local_rank: flag(2, "--local-rank"), ..none() };
    let e = err(&ex, TORCH);
    assert_eq!(
        e,
        SourceError::LocalRankOutOfRange {
            local_rank: 2,
            local_rank_name: "--local-rank".into(),
            local_world_size: 2,
            local_world_name: "LOCAL_WORLD_SIZE".into()
        }
    );
}

// ---- partial sources ----

#[test]
fn partial_torchrun() {
    let e = err(&none(), &[("RANK", "2")]);
    assert_eq!(
        e,
        SourceError::IncompleteSource {
            launcher: "torchrun",
            set_name: "RANK".into(),
            set_value: "2".into(),
            missing: "WORLD_SIZE".into()
        }
    );
    assert!(e.to_string().starts_with("RANK=2 is set but WORLD_SIZE is not: the torchrun source is incomplete"), "{e}");
    let e = err(&none(), &[("WORLD_SIZE", "4")]);
    assert!(e.to_string().starts_with("WORLD_SIZE=4 is set but RANK is not"), "{e}");
    // A partial higher source is an error even if a lower one is complete.
    let e = err(&none(), &with(SLURM_ENV, &[("RANK", "1")]));
    assert!(matches!(e, SourceError::IncompleteSource { launcher: "torchrun", .. }), "{e}");
}

#[test]
fn partial_slurm_mpi_pmi() {
    let e = err(&none(), &[("SLURM_PROCID", "0")]);
    assert_eq!(
        e.to_string(),
        "SLURM_PROCID=0 is set but SLURM_NTASKS (or SLURM_NPROCS) is not: the Slurm source is incomplete (rank and world size must be given together)"
    );
    let e = err(&none(), &[("SLURM_NPROCS", "4")]);
    assert!(e.to_string().starts_with("SLURM_NPROCS=4 is set but SLURM_PROCID is not"), "{e}");
    let e = err(&none(), &[("OMPI_COMM_WORLD_SIZE", "4")]);
    assert!(
        e.to_string().starts_with("OMPI_COMM_WORLD_SIZE=4 is set but OMPI_COMM_WORLD_RANK is not: the Open MPI source"),
        "{e}"
    );
    let e = err(&none(), &[("PMI_RANK", "0")]);
    assert!(e.to_string().starts_with("PMI_RANK=0 is set but PMI_SIZE is not: the PMI source"), "{e}");
}

#[test]
fn partial_explicit() {
    let e = err(&Explicit { rank: flag(2, "--rank"), ..none() }, TORCH);
    assert_eq!(
        e,
        SourceError::IncompleteSource {
            launcher: "command-line",
            set_name: "--rank".into(),
            set_value: "2".into(),
            missing: "a world size".into()
        }
    );
    let e = err(&Explicit { world_size: conf(4, "world_size in shardwise.toml"), ..none() }, &[]);
    assert!(
        e.to_string().starts_with("world_size in shardwise.toml=4 is set but a rank is not: the config-file source"),
        "{e}"
    );
}

// ---- numbers ----

#[test]
fn non_integer_values() {
    for (var, value) in [
        ("RANK", "one"),
        ("RANK", "-1"),
        ("RANK", ""),
        ("RANK", "1.5"),
        ("WORLD_SIZE", "0x10"),
        ("LOCAL_RANK", "a"),
        ("LOCAL_WORLD_SIZE", "+2"),
    ] {
        let env = with(TORCH, &[(var, value)]);
        let e = err(&none(), &env);
        assert_eq!(e, SourceError::NotANonNegativeInteger { name: var.into(), value: value.into() }, "{var}={value}");
        assert!(e.to_string().contains("expected a non-negative integer"), "{e}");
        assert!(e.to_string().contains(var), "{e}");
    }
    for (var, value) in [("SLURM_PROCID", "x"), ("SLURM_NTASKS", "x"), ("SLURM_LOCALID", "x")] {
        let e = err(&none(), &with(SLURM_ENV, &[(var, value)]));
        assert_eq!(e, SourceError::NotANonNegativeInteger { name: var.into(), value: value.into() });
    }
    for (var, env) in [
        (
            "OMPI_COMM_WORLD_LOCAL_SIZE",
            &[("OMPI_COMM_WORLD_RANK", "0"), ("OMPI_COMM_WORLD_SIZE", "1"), ("OMPI_COMM_WORLD_LOCAL_SIZE", "z")],
        ),
        ("MPI_LOCALRANKID", &[("PMI_RANK", "0"), ("PMI_SIZE", "1"), ("MPI_LOCALRANKID", "z")]),
    ] {
        let e = err(&none(), env);
        assert!(matches!(e, SourceError::NotANonNegativeInteger { ref name, .. } if name == var), "{e}");
    }
    // Surrounding whitespace is tolerated.
    let d = ok(&none(), &with(TORCH, &[("RANK", " 3 ")]));
    assert_eq!(d.rank, 3);
    // Too large for u32.
    let e = err(&none(), &with(TORCH, &[("WORLD_SIZE", "4294967296")]));
    assert!(matches!(e, SourceError::NumberTooLarge { ref name, max: 4294967295, .. } if name == "WORLD_SIZE"), "{e}");
}

#[test]
fn explicit_negative_or_huge() {
    let ex = Explicit { rank: flag(-1, "--rank"), world_size: flag(2, "--world-size"), ..none() };
    let e = err(&ex, &[]);
    assert_eq!(e, SourceError::NotANonNegativeInteger { name: "--rank".into(), value: "-1".into() });
    assert_eq!(e.to_string(), "--rank is `-1`: expected a non-negative integer");
    let ex = Explicit { rank: flag(0, "--rank"), world_size: flag(1 << 40, "--world-size"), ..none() };
    assert!(matches!(err(&ex, &[]), SourceError::NumberTooLarge { .. }));
    let ex = Explicit { local_rank: flag(-3, "--local-rank"), ..none() };
    assert!(matches!(err(&ex, &[]), SourceError::NotANonNegativeInteger { .. }));
}

#[test]
fn rank_not_below_world() {
    let e = err(&none(), &with(TORCH, &[("RANK", "8")]));
    assert_eq!(
        e,
        SourceError::RankOutOfRange {
            rank: 8,
            rank_name: "RANK".into(),
            world_size: 8,
            world_name: "WORLD_SIZE".into()
        }
    );
    let msg = e.to_string();
    assert!(msg.contains("rank 8") && msg.contains("world size 8"), "{msg}");
    let e = err(&none(), &with(SLURM_ENV, &[("SLURM_PROCID", "9")]));
    assert!(matches!(e, SourceError::RankOutOfRange { rank: 9, world_size: 8, .. }));
    let ex = Explicit { rank: flag(5, "--rank"), world_size: conf(3, "world_size in shardwise.toml"), ..none() };
    let e = err(&ex, &[]);
    assert!(
        e.to_string().contains("(from --rank)") && e.to_string().contains("(from world_size in shardwise.toml)"),
        "{e}"
    );
}

#[test]
fn zero_world_sizes() {
    let e = err(&none(), &with(TORCH, &[("WORLD_SIZE", "0"), ("RANK", "0")]));
    assert_eq!(e, SourceError::ZeroWorldSize { name: "WORLD_SIZE".into() });
    let e = err(&none(), &with(TORCH, &[("LOCAL_WORLD_SIZE", "0")]));
    assert_eq!(e, SourceError::ZeroLocalWorldSize { name: "LOCAL_WORLD_SIZE".into() });
    let e = err(&none(), &with(SLURM_ENV, &[("SLURM_NTASKS_PER_NODE", "0")]));
    assert_eq!(e, SourceError::ZeroLocalWorldSize { name: "SLURM_NTASKS_PER_NODE".into() });
}

#[test]
fn local_values_beyond_the_world() {
    // A job's tasks per node may exceed a step's tasks (`srun -n 2` in `--ntasks-per-node=8`).
    let d =
        ok(&none(), &with(SLURM_ENV, &[("SLURM_NTASKS", "2"), ("SLURM_PROCID", "1"), ("SLURM_NTASKS_PER_NODE", "8")]));
    assert_eq!((d.world_size, d.local_world_size), (2, Some(8)));
    let e = err(&none(), &without(&with(TORCH, &[("LOCAL_RANK", "8")]), &["LOCAL_WORLD_SIZE"]));
    assert!(e.to_string().contains("LOCAL_RANK = 8 does not fit in a world of 8 ranks (from WORLD_SIZE)"), "{e}");
}

#[test]
fn local_rank_not_below_local_world() {
    let e = err(&none(), &with(TORCH, &[("LOCAL_RANK", "2")]));
    assert!(matches!(e, SourceError::LocalRankOutOfRange { local_rank: 2, local_world_size: 2, .. }));
    let e = err(&none(), &with(SLURM_ENV, &[("SLURM_LOCALID", "2")]));
    assert!(
        matches!(e, SourceError::LocalRankOutOfRange { ref local_world_name, .. } if local_world_name == "SLURM_NTASKS_PER_NODE")
    );
    // Unknown local world: no check.
    let d = ok(&none(), &without(&with(TORCH, &[("LOCAL_RANK", "7")]), &["LOCAL_WORLD_SIZE"]));
    assert_eq!(d.local_rank, Some(7));
}

// ---- ports and addresses ----

#[test]
fn bad_ports() {
    for p in ["0", "70000", "65536", "-1", "99999999999999999999"] {
        let e = err(&none(), &with(TORCH, &[("MASTER_PORT", p)]));
        assert_eq!(e, SourceError::InvalidPort { value: p.into(), origin: "MASTER_PORT".into() }, "{p}");
        assert!(
            e.to_string().contains(p) && e.to_string().contains("MASTER_PORT") && e.to_string().contains("1..=65535")
        );
    }
    let e = err(&none(), &with(TORCH, &[("MASTER_PORT", "http")]));
    assert_eq!(e, SourceError::NotANonNegativeInteger { name: "MASTER_PORT".into(), value: "http".into() });
    for p in [0, 70000, -5] {
        let ex = Explicit { master_port: flag(p, "--master-port"), ..none() };
        let e = err(&ex, TORCH);
        assert_eq!(e, SourceError::InvalidPort { value: p.to_string(), origin: "--master-port".into() });
    }
    let d = ok(&none(), &with(TORCH, &[("MASTER_PORT", "65535")]));
    assert_eq!(d.master_port, 65535);
    let d = ok(&none(), &with(TORCH, &[("MASTER_PORT", "1")]));
    assert_eq!(d.master_port, 1);
}

#[test]
fn empty_master_addr() {
    let e = err(&none(), &with(TORCH, &[("MASTER_ADDR", " ")]));
    assert_eq!(e, SourceError::EmptyMasterAddr { origin: "MASTER_ADDR".into() });
    let ex = Explicit { master_addr: flag(String::new(), "--master-addr"), ..none() };
    assert_eq!(err(&ex, &[]), SourceError::EmptyMasterAddr { origin: "--master-addr".into() });
}

#[test]
fn master_addr_with_a_port_scheme_or_brackets() {
    let torch = |addr: &'static str| with(TORCH, &[("MASTER_ADDR", addr)]);
    for (addr, why) in [
        ("127.0.0.1:4000", "MASTER_PORT"),
        ("head:29500", "MASTER_PORT"),
        ("tcp://head", "scheme"),
        ("a b", "host name"),
    ] {
        let e = err(&none(), &torch(addr)).to_string();
        assert!(e.contains("MASTER_ADDR") && e.contains(addr) && e.contains(why), "{e}");
    }
    assert_eq!(ok(&none(), &torch("[::1]")).master_addr, "::1");
    assert_eq!(ok(&none(), &torch("::1")).master_addr, "::1");
    assert_eq!(ok(&none(), &torch("node-7.cluster")).master_addr, "node-7.cluster");
}

#[test]
fn master_addr_is_not_resolved() {
    let d = ok(&none(), &with(TORCH, &[("MASTER_ADDR", "no-such-host.invalid")]));
    assert_eq!(d.master_addr, "no-such-host.invalid");
}
