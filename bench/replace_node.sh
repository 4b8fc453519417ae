#!/bin/bash
# Replacing a node whose whole data dir was lost: a 3-node cluster started by hand, 10 million
# rows with replicas = 2; rank RANK (2, a worker, by default; 0 is the master, then also given
# --run-id) is killed, its data dir removed, and a node started on an empty one with
# --replace-node <its old id>. Timed from that start until the node logs that every
# replica it awaited is rebuilt (about 6.7 million rows copied), ROUNDS times. Baseline measured
# in the same run: CREATE TABLE ... AS SELECT of all of it (writes 20 million rows with their
# second replicas), and CHECK TABLE after each round.
# usage: bench/replace_node.sh [SHARDWISE_BINARY] [ROUNDS] [RANK]   (a release build)
set -u
B=${1:-target/release/shardwise}; ROUNDS=${2:-3}; R=${3:-2}; D=/tmp/rnbench; rm -rf $D; mkdir -p $D
PORT=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
node() { # rank, data dir, log, extra args
  ($B node --rank "$1" --world-size 3 --master-addr 127.0.0.1 --master-port "$PORT" --insecure --data-dir "$2" "${@:4}" > "$3" 2>&1 &)
}
for r in 0 1 2; do node $r $D/rank-$r $D/node-$r.log; done
for _ in $(seq 60); do [ "$(cat $D/node-*.log | grep -c 'listening rank=')" -ge 3 ] && break; sleep 1; done
# Statements go through a rank that is not replaced.
A=$(grep -o 'flight=[0-9.:]*' $D/node-$(((R + 1) % 3)).log | head -1 | cut -d= -f2)
q() { $B sql --connect $A --format csv -e "$1"; }
timed() { local s e; s=$(date +%s.%N); q "$1" > $D/out; e=$(date +%s.%N); echo "$e - $s" | bc; }
q "CREATE TABLE big (id BIGINT, name VARCHAR, v DOUBLE) WITH (shard_key = 'id', replicas = 2)"
for i in 0 1 2 3 4; do
  q "INSERT INTO big SELECT value, 'name-' || value, value * 0.5 FROM generate_series($((i * 2000000 + 1)), $(((i + 1) * 2000000)))" > /dev/null
done
q "OPTIMIZE TABLE big" > /dev/null
ctas=$(timed "CREATE TABLE big2 WITH (shard_key = 'id', replicas = 2) AS SELECT * FROM big")
echo "CREATE TABLE AS SELECT (10M rows, 20M with replicas): $ctas s"
q "DROP TABLE big2" > /dev/null
for round in $(seq "$ROUNDS"); do
  OLD=$(q "SELECT node_id FROM system.nodes WHERE rank = $R" | tail -1)
  EXTRA=()
  [ "$R" = 0 ] && EXTRA=(--run-id "$(python3 -c "import json; print(json.load(open('$D/rank-1/cluster.json'))['run_id'])")")
  pkill -9 -f "data-dir $D/rank-$R" ; sleep 1; rm -rf "$D/rank-$R"
  for _ in $(seq 30); do [ "$(q "SELECT state FROM system.nodes WHERE rank = $R" | tail -1)" = down ] && break; sleep 0.5; done
  s=$(date +%s.%N)
  node "$R" "$D/rank-$R" "$D/node-$R.log" --replace-node "$OLD" "${EXTRA[@]}"
  for _ in $(seq 6000); do grep -q "every replica of the data dir this node replaced is rebuilt" "$D/node-$R.log" && break; sleep 0.05; done
  e=$(date +%s.%N); took=$(echo "$e - $s" | bc)
  rows=$(grep "shard replica rebuilt" "$D/node-$R.log" | grep -o 'rows=[0-9]*' | cut -d= -f2 | paste -sd+ | bc)
  echo "round $round: the replacement of rank $R joined and rebuilt $rows rows in $took s ($(echo "scale=2; $took / $ctas" | bc) of the CREATE TABLE AS SELECT); CHECK TABLE after: $(q "CHECK TABLE big" | tail -1); count: $(q "SELECT count(*) FROM big" | tail -1)"
done
pkill -f "data-dir $D"; sleep 5; pkill -9 -f "data-dir $D"
