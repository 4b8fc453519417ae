#!/bin/bash
# CPU a query goes on using after max_execution_time_ms stops it: a 2-node `shardwise launch`
# cluster, a nested-loop self-join of 200 000 rows stopped after 2 s, then the initiator's CPU
# (clock ticks, 100 a second) in each 2-s window after. A node that stops the query's work at
# once shows a few ticks; one whose operators run on shows up to 400 (two cores).
# Usage: bench/stopped_query_cpu.sh [SHARDWISE_BINARY] (default: shardwise on PATH).
set -u
BIN=${1:-shardwise}
. "$(dirname "$0")/launch_cluster.sh"
launch_cluster "$BIN" 2 stopped-query
q() { timeout 120 "$BIN" sql --connect "$F0" -e "$1" 2>&1 | tail -1; }
q "CREATE TABLE q (id BIGINT, x DOUBLE) WITH (shard_key = 'id')" > /dev/null
q "INSERT INTO q SELECT value, random() FROM generate_series(1, 200000)" > /dev/null
RANK0=$(for p in $(pgrep -P "$LAUNCHER"); do tr '\0' '\n' < "/proc/$p/environ" | grep -qx "RANK=0" && echo "$p"; done)
ticks() { awk '{print $14 + $15}' "/proc/$RANK0/stat"; }
q "SELECT count(*) FROM q a, q b WHERE a.x + b.x < 0.001 SETTINGS max_execution_time_ms = 2000"
for i in 1 2 3 4 5 6; do
  before=$(ticks); sleep 2
  echo "rank 0, $((2 * i - 2))-$((2 * i)) s after the stop: $(( $(ticks) - before )) ticks"
done
