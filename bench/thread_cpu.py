#!/usr/bin/env python3
"""CPU per thread name of running processes, once a second, until they are all gone.

    shardwise bench insert --count 10000 &
    sleep 1.2; bench/thread_cpu.py $(pgrep -f 'shardwise node' | sort -n)

Each line: seconds since start, then `rI:NAME=TICKS` for each process (in the order given) and
thread name that used CPU in that second (ticks of 10 ms: 100 is one whole core). Used for
"What the tail waits for" in BENCHMARKS.md.
"""

import collections
import os
import sys
import time


def sample(pids):
    ticks = collections.Counter()
    for i, pid in enumerate(pids):
        try:
            tids = os.listdir(f"/proc/{pid}/task")
        except OSError:
            continue
        for tid in tids:
            try:
                with open(f"/proc/{pid}/task/{tid}/stat") as f:
                    stat = f.read()
            except OSError:
                continue
            name = stat[stat.index("(") + 1 : stat.rindex(")")]
            fields = stat[stat.rindex(")") + 2 :].split()
            ticks[(i, name)] += int(fields[11]) + int(fields[12])  # utime + stime
    return ticks


def main():
    if len(sys.argv) < 2 or sys.argv[1] in ("-h", "--help"):
        print(__doc__)
        return
    pids = sys.argv[1:]
    before, start = sample(pids), time.time()
    while True:
        time.sleep(1.0)
        now = sample(pids)
        if not now:
            return
        used = {k: v - before.get(k, 0) for k, v in now.items() if v > before.get(k, 0)}
        print(f"{time.time() - start:5.1f} " + " ".join(f"r{i}:{n}={v}" for (i, n), v in sorted(used.items())), flush=True)
        before = now


if __name__ == "__main__":
    main()
