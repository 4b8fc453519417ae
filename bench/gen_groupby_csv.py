#!/usr/bin/env python3
"""Generate the db-benchmark (H2O) "groupby" data set G1 as CSV, stdlib only.

Usage: gen_groupby_csv.py ROWS OUT.csv [--k 100] [--seed 1]

ROWS may be written as an integer or in scientific notation (1e7). OUT.csv may be
"-" for standard output.

Shape, after h2oai/db-benchmark `_data/groupby-datagen.R` (the R script is run as
`Rscript groupby-datagen.R 1e7 1e2 0 0` for G1_1e7_1e2_0_0.csv), N = ROWS, K = --k:

    column  R expression                          values
    id1     sample(sprintf("id%03d", 1:K), N, TRUE)       K distinct strings  id001..
    id2     sample(sprintf("id%03d", 1:K), N, TRUE)       K distinct strings
    id3     sample(sprintf("id%010d", 1:(N/K)), N, TRUE)  N/K distinct strings id0000000001..
    id4     sample(K, N, TRUE)                            ints 1..K
    id5     sample(K, N, TRUE)                            ints 1..K
    id6     sample(N/K, N, TRUE)                          ints 1..N/K
    v1      sample(5, N, TRUE)                            ints 1..5
    v2      sample(15, N, TRUE)                           ints 1..15
    v3      round(runif(N, max=100), 6)                   float in [0, 100), 6 decimals

Every column is drawn independently and uniformly with replacement, in random
(unsorted) row order, with no NAs: the "_0_0" variant. The header row is
`id1,id2,id3,id4,id5,id6,v1,v2,v3`, as data.table::fwrite writes it.

Differences from the R original (approximations, documented on purpose):
- The random stream is Python's Mersenne Twister seeded with --seed, not R's
  set.seed(108) + sample(): the values are distributed the same way but are not the
  same rows, so the answers to the benchmark's queries differ from the published
  files' answers.
- N/K is taken as max(1, N // K) (R would use as.integer on a double).
- v3 is written like fwrite writes a double: the shortest text that reads back as
  the rounded value, so trailing zeros are dropped ("12.5", not "12.500000").
  Values below 1e-4 that Python would print in exponent form are written as
  fixed-point decimals instead.
- An older revision of the R script drew v2 from 1..5 and rounded v3 to 4
  decimals; this follows the revision with v2 in 1..15 and 6 decimals.

The file is written in chunks of --chunk rows (default 200000), so memory stays
small whatever ROWS is; 1e7 rows (about 0.5 GB) take well under two minutes on one
core of the project machine.
"""

import argparse
import os
import random
import sys
import time

HEADER = "id1,id2,id3,id4,id5,id6,v1,v2,v3\n"


def parse_rows(text):
    """Accept 1000000, 1e6, 1E7, 2.5e6 (must be a whole number >= 1)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError("not a number: %r" % text)
    if value < 1 or value != int(value):
        raise argparse.ArgumentTypeError("ROWS must be a whole number >= 1: %r" % text)
    return int(value)


def positive_int(text):
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError("not an integer: %r" % text)
    if value < 1:
        raise argparse.ArgumentTypeError("must be >= 1: %r" % text)
    return value


def fmt_v3(value):
    """fwrite-like text for round(x, 6): shortest repr, never exponent form."""
    text = repr(value)
    if "e" in text:
        text = ("%.6f" % value).rstrip("0").rstrip(".")
    return text


def write_rows(out, rows, k, seed, chunk):
    rng = random.Random(seed)
    rnd = rng.random
    small = max(1, rows // k)

    id12 = ["id%03d" % i for i in range(1, k + 1)]
    id3 = ["id%010d" % i for i in range(1, small + 1)]
    ints_k = [str(i) for i in range(1, k + 1)]
    ints_small = [str(i) for i in range(1, small + 1)]
    ints_5 = [str(i) for i in range(1, 6)]
    ints_15 = [str(i) for i in range(1, 16)]

    def draw(pop, n):
        # Uniform choice with replacement; equivalent to rng.choices(pop, k=n)
        # but with the bound lookups hoisted.
        m = len(pop)
        return [pop[int(rnd() * m)] for _ in range(n)]

    out.write(HEADER)
    done = 0
    while done < rows:
        n = min(chunk, rows - done)
        c1 = draw(id12, n)
        c2 = draw(id12, n)
        c3 = draw(id3, n)
        c4 = draw(ints_k, n)
        c5 = draw(ints_k, n)
        c6 = draw(ints_small, n)
        c7 = draw(ints_5, n)
        c8 = draw(ints_15, n)
        c9 = [fmt_v3(round(rnd() * 100.0, 6)) for _ in range(n)]
        lines = map(",".join, zip(c1, c2, c3, c4, c5, c6, c7, c8, c9))
        out.write("\n".join(lines))
        out.write("\n")
        done += n


def main(argv=None):
    parser = argparse.ArgumentParser(
        description="Generate db-benchmark groupby (G1) CSV data with a header row.")
    parser.add_argument("rows", type=parse_rows, metavar="ROWS", help="number of data rows, e.g. 1e7")
    parser.add_argument("out", metavar="OUT.csv", help="output file, or - for stdout")
    parser.add_argument("--k", type=positive_int, default=100,
                        help="K: number of groups of id1/id2/id4/id5; id3/id6 get ROWS/K (default 100)")
    parser.add_argument("--seed", type=int, default=1, help="random seed (default 1)")
    parser.add_argument("--chunk", type=positive_int, default=200000,
                        help="rows generated and written per chunk (default 200000)")
    args = parser.parse_args(argv)

    start = time.monotonic()
    if args.out == "-":
        write_rows(sys.stdout, args.rows, args.k, args.seed, args.chunk)
        sys.stdout.flush()
    else:
        tmp = args.out + ".tmp%d" % os.getpid()
        try:
            with open(tmp, "w", encoding="ascii", newline="\n", buffering=1 << 20) as out:
                write_rows(out, args.rows, args.k, args.seed, args.chunk)
            os.replace(tmp, args.out)
        except BaseException:
            try:
                os.unlink(tmp)
            except OSError:
                pass
            raise
    elapsed = time.monotonic() - start
    print("wrote %d rows (K=%d, seed=%d) to %s in %.1f s"
          % (args.rows, args.k, args.seed, args.out, elapsed), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
