#!/usr/bin/env python3
"""PostgreSQL round trips through two builds in turn: each build runs a 1-node cluster, and a
client on a raw socket sends COUNT simple-query `SELECT 1` messages one after another (and COUNT
extended-protocol Parse/Bind/Execute/Sync rounds), timing each until ReadyForQuery. Prints p50 /
p99 per build and the ratio of the second to the first, for rounds alternating between them.

usage: bench/pg_roundtrip.py BASELINE_BINARY CANDIDATE_BINARY [--count N] [--rounds R]
(Made for the message checks in pg/framing.rs: BASELINE without them, CANDIDATE with them.)
"""
import argparse, os, re, shutil, socket, statistics, struct, subprocess, tempfile, time


def free_port():
    s = socket.socket(); s.bind(("127.0.0.1", 0)); p = s.getsockname()[1]; s.close(); return p


def start(binary, d):
    port = free_port()
    log = open(os.path.join(d, "log"), "w")
    p = subprocess.Popen([binary, "node", "--rank", "0", "--world-size", "1", "--master-addr", "127.0.0.1",
                          "--master-port", str(port), "--data-dir", os.path.join(d, "data")],
                         stdout=log, stderr=subprocess.STDOUT)
    for _ in range(300):
        text = open(os.path.join(d, "log")).read()
        m = re.search(r"pg=([0-9.]+):(\d+)", text)
        if m:
            return p, int(m.group(2))
        time.sleep(0.1)
    p.kill(); raise SystemExit(f"{binary}: no pg port in its log")


def msg(t, b): return t + struct.pack("!i", len(b) + 4) + b


def until_ready(s):
    buf = b""
    while True:
        while len(buf) >= 5:
            n = struct.unpack("!i", buf[1:5])[0]
            if len(buf) < n + 1: break
            kind, buf = buf[0:1], buf[n + 1:]
            if kind == b"Z": return
            if kind == b"E": raise SystemExit("error answer")
        chunk = s.recv(65536)
        if not chunk: raise SystemExit("connection closed")
        buf += chunk


def timings(port, count):
    s = socket.create_connection(("127.0.0.1", port)); s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    body = struct.pack("!i", 196608) + b"user\0default\0database\0shardwise\0\0"
    s.sendall(struct.pack("!i", len(body) + 4) + body); until_ready(s)
    simple, extended = [], []
    q = msg(b"Q", b"SELECT 1\0")
    ext = (msg(b"P", b"\0SELECT 1\0\0\0") + msg(b"B", b"\0\0\0\0\0\0\0\0") + msg(b"E", b"\0\0\0\0\0")
           + msg(b"S", b""))
    for _ in range(count):
        t = time.perf_counter(); s.sendall(q); until_ready(s); simple.append(time.perf_counter() - t)
        t = time.perf_counter(); s.sendall(ext); until_ready(s); extended.append(time.perf_counter() - t)
    s.close()
    return simple, extended


def pct(xs, p): xs = sorted(xs); return xs[min(len(xs) - 1, int(len(xs) * p))] * 1000


def main():
    a = argparse.ArgumentParser(); a.add_argument("baseline"); a.add_argument("candidate")
    a.add_argument("--count", type=int, default=2000); a.add_argument("--rounds", type=int, default=3)
    o = a.parse_args()
    for r in range(o.rounds):
        row = {}
        for name, binary in (("baseline", o.baseline), ("candidate", o.candidate)):
            d = tempfile.mkdtemp(prefix="pg-rt-")
            p, port = start(binary, d)
            try:
                row[name] = timings(port, o.count)
            finally:
                p.kill(); p.wait(); shutil.rmtree(d, ignore_errors=True)
        for i, kind in enumerate(("simple", "extended")):
            b, c = row["baseline"][i], row["candidate"][i]
            print(f"round {r + 1} {kind:8}: baseline p50/p99 {pct(b, .5):.3f}/{pct(b, .99):.3f} ms, candidate "
                  f"{pct(c, .5):.3f}/{pct(c, .99):.3f} ms, p50 ratio {pct(c, .5) / pct(b, .5):.2f}")


if __name__ == "__main__":
    main()
