#!/usr/bin/env python3
"""Who held the CPUs while a process's threads waited for one.

    perf sched record -o sched.data -- sleep 12        # while the workload runs
    perf sched timehist -i sched.data > timehist.txt
    bench/sched_blame.py timehist.txt PID [--thread tokio-rt-worker] [--min-delay-ms 1]

Reads `perf sched timehist` output, finds every wake-up of PID's threads (those whose name
starts with --thread) that waited at least --min-delay-ms for a CPU ("sch delay"), and sums,
over those waits, the time each other task ran on any CPU. Prints the count of such waits and
the tasks that ran meanwhile, most first (`<idle>`: a CPU idled while the thread waited, a
wake-up that had not reached it yet). Used for the insert-latency section of BENCHMARKS.md.
"""

import argparse
import collections
import re


def parse(path):
    """(end_s, cpu, task, sch_delay_ms, run_ms) per scheduling slice."""
    rows = []
    with open(path) as f:
        for line in f:
            fields = line.split()
            if len(fields) < 6 or not re.match(r"^\d+\.\d+$", fields[0]):
                continue
            try:
                rows.append((float(fields[0]), fields[1], fields[2], float(fields[4]), float(fields[5])))
            except ValueError:
                continue
    return rows


def process_of(task):
    """`name[tid/pid]` -> `name[pid N]`; `name[pid]` -> `name[pid N]`."""
    task = re.sub(r"\[(-?\d+)/(-?\d+)\]$", lambda m: f"[pid {m.group(2)}]", task)
    return re.sub(r"\[(\d+)\]$", lambda m: f"[pid {m.group(1)}]", task)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("timehist", help="output of `perf sched timehist`")
    parser.add_argument("pid", type=int, help="the process whose threads' waits are explained")
    parser.add_argument("--thread", default="tokio-rt-worker", help="thread name prefix to look at")
    parser.add_argument("--min-delay-ms", type=float, default=1.0, help="shortest wait counted")
    args = parser.parse_args()

    rows = parse(args.timehist)
    slices = sorted((end - run / 1e3, end, task) for end, _, task, _, run in rows)
    suffix = f"/{args.pid}]"
    blame, waits = collections.Counter(), 0
    for end, _, task, delay, run in rows:
        if not (task.startswith(args.thread) and task.endswith(suffix) and delay >= args.min_delay_ms):
            continue
        waits += 1
        wait_end = end - run / 1e3
        wait_start = wait_end - delay / 1e3
        for start, stop, other in slices:
            if start > wait_end:
                break
            overlap = min(stop, wait_end) - max(start, wait_start)
            if overlap > 0:
                blame[process_of(other)] += overlap * 1e3
    print(f"{waits} wake-ups of {args.thread}* in pid {args.pid} waited >= {args.min_delay_ms} ms; meanwhile ran:")
    for task, ms in blame.most_common(15):
        print(f"{ms:9.2f} ms  {task}")


if __name__ == "__main__":
    main()
