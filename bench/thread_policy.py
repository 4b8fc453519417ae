#!/usr/bin/env python3
"""Changes the scheduling of running shardwise nodes' threads from outside, for experiments.

    bench/thread_policy.py MODE [--seconds 40] &
    shardwise bench insert --count 10000

Waits for three `shardwise node` processes (those `shardwise bench insert` starts), then, every
0.3 s until --seconds have passed, applies MODE to each of their threads it has not seen yet:
- `idlebg`: the background threads (`shardwise-bg*`) under `SCHED_IDLE`;
- `slice`: the request threads (`tokio-rt-worker`) keep `SCHED_OTHER`, nice 0, with a 100 us
  scheduler slice (`sched_setattr`'s `sched_runtime`, honoured since Linux 6.12);
- `both`: the two;
- `ioidle`: the I/O priority of ranks 1 and 2's threads and of rank 0's background threads set to
  the idle class (`ioprio_set`), which the `mq-deadline` and `bfq` schedulers serve after every
  other request, so that only rank 0's request threads (the inserts) keep the normal class;
- `fifo`: rank 0's request threads (`tokio-rt-worker`, its blocking pool included) and the
  benchmark's client thread (`insert-client`) under `SCHED_FIFO` priority 10, so that they run as
  soon as they wake, ahead of every normal thread on the machine (an upper bound on what any
  CPU scheduling of the insert path can gain; needs CAP_SYS_NICE).
Linux x86-64 only (syscalls 314 and 251). Used for "What the tail waits for" in BENCHMARKS.md.
"""

import argparse
import ctypes
import os
import struct
import time

SCHED_OTHER, SCHED_FIFO, SCHED_IDLE = 0, 1, 5
FIFO_PRIORITY = 10
SYS_SCHED_SETATTR = 314  # x86-64
SYS_IOPRIO_SET = 251  # x86-64
IOPRIO_WHO_PROCESS, IOPRIO_CLASS_IDLE, IOPRIO_CLASS_SHIFT = 1, 3, 13
SLICE_NS = 100_000

libc = ctypes.CDLL(None, use_errno=True)


def sched_setattr(tid, policy, nice, runtime_ns):
    priority = FIFO_PRIORITY if policy == SCHED_FIFO else 0
    attr = struct.pack("IIQiIQQQII", 56, policy, 0, nice, priority, runtime_ns, 0, 0, 0, 0)
    buf = ctypes.create_string_buffer(attr, 56)
    if libc.syscall(SYS_SCHED_SETATTR, tid, buf, 0) != 0:
        print(f"thread {tid}: sched_setattr failed: {os.strerror(ctypes.get_errno())}")


def io_idle(tid):
    # IOPRIO_WHO_PROCESS with a thread id: I/O priorities are per thread on Linux.
    if libc.syscall(SYS_IOPRIO_SET, IOPRIO_WHO_PROCESS, tid, IOPRIO_CLASS_IDLE << IOPRIO_CLASS_SHIFT) != 0:
        print(f"thread {tid}: ioprio_set failed: {os.strerror(ctypes.get_errno())}")


def command_lines():
    """Every running process as (pid, its arguments)."""
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                yield pid, f.read().split(b"\x00")
        except OSError:
            continue


def nodes():
    """The running nodes as (pid, rank)."""
    found = []
    for pid, args in command_lines():
        if b"node" in args and b"--rank" in args[:-1]:
            rank = args[args.index(b"--rank") + 1]
            if rank.isdigit():
                found.append((pid, int(rank)))
    return found


def bench_clients():
    """The running `shardwise bench insert` processes (as rank -1), whose client thread `fifo` raises too."""
    return [(pid, -1) for pid, args in command_lines() if b"bench" in args and b"insert" in args]


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("mode", choices=["idlebg", "slice", "both", "ioidle", "fifo"])
    parser.add_argument("--seconds", type=float, default=40)
    args = parser.parse_args()
    end = time.time() + args.seconds
    pids = []
    while len(pids) < 3 and time.time() < end:
        time.sleep(0.2)
        pids = nodes()
    seen = set()
    while time.time() < end:
        for pid, rank in pids + (bench_clients() if args.mode == "fifo" else []):
            try:
                tids = os.listdir(f"/proc/{pid}/task")
            except OSError:
                continue
            for tid in tids:
                if (pid, tid) in seen:
                    continue
                seen.add((pid, tid))
                try:
                    with open(f"/proc/{pid}/task/{tid}/comm") as f:
                        comm = f.read().strip()
                except OSError:
                    continue
                if args.mode == "fifo":
                    if (rank == 0 and comm.startswith("tokio-rt-worker")) or (rank == -1 and comm == "insert-client"):
                        sched_setattr(int(tid), SCHED_FIFO, 0, 0)
                elif args.mode == "ioidle":
                    if rank != 0 or comm.startswith("shardwise-bg"):
                        io_idle(int(tid))
                elif comm.startswith("shardwise-bg") and args.mode in ("idlebg", "both"):
                    sched_setattr(int(tid), SCHED_IDLE, 0, 0)
                elif comm.startswith("tokio-rt-worker") and args.mode in ("slice", "both"):
                    sched_setattr(int(tid), SCHED_OTHER, 0, SLICE_NS)
        time.sleep(0.3)


if __name__ == "__main__":
    main()
