//! `shardwise demo`, the README's main job, end to end on a small data set.

use std::time::Duration;

use crate::support::{Proc, shardwise};

/// The row count printed after `-- {what}`'s answer (`N rows in ...`).
fn rows_after(output: &str, what: &str) -> Option<u64> {
    let from = output.find(what)?;
    let line = output[from..].lines().find(|l| l.contains(" rows in ") && l.contains("strategy="))?;
    line.split_whitespace().next()?.parse().ok()
}

#[test]
fn demo_runs_every_mechanism_and_reports_what_each_moved() {
    let mut cmd = shardwise();
    cmd.args(["demo", "--rows", "5000", "--no-progress"]);
    let (code, out) = Proc::spawn(cmd).wait_exit(Duration::from_secs(180));
    assert_eq!(code, Some(0), "{out}");
    for want in [
        "every rank joined and passed the barrier",
        "loaded 5000 rows into sales_now",
        "loaded 5000 rows into sales_later",
        " 0 row copies pending",
        "strategy=initiator_merge",
        "strategy=no_merge,",
        "strategy=no_merge_ordered",
        "strategy=shuffle",
    ] {
        assert!(out.contains(want), "missing {want:?} in:\n{out}");
    }
    // Mode 1 concatenates each shard's groups: at least as many rows as the merged answer;
    // mode 2 keeps the LIMIT; the shuffle and mode 0 agree.
    let merged = rows_after(&out, "-- mode 0").expect("mode 0 row count");
    let concatenated = rows_after(&out, "-- mode 1").expect("mode 1 row count");
    assert!(concatenated >= merged && merged > 0, "mode 0 {merged}, mode 1 {concatenated}");
    assert_eq!(rows_after(&out, "-- mode 2"), Some(5));
    assert_eq!(rows_after(&out, "-- shuffle"), Some(merged));
}
