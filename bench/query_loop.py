#!/usr/bin/env python3
"""Runs queries over and over through ADBC Flight SQL: latency and CPU per query.

    bench/query_loop.py --connect HOST:PORT [--runs 300] [--pids PID,PID...] SQL [SQL ...]

For each SQL, in turn: `--runs` runs on one connection (each: execute, fetch the whole answer),
then its best and median time, and, per query, the CPU time (utime + stime from /proc) that each
of `--pids` (e.g. the node processes of a cluster) and this client spent over the loop. What a
query costs besides its shards' work (planning, round trips) shows over a small table; the
section "Where a small query's fixed cost goes" of BENCHMARKS.md came from it. Runs inside the
venv of groupby_peers.py (made on first use).
"""

import argparse
import os
import sys
import time
import warnings

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import groupby_peers  # noqa: E402  (its venv)


def cpu_seconds(pid):
    """utime + stime of `pid`, in seconds."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--connect", required=True, help="a node's Flight SQL address, HOST:PORT")
    parser.add_argument("--runs", type=int, default=300, help="runs per query")
    parser.add_argument("--pids", default="", help="processes whose CPU time to count, comma separated")
    parser.add_argument("sql", nargs="+", help="queries, each run --runs times")
    args = parser.parse_args()
    groupby_peers.ensure_venv()
    import adbc_driver_flightsql.dbapi as flight_sql

    warnings.filterwarnings("ignore")  # ADBC: "Cannot disable autocommit"
    pids = [int(p) for p in args.pids.split(",") if p]
    conn = flight_sql.connect(f"grpc://{args.connect}", db_kwargs={"username": "default", "password": ""})
    cur = conn.cursor()
    for sql in args.sql:
        times = []
        before = [cpu_seconds(p) for p in pids]
        client_before = time.process_time()
        for _ in range(max(args.runs, 1)):
            started = time.perf_counter()
            cur.execute(sql)
            cur.fetch_arrow_table()
            times.append(time.perf_counter() - started)
        runs = len(times)
        nodes = [(cpu_seconds(p) - b) / runs * 1e3 for p, b in zip(pids, before)]
        client = (time.process_time() - client_before) / runs * 1e3
        times.sort()
        cpu = " ".join(f"{p}:{ms:.2f}" for p, ms in zip(pids, nodes))
        print(f"{sql[:60]!r}: best {times[0] * 1e3:.2f} ms, median {times[runs // 2] * 1e3:.2f} ms; "
              f"CPU ms per query: {cpu or '-'} client:{client:.2f}")
    cur.close()
    conn.close()


if __name__ == "__main__":
    main()
