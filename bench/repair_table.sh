#!/bin/bash
# REPAIR TABLE rebuilding a node's lost replicas: a 3-node cluster, 10 million rows with
# replicas = 2; rank 2 is killed, its table files removed, restarted by the launcher, and
# `REPAIR TABLE big SETTINGS repair_rebuild_rank = 2` fills its two replicas again (about 6.7
# million rows), ROUNDS times. Baselines measured in the same run: CHECK TABLE of the table, and
# CREATE TABLE ... AS SELECT of all of it (writes 20 million rows with their second replicas).
# usage: bench/repair_table.sh [SHARDWISE_BINARY] [ROUNDS]   (a release build)
set -u
B=${1:-target/release/shardwise}; ROUNDS=${2:-3}; D=/tmp/rbench; rm -rf $D

$B launch --nproc 3 --max-restarts 100 --insecure --data-dir $D > $D.log 2>&1 &
for _ in $(seq 60); do [ "$(grep -c 'listening rank=' $D.log)" -ge 3 ] && break; sleep 1; done
A=$(grep -o 'rank=0 flight=[0-9.:]*' $D.log | head -1 | cut -d= -f3)
q() { $B sql --connect $A --format csv -e "$1"; }
# Seconds `q "$1"` takes; its answer in /tmp/rbench.out.
timed() { local s e; s=$(date +%s.%N); q "$1" > /tmp/rbench.out; e=$(date +%s.%N); echo "$e - $s" | bc; }
q "CREATE TABLE big (id BIGINT, name VARCHAR, v DOUBLE) WITH (shard_key = 'id', replicas = 2)"
for i in 0 1 2 3 4; do
  q "INSERT INTO big SELECT value, 'name-' || value, value * 0.5 FROM generate_series($((i * 2000000 + 1)), $(((i + 1) * 2000000)))" > /dev/null
done
q "OPTIMIZE TABLE big" > /dev/null
check=$(timed "CHECK TABLE big"); echo "CHECK TABLE: $check s, result $(tail -1 /tmp/rbench.out)"
ctas=$(timed "CREATE TABLE big2 WITH (shard_key = 'id', replicas = 2) AS SELECT * FROM big")
echo "CREATE TABLE AS SELECT (10M rows, 20M with replicas): $ctas s"
T=$(q "SELECT id, generation FROM system.tables WHERE name = 'big' FORMAT CSV" | awk -F, '{print "t"$1"-g"$2}')
for round in $(seq "$ROUNDS"); do
  P=$(for p in $(pgrep -f "shardwise node"); do tr '\0' '\n' < /proc/$p/environ | grep -qx RANK=2 && echo $p; done | head -1)
  kill -9 "$P"; rm -rf "$D/rank-2/tables/$T"
  sleep 2
  for _ in $(seq 60); do [ "$(q "SELECT count(*) FROM system.nodes WHERE state = 'up' FORMAT CSV" 2>/dev/null)" = 3 ] && break; sleep 1; done
  repair=$(timed "REPAIR TABLE big SETTINGS repair_rebuild_rank = 2")
  rows=$(awk -F, '$4 == "rebuilt" {s += $6} END {print s}' /tmp/rbench.out)
  after=$(q "CHECK TABLE big" | tail -1)
  echo "round $round: REPAIR TABLE rebuilt $rows rows in $repair s ($(echo "scale=2; $repair / $ctas" | bc) of the CREATE TABLE AS SELECT, $(echo "scale=1; $repair / $check" | bc)x the CHECK TABLE); CHECK TABLE after: $after"
done
pkill -f "data-dir $D"
