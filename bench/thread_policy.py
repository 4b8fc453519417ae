#!/usr/bin/env python3
"""Changes the scheduling of running shardwise nodes' threads from outside, for experiments.

    bench/thread_policy.py MODE [--seconds 40] &
    shardwise bench insert --count 10000

Waits for three `shardwise node` processes (those `shardwise bench insert` starts), then, every
0.3 s until --seconds have passed, applies MODE to each of their threads it has not seen yet:
- `idlebg`: the background threads (`shardwise-bg*`) under `SCHED_IDLE`;
- `slice`: the request threads (`tokio-rt-worker`) keep `SCHED_OTHER`, nice 0, with a 100 us
  scheduler slice (`sched_setattr`'s `sched_runtime`, honoured since Linux 6.12);
- `both`: the two.
Linux x86-64 only (syscall 314). Used for "What the tail waits for" in BENCHMARKS.md.
"""

import argparse
import ctypes
import os
import struct
import time

SCHED_OTHER, SCHED_IDLE = 0, 5
SYS_SCHED_SETATTR = 314  # x86-64
SLICE_NS = 100_000

libc = ctypes.CDLL(None, use_errno=True)


def sched_setattr(tid, policy, nice, runtime_ns):
    attr = struct.pack("IIQiIQQQII", 56, policy, 0, nice, 0, runtime_ns, 0, 0, 0, 0)
    buf = ctypes.create_string_buffer(attr, 56)
    if libc.syscall(SYS_SCHED_SETATTR, tid, buf, 0) != 0:
        print(f"thread {tid}: sched_setattr failed: {os.strerror(ctypes.get_errno())}")


def nodes():
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if b"node\x00--rank" in f.read():
                    found.append(pid)
        except OSError:
            pass
    return found


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("mode", choices=["idlebg", "slice", "both"])
    parser.add_argument("--seconds", type=float, default=40)
    args = parser.parse_args()
    end = time.time() + args.seconds
    pids = []
    while len(pids) < 3 and time.time() < end:
        time.sleep(0.2)
        pids = nodes()
    seen = set()
    while time.time() < end:
        for pid in pids:
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
                if comm.startswith("shardwise-bg") and args.mode in ("idlebg", "both"):
                    sched_setattr(int(tid), SCHED_IDLE, 0, 0)
                elif comm.startswith("tokio-rt-worker") and args.mode in ("slice", "both"):
                    sched_setattr(int(tid), SCHED_OTHER, 0, SLICE_NS)
        time.sleep(0.3)


if __name__ == "__main__":
    main()
