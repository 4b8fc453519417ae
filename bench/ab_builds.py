#!/usr/bin/env python3
"""A/B of two shardwise builds on the same queries, in one run.

    bench/ab_builds.py --csv /tmp/G1_1e7.csv --before OLD_BINARY --after NEW_BINARY \
        [--runs 11] [--nodes 2 [--pin]] [--query 'SELECT id1, sum(v1) AS v1 FROM x GROUP BY id1'] ...

Starts a cluster of each binary (`shardwise launch --nproc N`, 1 node by default; with --pin,
rank R runs on core R, as the scaling half of `shardwise bench groupby` pins them), loads the groupby CSV into
table `x` of each (sharded by id6, as `shardwise bench groupby` does), then times each query
through ADBC Flight SQL, the two builds alternating run by run (the first of each pair swaps), so
that the machine's drift weighs on both alike. Prints the best time of each and after/before.
Without --query: db-benchmark's q1-q10. Runs inside the venv of groupby_peers.py (made on first
use). The clusters are stopped on exit.

Two clusters of the same build, loaded alike, can differ by 15-25% on db-benchmark's q10
aggregation (`q10c`, best of 7; BENCHMARKS.md, "A bucket's rows never moved, and the same build
on different clusters"): with --instances N each build gets N
clusters, all alternating, and a build's time is the mean of its clusters' best times (each
cluster's best is printed too). The builds take turns starting first (a cluster started later
ran about 4% slower in an A/A run of 3 clusters each), so an even N cancels that; N is 2 unless
given.

With --cpu it also sums, per query and build, the CPU time (utime + stime, from /proc) the
build's node processes spent during its runs, after waiting --settle-s seconds once both are
loaded (so that the load's background upkeep is over): the work a change removes, which wall
time on a noisy machine can hide.
"""

import argparse
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import groupby_peers  # noqa: E402  (its venv and its query texts)

CREATE = ("CREATE TABLE x (id1 VARCHAR, id2 VARCHAR, id3 VARCHAR, id4 INT, id5 INT, id6 INT, "
          "v1 INT, v2 INT, v3 DOUBLE) WITH (shard_key = 'id6')")
START_TIMEOUT_S = 30


def rank_pids(launcher_pid):
    """{rank: pid} of the nodes a `shardwise launch` started (its children, by their RANK)."""
    ranks = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            if ppid != launcher_pid:
                continue
            with open(f"/proc/{entry}/environ", "rb") as f:
                env = dict(v.split(b"=", 1) for v in f.read().split(b"\0") if b"=" in v)
        except (OSError, ValueError, IndexError):
            continue
        if b"RANK" in env:
            ranks[int(env[b"RANK"])] = int(entry)
    return ranks


def cpu_seconds(pids):
    """utime + stime of `pids`, in seconds (processes that ended count 0)."""
    ticks = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            ticks += int(fields[11]) + int(fields[12])
        except (OSError, ValueError, IndexError):
            continue
    return ticks / os.sysconf("SC_CLK_TCK")


def start(binary, data_dir, csv, nodes, pin):
    """A cluster of `binary` with the CSV loaded; (process, rank 0's flight address)."""
    log_path = data_dir + ".log"
    log = open(log_path, "w")
    command = [binary, "launch", "--nproc", str(nodes), "--data-dir", data_dir]
    proc = subprocess.Popen((["taskset", "-c", "0"] if pin else []) + command,
                            stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.monotonic() + START_TIMEOUT_S
    addr = None
    while addr is None:
        if time.monotonic() > deadline or proc.poll() is not None:
            sys.exit(f"{binary} did not start; see {log_path}")
        time.sleep(0.1)
        text = open(log_path).read()
        found = re.search(r"listening rank=0 flight=(\S+)", text)
        ready = all(f"listening rank={r} " in text for r in range(nodes))
        addr = found and ready and found.group(1)
    if pin:
        pids = rank_pids(proc.pid)
        if sorted(pids) != list(range(nodes)):
            sys.exit(f"{binary}: found ranks {sorted(pids)} of {nodes} to pin")
        cores = os.cpu_count() or 1
        for rank, pid in pids.items():
            subprocess.run(["taskset", "-a", "-p", "-c", str(rank % cores), str(pid)], check=True,
                           capture_output=True)
    for args in (["sql", "--connect", addr, "-e", CREATE], ["load", "--connect", addr, "--no-progress", "x", csv]):
        done = subprocess.run([binary, *args], capture_output=True, text=True)
        if done.returncode != 0:
            sys.exit(f"{binary} {args[0]} failed: {done.stderr.strip()}")
    return proc, addr


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--csv", required=True, help="groupby CSV (bench/gen_groupby_csv.py)")
    parser.add_argument("--before", required=True, help="shardwise binary A")
    parser.add_argument("--after", required=True, help="shardwise binary B")
    parser.add_argument("--runs", type=int, default=11, help="runs per query and build; the best counts")
    parser.add_argument("--query", action="append", help="SQL over table x (repeatable); default q1-q10")
    parser.add_argument("--nodes", type=int, default=1, help="nodes per cluster")
    parser.add_argument("--instances", type=int, default=2,
                        help="clusters per build (even: the builds take turns starting first); a build's "
                             "time is the mean of its clusters' best times")
    parser.add_argument("--pin", action="store_true", help="run rank R (all its threads) on core R only")
    parser.add_argument("--cpu", action="store_true", help="also report the nodes' CPU seconds per query")
    parser.add_argument("--settle-s", type=float, default=10.0, help="with --cpu: wait this long after loading")
    args = parser.parse_args()
    groupby_peers.ensure_venv()
    import adbc_driver_flightsql.dbapi as flight_sql

    queries = args.query or [groupby_peers.SQL[q] for q in groupby_peers.ALL_QUERIES]
    if args.instances < 1:
        sys.exit("--instances must be at least 1")
    work = tempfile.mkdtemp(prefix="shardwise-ab-")
    procs, conns, cursors, build_of = [], [], [], []
    try:
        for instance in range(args.instances):
            # A cluster started later ran 4% slower in an A/A run; the builds take turns going first.
            builds = list(enumerate((("before", args.before), ("after", args.after))))
            for build, (name, binary) in (builds if instance % 2 == 0 else reversed(builds)):
                data_dir = os.path.join(work, f"{name}-{instance}")
                proc, addr = start(os.path.abspath(binary), data_dir, args.csv, args.nodes, args.pin)
                procs.append(proc)
                build_of.append(build)
                conns.append(flight_sql.connect(f"grpc://{addr}", db_kwargs={"username": "default", "password": ""}))
                cursors.append(conns[-1].cursor())
        node_pids = [list(rank_pids(proc.pid).values()) for proc in procs]
        if args.cpu:
            time.sleep(args.settle_s)
        cpu_header = f" {'cpu_before_s':>12} {'cpu_after_s':>11} {'cpu a/b':>7}" if args.cpu else ""
        print(f"{'before_ms':>10} {'after_ms':>10} {'after/before':>12}{cpu_header}  rows  query")
        for sql in queries:
            clusters = len(procs)
            best, rows, cpu = [float("inf")] * clusters, [None] * clusters, [0.0, 0.0]
            for run in range(args.runs):
                # Every cluster once per run; the order reverses from run to run.
                for i in (range(clusters) if run % 2 == 0 else reversed(range(clusters))):
                    cpu_at = cpu_seconds(node_pids[i])
                    started = time.perf_counter()
                    cursors[i].execute(sql)
                    rows[i] = cursors[i].fetch_arrow_table().num_rows
                    best[i] = min(best[i], (time.perf_counter() - started) * 1e3)
                    cpu[build_of[i]] += cpu_seconds(node_pids[i]) - cpu_at
            if len(set(rows)) != 1:
                sys.exit(f"the clusters disagree on {sql!r}: row counts {rows}")
            means = [statistics.mean(b for b, of in zip(best, build_of) if of == build) for build in (0, 1)]
            cpu_cells = ""
            if args.cpu:
                ratio = cpu[1] / cpu[0] if cpu[0] > 0 else float("nan")
                cpu_cells = f" {cpu[0]:12.2f} {cpu[1]:11.2f} {ratio:7.3f}"
            print(f"{means[0]:10.1f} {means[1]:10.1f} {means[1] / means[0]:12.3f}{cpu_cells}  {rows[0]}  {sql}",
                  flush=True)
            if args.instances > 1:
                for build, name in enumerate(("before", "after")):
                    each = ", ".join(f"{b:.1f}" for b, of in zip(best, build_of) if of == build)
                    print(f"{'':>10} {name} per cluster: {each}", flush=True)
    finally:
        for handle in cursors + conns:
            handle.close()
        for proc in procs:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
