#!/usr/bin/env python3
"""Time an ADBC `executemany` of N rows (`INSERT INTO em (id, name, x) VALUES (?, ?, ?)`) on a
fresh 2-node `shardwise launch` cluster of each given binary, in turn.

    python3 bench/executemany.py --rows 1000000 BINARY [BINARY...]

Needs `adbc-driver-flightsql` and `pyarrow` (`pip install adbc-driver-flightsql pyarrow`). The
rows go in 65 536-row batches (ADBC's gRPC client refuses a message over 16 MiB), as an
application handing ADBC a large Arrow table would. Prints, per binary, the seconds the
`executemany` took and the row count the cluster then holds. BENCHMARKS.md, "Prepared-statement
inserts".
"""

import argparse
import os
import re
import shutil
import signal
import subprocess
import tempfile
import threading
import time

import adbc_driver_flightsql.dbapi as flightsql
import pyarrow as pa

SQL = "INSERT INTO em (id, name, x) VALUES (?, ?, ?)"


def start(binary, data_dir):
    proc = subprocess.Popen([binary, "launch", "--nproc", "2", "--insecure", "--data-dir", data_dir],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    deadline = time.time() + 60
    while time.time() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        found = re.search(r"\[rank 0\] listening rank=0 flight=(\S+)", line)
        if found:
            # Keep reading the launcher's output so that it never blocks on a full pipe.
            threading.Thread(target=lambda: [None for _ in proc.stdout], daemon=True).start()
            return proc, found.group(1)
    os.killpg(proc.pid, signal.SIGTERM)
    raise SystemExit(f"{binary}: no rank 0 Flight SQL address within 60 s")


def run(binary, rows):
    data_dir = tempfile.mkdtemp(prefix="executemany-")
    proc, addr = start(binary, data_dir)
    try:
        with flightsql.connect(f"grpc://{addr}") as conn, conn.cursor() as cur:
            cur.execute("CREATE TABLE em (id BIGINT, name VARCHAR, x DOUBLE) WITH (shard_key = 'id')")
            table = pa.table({"id": pa.array(range(rows), pa.int64()),
                              "name": pa.array([f"n{i}" for i in range(rows)]),
                              "x": pa.array([i * 0.5 for i in range(rows)], pa.float64())})
            reader = pa.RecordBatchReader.from_batches(table.schema, table.to_batches(max_chunksize=65536))
            started = time.perf_counter()
            cur.executemany(SQL, reader)
            took = time.perf_counter() - started
            cur.execute("SELECT count(*) FROM em")
            count = cur.fetchall()[0][0]
        print(f"{binary}: {rows} rows in {took:.2f} s ({rows / took:,.0f} rows/s); the table holds {count}")
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=30)
        shutil.rmtree(data_dir, ignore_errors=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("binaries", nargs="+", help="shardwise binaries, each timed on a cluster of its own")
    parser.add_argument("--rows", type=int, default=1_000_000)
    args = parser.parse_args()
    if args.rows <= 0:
        parser.error("--rows must be positive")
    for binary in args.binaries:
        run(binary, args.rows)


if __name__ == "__main__":
    main()
