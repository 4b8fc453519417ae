#!/bin/bash
# What a stopped node (SIGSTOP: it accepts connections and never answers) costs the statements
# that need it, on a 3-node `shardwise launch` cluster: a read of a shard only it holds (plain,
# then with skip_unavailable_shards = 1), an immediate insert with insert_quorum = 1, a flush of a
# delayed table, an immediate insert with the default quorum once the node is listed as down;
# then, with the node running again, the counts. Prints each statement's answer and
# wall time. Usage: bench/stopped_node.sh [SHARDWISE_BINARY] (default: shardwise on PATH).
set -u
BIN=${1:-shardwise}
. "$(dirname "$0")/launch_cluster.sh"
launch_cluster "$BIN" 3 stopped-node
q() {
  local start end
  start=$(date +%s.%N)
  timeout 120 "$BIN" sql --connect "$F0" --format csv -e "$1" 2>&1 | tail -2 | tr '\n' ' '
  end=$(date +%s.%N)
  printf ' [%.2f s]\n' "$(echo "$end - $start" | bc)"
}
q "CREATE TABLE one (k BIGINT, v INT) WITH (shard_key = 'k')"
q "CREATE TABLE two (k BIGINT, v INT) WITH (shard_key = 'k', replicas = 2)"
q "CREATE TABLE later (k BIGINT, v INT) WITH (shard_key = 'k', replicas = 2, sync_mode = 'delay_mode_distributed')"
q "INSERT INTO one SELECT value, 1 FROM generate_series(1, 30000)"
RANK2=$(for p in $(pgrep -P "$LAUNCHER"); do tr '\0' '\n' < "/proc/$p/environ" | grep -qx "RANK=2" && echo "$p"; done)
kill -STOP "$RANK2"
echo "rank 2 (pid $RANK2) stopped"
q "SELECT count(*) FROM one"
q "SELECT count(*) FROM one SETTINGS skip_unavailable_shards = 1"
q "INSERT INTO two SELECT value, 1 FROM generate_series(1, 1000) SETTINGS insert_quorum = 1"
# By now (the reads took a keep-alive timeout each) the membership says rank 2 is down: with the
# default quorum (both replicas) the insert is refused at once, writing nothing.
q "INSERT INTO two SELECT value, 1 FROM generate_series(5001, 5100)"
q "INSERT INTO later SELECT value, 1 FROM generate_series(1, 1000)"
q "SYSTEM FLUSH DISTRIBUTED later SETTINGS flush_timeout_ms = 1000"
kill -CONT "$RANK2"
echo "rank 2 running again"
q "SYSTEM FLUSH DISTRIBUTED two"
q "SYSTEM FLUSH DISTRIBUTED later"
q "SELECT count(*), sum(k) FROM two"
q "SELECT count(*), sum(k) FROM later"
