#!/usr/bin/env python3
"""Latency of small write + fdatasync calls while another thread writes big batches to the same disk.

    python3 bench/fsync_interference.py --dir /var/tmp/probe --mode big
    python3 bench/fsync_interference.py --dir /var/tmp/probe --mode chunked --chunk-bytes 65536
    python3 bench/fsync_interference.py --dir /var/tmp/probe --mode started
    python3 bench/fsync_interference.py --dir /var/tmp/probe --mode synced --chunk-bytes 262144

The question behind it (issue 3, docs/sync.md): does a node's background write of a shipped
batch (a shard WAL append of a few MB, then fdatasync) hold back the fdatasync of the
delay-mode inserts next to it, and would writing that batch in paced steps help (each step
written and waited for with sync_file_range, as RocksDB's `bytes_per_sync` spreads writeback)?

The foreground writes `--record-bytes` into a pre-zeroed file and fdatasyncs it, `--count` times,
`--pause-ms` apart (a delay-mode insert's outbox append). The background thread, unless
`--mode none`, writes `--batch-bytes` every `--batch-every-ms`: in one write and one fdatasync
(`big`), or in `--chunk-bytes` steps each followed by sync_file_range(WAIT_BEFORE | WRITE |
WAIT_AFTER), then one fdatasync (`chunked`), or in `--chunk-bytes` steps each of whose writeback
is started and not waited for (sync_file_range(WRITE)), then one fdatasync (`started`), or in
`--chunk-bytes` steps each followed by its own fdatasync (`synced`: on a virtual disk whose flush
makes the host flush whatever the guest wrote since the last one, each flush then carries one
step, not the batch). With
`--background-io-class idle` the background thread's I/O priority is the idle class
(ioprio_set), which the `mq-deadline` and `bfq` schedulers serve after every other request.
Prints p50 / p99 / p99.9 / max of the foreground calls in milliseconds. Linux only; the directory should be on the disk in question.
"""

import argparse
import ctypes
import os
import threading
import time

SYNC_FILE_RANGE_WAIT_BEFORE, SYNC_FILE_RANGE_WRITE, SYNC_FILE_RANGE_WAIT_AFTER = 1, 2, 4
SYS_IOPRIO_SET_X86_64, IOPRIO_WHO_PROCESS, IOPRIO_CLASS_IDLE, IOPRIO_CLASS_SHIFT = 251, 1, 3, 13
PREZEROED_BYTES = 8 << 20


def background(args, stop, libc):
    if args.background_io_class == "idle":
        # who = 0: the calling thread (I/O priorities are per thread on Linux).
        value = IOPRIO_CLASS_IDLE << IOPRIO_CLASS_SHIFT
        if libc.syscall(SYS_IOPRIO_SET_X86_64, IOPRIO_WHO_PROCESS, 0, value) != 0:
            raise OSError(ctypes.get_errno(), "ioprio_set failed")
    fd = os.open(os.path.join(args.dir, "background"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    batch = b"x" * args.batch_bytes
    offset = 0
    flags = SYNC_FILE_RANGE_WRITE
    if args.mode == "chunked":
        flags |= SYNC_FILE_RANGE_WAIT_BEFORE | SYNC_FILE_RANGE_WAIT_AFTER
    try:
        while not stop.is_set():
            if args.mode == "big":
                os.write(fd, batch)
            elif args.mode == "synced":
                for start in range(0, len(batch), args.chunk_bytes):
                    os.write(fd, batch[start:start + args.chunk_bytes])
                    os.fdatasync(fd)
            else:
                for start in range(0, len(batch), args.chunk_bytes):
                    piece = batch[start:start + args.chunk_bytes]
                    os.write(fd, piece)
                    if libc.sync_file_range(fd, ctypes.c_longlong(offset + start), ctypes.c_longlong(len(piece)),
                                            flags) != 0:
                        raise OSError(ctypes.get_errno(), "sync_file_range failed")
            os.fdatasync(fd)
            offset += len(batch)
            stop.wait(args.batch_every_ms / 1000)
    finally:
        os.close(fd)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dir", required=True, help="directory on the disk to probe (created if missing)")
    parser.add_argument("--mode", choices=["none", "big", "chunked", "started", "synced"], default="big")
    parser.add_argument("--chunk-bytes", type=int, default=256 * 1024)
    parser.add_argument("--batch-bytes", type=int, default=2_600_000, help="a second's shipped batch")
    parser.add_argument("--batch-every-ms", type=float, default=300)
    parser.add_argument("--record-bytes", type=int, default=3300, help="one 100-row insert as Arrow IPC")
    parser.add_argument("--count", type=int, default=3000)
    parser.add_argument("--background-io-class", choices=["default", "idle"], default="default")
    parser.add_argument("--pause-ms", type=float, default=0.5)
    args = parser.parse_args()
    if args.chunk_bytes <= 0 or args.batch_bytes <= 0 or args.record_bytes <= 0 or args.count <= 0:
        parser.error("sizes and --count must be positive")
    os.makedirs(args.dir, exist_ok=True)
    libc = ctypes.CDLL("libc.so.6", use_errno=True)

    fd = os.open(os.path.join(args.dir, "foreground"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    os.write(fd, b"\0" * PREZEROED_BYTES)
    os.fdatasync(fd)
    os.lseek(fd, 0, os.SEEK_SET)
    stop = threading.Event()
    writer = None
    if args.mode != "none":
        writer = threading.Thread(target=background, args=(args, stop, libc))
        writer.start()
    record = b"y" * args.record_bytes
    latencies = []
    position = 0
    try:
        for _ in range(args.count):
            if position + args.record_bytes > PREZEROED_BYTES:
                os.lseek(fd, 0, os.SEEK_SET)
                position = 0
            started = time.perf_counter()
            os.write(fd, record)
            position += args.record_bytes
            os.fdatasync(fd)
            latencies.append(time.perf_counter() - started)
            time.sleep(args.pause_ms / 1000)
    finally:
        stop.set()
        if writer:
            writer.join()
        os.close(fd)
    latencies.sort()
    at = lambda q: latencies[min(len(latencies) - 1, int(len(latencies) * q))] * 1e3  # noqa: E731
    chunk = f" chunk {args.chunk_bytes}" if args.mode in ("chunked", "started") else ""
    io_class = " idle-class" if args.background_io_class == "idle" else ""
    print(f"{args.mode}{chunk}{io_class}: p50 {at(0.5):.3f} p99 {at(0.99):.3f} p99.9 {at(0.999):.3f} "
          f"max {latencies[-1] * 1e3:.3f} ms")


if __name__ == "__main__":
    main()
