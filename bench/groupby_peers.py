#!/usr/bin/env python3
"""db-benchmark groupby q1-q10 on shardwise beside DuckDB, Polars, chDB and DataFusion.

Usage (from the repository root, after `cargo build --release`):

    bench/groupby_peers.py --rows 1e7 [--peers duckdb,polars,chdb,datafusion] [--runs 3]
                           [--threads 2] [--csv FILE] [--svg FILE] [--markdown FILE]

What it does, in one run on an otherwise idle machine:
1. Makes a virtual environment in ~/.cache/shardwise-bench-venv with the peers' Python packages
   (duckdb, polars, chdb, datafusion, pyarrow, and the ADBC Flight SQL driver shardwise is
   queried through), unless it exists; then re-runs itself inside it.
2. Generates the G1 data set (bench/gen_groupby_csv.py: id1..id6, v1..v3 with the published
   distributions) unless --csv names one.
3. Loads it once into each engine: a 1-node shardwise (`shardwise node`, `shardwise load`), and
   DuckDB, Polars, chDB and DataFusion in this process, each limited to --threads threads.
4. Runs every query --runs times per engine and keeps the best. The runs are interleaved (for
   each query, each run goes through every engine in turn), so that the machine's speed, which
   drifts over minutes on a shared host, weighs on every engine alike. The answer is always
   materialized as an Arrow table in this process (shardwise's crosses Flight SQL to get here);
   no count(*) wrapper lets an optimizer skip work.
5. Checks that every engine's answer to a query agrees (row count, and the sum of each numeric
   column within a relative 1e-6) before printing anything; a disagreement is an error.
6. Prints a Markdown table of times (ms), shardwise/peer ratios with geometric means, and the
   ratio to the best peer per query; writes it to --markdown and a bar chart to --svg if asked.
"""

import argparse
import math
import warnings
import os
import shutil
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
VENV = os.path.expanduser("~/.cache/shardwise-bench-venv")
PACKAGES = ["duckdb", "polars", "chdb", "datafusion", "pyarrow", "adbc-driver-flightsql"]
ALL_PEERS = ["duckdb", "polars", "chdb", "datafusion"]
ALL_QUERIES = ["q1", "q2", "q3", "q4", "q5", "q6", "q7", "q8", "q9", "q10"]
QUERIES = list(ALL_QUERIES)  # the ones this run times (--queries)

# The SQL of db-benchmark's DataFusion script; shardwise and DataFusion run it as written.
SQL = {
    "q1": "SELECT id1, sum(v1) AS v1 FROM x GROUP BY id1",
    "q2": "SELECT id1, id2, sum(v1) AS v1 FROM x GROUP BY id1, id2",
    "q3": "SELECT id3, sum(v1) AS v1, avg(v3) AS v3 FROM x GROUP BY id3",
    "q4": "SELECT id4, avg(v1) AS v1, avg(v2) AS v2, avg(v3) AS v3 FROM x GROUP BY id4",
    "q5": "SELECT id6, sum(v1) AS v1, sum(v2) AS v2, sum(v3) AS v3 FROM x GROUP BY id6",
    "q6": "SELECT id4, id5, median(v3) AS median_v3, stddev(v3) AS sd_v3 FROM x GROUP BY id4, id5",
    "q7": "SELECT id3, max(v1) - min(v2) AS range_v1_v2 FROM x GROUP BY id3",
    "q8": "SELECT id6, v3 FROM (SELECT id6, v3, row_number() OVER (PARTITION BY id6 ORDER BY v3 DESC) AS row "
    "FROM x) t WHERE row <= 2",
    "q9": "SELECT id2, id4, pow(corr(v1, v2), 2) AS r2 FROM x GROUP BY id2, id4",
    "q10": "SELECT id1, id2, id3, id4, id5, id6, sum(v3) AS v3, count(*) AS count FROM x "
    "GROUP BY id1, id2, id3, id4, id5, id6",
}

# Where a peer's own best form differs (as in db-benchmark's scripts for that engine).
DUCKDB_SQL = dict(SQL, q8="SELECT id6, unnest(max(v3, 2)) AS v3 FROM x GROUP BY id6")
CHDB_SQL = dict(
    SQL,
    # quantileExactInclusive interpolates between the middle two values, as median() does elsewhere.
    q6="SELECT id4, id5, quantileExactInclusive(0.5)(v3) AS median_v3, stddevSamp(v3) AS sd_v3 FROM x "
    "GROUP BY id4, id5",
    q8="SELECT id6, arrayJoin(arraySlice(arrayReverseSort(groupArray(v3)), 1, 2)) AS v3 FROM x GROUP BY id6",
)

COLUMNS = "id1 String, id2 String, id3 String, id4 Int32, id5 Int32, id6 Int32, v1 Int32, v2 Int32, v3 Float64"
SHARDWISE_CREATE = (
    "CREATE TABLE x (id1 VARCHAR, id2 VARCHAR, id3 VARCHAR, id4 INT, id5 INT, id6 INT, v1 INT, v2 INT, "
    "v3 DOUBLE) WITH (shard_key = 'id6')"
)


def ensure_venv():
    """Re-runs this script inside the benchmark venv, creating it first if needed."""
    python = os.path.join(VENV, "bin", "python")
    if os.path.realpath(sys.prefix) == os.path.realpath(VENV):
        return
    if not os.path.exists(python):
        print(f"# creating {VENV} with {' '.join(PACKAGES)}", file=sys.stderr)
        subprocess.run([sys.executable, "-m", "venv", VENV], check=True)
        subprocess.run([os.path.join(VENV, "bin", "pip"), "install", "-q", *PACKAGES], check=True)
    os.execv(python, [python, *sys.argv])


def parse_rows(text):
    return int(float(text))


# --------------------------------------------------------------------------------------------
# Engines: each loads the CSV once and answers a query with an Arrow table.


class Shardwise:
    name = "shardwise"

    def __init__(self, csv, threads, binary):
        import adbc_driver_flightsql.dbapi as flight

        self.dir = tempfile.mkdtemp(prefix="shardwise-bench-")
        env = dict(os.environ, SHARDWISE_LOG="warn")
        self.node = subprocess.Popen(
            [binary, "node", "--data-dir", os.path.join(self.dir, "node")],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            env=env,
        )
        addr = None
        deadline = time.time() + 60
        while time.time() < deadline:
            line = self.node.stdout.readline()
            if not line:
                break
            if line.startswith("listening"):
                addr = dict(w.split("=", 1) for w in line.split()[1:])["flight"]
                break
        if addr is None:
            raise SystemExit("shardwise node did not start")
        with warnings.catch_warnings():
            # shardwise has no transactions, so the driver cannot turn autocommit off; it says so.
            warnings.simplefilter("ignore")
            self.conn = flight.connect(f"grpc://{addr}")
        with self.conn.cursor() as cur:
            cur.execute(SHARDWISE_CREATE)
        load = subprocess.run([binary, "load", "--connect", addr, "x", csv], stdout=subprocess.DEVNULL,
                              stderr=subprocess.PIPE, text=True)
        if load.returncode != 0:
            raise SystemExit(f"shardwise load failed: {load.stderr}")

    def run(self, query):
        with self.conn.cursor() as cur:
            cur.execute(SQL[query])
            return cur.fetch_arrow_table()

    def close(self):
        self.conn.close()
        self.node.terminate()
        self.node.wait(timeout=30)
        shutil.rmtree(self.dir, ignore_errors=True)


class DuckDB:
    name = "duckdb"

    def __init__(self, csv, threads, binary):
        import duckdb

        self.con = duckdb.connect()
        self.con.execute(f"SET threads = {threads}")
        types = {c.split()[0]: c.split()[1].replace("String", "VARCHAR").replace("Int32", "INTEGER").replace(
            "Float64", "DOUBLE") for c in COLUMNS.split(", ")}
        self.con.execute(f"CREATE TABLE x AS SELECT * FROM read_csv('{csv}', header = true, columns = {types})")

    def run(self, query):
        return self.con.sql(DUCKDB_SQL[query]).to_arrow_table()

    def close(self):
        self.con.close()


class Polars:
    name = "polars"

    def __init__(self, csv, threads, binary):
        import polars as pl

        self.pl = pl
        schema = {"id1": pl.Utf8, "id2": pl.Utf8, "id3": pl.Utf8, "id4": pl.Int32, "id5": pl.Int32,
                  "id6": pl.Int32, "v1": pl.Int32, "v2": pl.Int32, "v3": pl.Float64}
        self.x = pl.read_csv(csv, schema=schema)

    def run(self, query):
        pl, x = self.pl, self.x
        ids = ["id1", "id2", "id3", "id4", "id5", "id6"]
        frames = {
            "q1": lambda: x.group_by("id1").agg(pl.col("v1").sum()),
            "q2": lambda: x.group_by(["id1", "id2"]).agg(pl.col("v1").sum()),
            "q3": lambda: x.group_by("id3").agg(pl.col("v1").sum(), pl.col("v3").mean()),
            "q4": lambda: x.group_by("id4").agg(pl.col("v1").mean(), pl.col("v2").mean(), pl.col("v3").mean()),
            "q5": lambda: x.group_by("id6").agg(pl.col("v1").sum(), pl.col("v2").sum(), pl.col("v3").sum()),
            "q6": lambda: x.group_by(["id4", "id5"]).agg(
                pl.col("v3").median().alias("median_v3"), pl.col("v3").std().alias("sd_v3")),
            "q7": lambda: x.group_by("id3").agg((pl.col("v1").max() - pl.col("v2").min()).alias("range_v1_v2")),
            "q8": lambda: x.drop_nulls("v3").sort("v3", descending=True).group_by("id6").head(2).select(
                ["id6", "v3"]),
            "q9": lambda: x.group_by(["id2", "id4"]).agg((pl.corr("v1", "v2") ** 2).alias("r2")),
            "q10": lambda: x.group_by(ids).agg(pl.col("v3").sum(), pl.len().alias("count")),
        }
        return frames[query]().to_arrow()

    def close(self):
        pass


class ChDB:
    name = "chdb"

    def __init__(self, csv, threads, binary):
        from chdb import session

        self.dir = tempfile.mkdtemp(prefix="chdb-bench-")
        self.sess = session.Session(self.dir)
        self.threads = threads
        self.sess.query(
            f"CREATE TABLE x ENGINE = Memory AS SELECT * FROM file('{csv}', CSVWithNames, '{COLUMNS}')")

    def run(self, query):
        return self.sess.query(f"{CHDB_SQL[query]} SETTINGS max_threads = {self.threads}", "ArrowTable")

    def close(self):
        self.sess.close()
        shutil.rmtree(self.dir, ignore_errors=True)


class DataFusion:
    name = "datafusion"

    def __init__(self, csv, threads, binary):
        import pyarrow as pa
        from datafusion import SessionConfig, SessionContext

        self.ctx = SessionContext(SessionConfig().with_target_partitions(threads))
        schema = pa.schema([("id1", pa.utf8()), ("id2", pa.utf8()), ("id3", pa.utf8()), ("id4", pa.int32()),
                            ("id5", pa.int32()), ("id6", pa.int32()), ("v1", pa.int32()), ("v2", pa.int32()),
                            ("v3", pa.float64())])
        self.ctx.register_csv("csv", csv, schema=schema)
        self.ctx.sql("CREATE TABLE x AS SELECT * FROM csv").collect()

    def run(self, query):
        return self.ctx.sql(SQL[query]).to_arrow_table()

    def close(self):
        pass


ENGINES = {"shardwise": Shardwise, "duckdb": DuckDB, "polars": Polars, "chdb": ChDB, "datafusion": DataFusion}


# --------------------------------------------------------------------------------------------
# Checking and reporting.


def checksum(table):
    """Row count and the sum of every numeric column (in order), as floats. NaN counts as null:
    engines differ on which of the two a one-row group's stddev or corr is."""
    import pyarrow as pa
    import pyarrow.compute as pc

    sums = []
    for column in table.columns:
        if pa.types.is_integer(column.type) or pa.types.is_floating(column.type) or pa.types.is_decimal(
                column.type):
            values = pc.cast(column, pa.float64())
            value = pc.sum(pc.filter(values, pc.is_finite(values))).as_py()
            sums.append(0.0 if value is None else value)
    return table.num_rows, sums


def agree(a, b):
    (rows_a, sums_a), (rows_b, sums_b) = a, b
    if rows_a != rows_b or len(sums_a) != len(sums_b):
        return False
    return all(math.isclose(x, y, rel_tol=1e-6, abs_tol=1e-6) for x, y in zip(sums_a, sums_b))


def geomean(values):
    values = [v for v in values if v and v > 0]
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else float("nan")


def markdown(times, engines, rows, threads, runs):
    peers = [e for e in engines if e != "shardwise"]
    lines = [f"1-node shardwise and peers, G1_{rows:.0e}_1e2_0_0 ({rows:,} rows), {threads} threads each, "
             f"best of {runs}, ms:", ""]
    lines.append("| engine | " + " | ".join(QUERIES) + " | geomean |")
    lines.append("| --- |" + " --- |" * (len(QUERIES) + 1))
    for e in engines:
        cells = [f"{times[e][q]:.0f}" for q in QUERIES]
        lines.append(f"| {e} | " + " | ".join(cells) + f" | {geomean([times[e][q] for q in QUERIES]):.0f} |")
    lines.append("")
    lines.append("shardwise / peer (below 1: shardwise faster):")
    lines.append("")
    lines.append("| peer | " + " | ".join(QUERIES) + " | geomean |")
    lines.append("| --- |" + " --- |" * (len(QUERIES) + 1))
    for p in peers:
        ratios = [times["shardwise"][q] / times[p][q] for q in QUERIES]
        lines.append(f"| {p} | " + " | ".join(f"{r:.2f}" for r in ratios) + f" | {geomean(ratios):.2f} |")
    if peers:
        best = [min(times[p][q] for p in peers) for q in QUERIES]
        ratios = [times["shardwise"][q] / b for q, b in zip(QUERIES, best)]
        lines.append("| best peer | " + " | ".join(f"{r:.2f}" for r in ratios) + f" | {geomean(ratios):.2f} |")
        lines.append("")
        lines.append("Best peer per query: " + ", ".join(
            f"{q} {min(peers, key=lambda p: times[p][q])}" for q in QUERIES) + ".")
    return "\n".join(lines) + "\n"


def svg(times, engines, rows):
    """A grouped bar chart of the times, one group per query, log-scaled."""
    colors = {"shardwise": "#d1495b", "duckdb": "#edae49", "polars": "#00798c", "chdb": "#30638e",
              "datafusion": "#8c6bb1"}
    width, height, left, top, bottom = 960, 420, 60, 40, 60
    plot_w, plot_h = width - left - 20, height - top - bottom
    all_ms = [times[e][q] for e in engines for q in QUERIES]
    lo, hi = math.log10(max(1.0, min(all_ms)) / 1.5), math.log10(max(all_ms) * 1.5)
    y = lambda ms: top + plot_h * (1 - (math.log10(ms) - lo) / (hi - lo))
    group_w = plot_w / len(QUERIES)
    bar_w = group_w * 0.8 / len(engines)
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" font-family="sans-serif" '
           f'font-size="12">',
           f'<rect width="{width}" height="{height}" fill="white"/>',
           f'<text x="{left}" y="20" font-size="14">db-benchmark groupby, {rows:,} rows, ms (log scale, lower is '
           f'better)</text>']
    decade = math.floor(lo)
    while decade <= hi:
        if decade >= lo:
            yy = y(10 ** decade)
            out.append(f'<line x1="{left}" x2="{left + plot_w}" y1="{yy:.1f}" y2="{yy:.1f}" stroke="#ddd"/>')
            out.append(f'<text x="{left - 6}" y="{yy + 4:.1f}" text-anchor="end">{10 ** decade:g}</text>')
        decade += 1
    for i, q in enumerate(QUERIES):
        x0 = left + i * group_w + group_w * 0.1
        for j, e in enumerate(engines):
            ms = times[e][q]
            yy = y(ms)
            out.append(f'<rect x="{x0 + j * bar_w:.1f}" y="{yy:.1f}" width="{bar_w - 1:.1f}" '
                       f'height="{top + plot_h - yy:.1f}" fill="{colors.get(e, "#888")}"><title>{e} {q}: '
                       f'{ms:.0f} ms</title></rect>')
        out.append(f'<text x="{left + (i + 0.5) * group_w:.1f}" y="{top + plot_h + 16}" text-anchor="middle">'
                   f'{q}</text>')
    for j, e in enumerate(engines):
        out.append(f'<rect x="{left + j * 120}" y="{height - 24}" width="12" height="12" '
                   f'fill="{colors.get(e, "#888")}"/>')
        out.append(f'<text x="{left + j * 120 + 16}" y="{height - 14}">{e}</text>')
    out.append("</svg>")
    return "\n".join(out) + "\n"


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", default="1e7", help="rows of the generated data set (default 1e7)")
    parser.add_argument("--csv", help="an existing G1 CSV instead of generating one")
    parser.add_argument("--peers", default=",".join(ALL_PEERS), help="comma separated, of " + ",".join(ALL_PEERS))
    parser.add_argument("--runs", type=int, default=3, help="runs per query; the best is kept")
    parser.add_argument("--threads", type=int, default=2, help="threads per engine")
    parser.add_argument("--queries", default=",".join(ALL_QUERIES), help="comma separated")
    parser.add_argument("--binary", default=os.path.join(ROOT, "target", "release", "shardwise"),
                        help="the shardwise binary (default target/release/shardwise)")
    parser.add_argument("--markdown", help="also write the tables to this file")
    parser.add_argument("--svg", help="write a bar chart to this file")
    args = parser.parse_args()

    peers = [p for p in args.peers.split(",") if p]
    unknown = [p for p in peers if p not in ALL_PEERS]
    if unknown:
        parser.error(f"unknown peers {unknown}; known: {ALL_PEERS}")
    QUERIES[:] = [q for q in args.queries.split(",") if q]
    if any(q not in SQL for q in QUERIES):
        parser.error(f"queries must be among {list(SQL)}")
    if not os.path.exists(args.binary):
        parser.error(f"{args.binary} does not exist: run `cargo build --release` or pass --binary")
    ensure_venv()
    os.environ["POLARS_MAX_THREADS"] = str(args.threads)

    rows = parse_rows(args.rows)
    csv = args.csv or f"/tmp/G1_{args.rows}.csv"
    if not os.path.exists(csv):
        print(f"# generating {csv}", file=sys.stderr)
        subprocess.run([sys.executable, os.path.join(ROOT, "bench", "gen_groupby_csv.py"), str(rows), csv],
                       check=True)

    engines = ["shardwise", *peers]
    times = {name: {} for name in engines}
    answers = {}
    loaded = {}
    try:
        for name in engines:
            print(f"# loading {csv} into {name}", file=sys.stderr)
            loaded[name] = ENGINES[name](csv, args.threads, args.binary)
        for q in QUERIES:
            tables = {}
            for name in engines:
                times[name][q] = float("inf")
            for _ in range(args.runs):
                for name in engines:
                    start = time.perf_counter()
                    tables[name] = loaded[name].run(q)
                    times[name][q] = min(times[name][q], (time.perf_counter() - start) * 1000)
            for name in engines:
                answers[(name, q)] = checksum(tables[name])
                print(f"#   {name} {q}: {times[name][q]:.0f} ms, {tables[name].num_rows} rows", file=sys.stderr)
    finally:
        for engine in loaded.values():
            engine.close()

    wrong = [(name, q) for q in QUERIES for name in engines[1:]
             if not agree(answers[("shardwise", q)], answers[(name, q)])]
    if wrong:
        for name, q in wrong:
            print(f"answers differ on {q}: shardwise {answers[('shardwise', q)]} vs {name} {answers[(name, q)]}",
                  file=sys.stderr)
        sys.exit(1)

    report = markdown(times, engines, rows, args.threads, args.runs)
    print(report)
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write(report)
    if args.svg:
        with open(args.svg, "w") as f:
            f.write(svg(times, engines, rows))


if __name__ == "__main__":
    main()
