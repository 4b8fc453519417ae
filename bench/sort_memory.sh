#!/bin/bash
# max_memory_usage against a full sort of stored rows: a 3-node cluster, 1 M rows (k BIGINT,
# s VARCHAR, about 20 MB) with replicas = 2 written as parts (OPTIMIZE TABLE FINAL), then
# `SELECT k, s FROM t2 ORDER BY s, k` under each limit; prints the last row or the error.
# usage: bench/sort_memory.sh [SHARDWISE_BINARY] [LIMITS...]   (bytes; default 40 and 80 MB)
set -u
B=${1:-target/release/shardwise}; shift || true
LIMITS=${*:-40000000 80000000}
D=/tmp/sort-memory; rm -rf $D
$B launch --nproc 3 --insecure --data-dir $D > $D.log 2>&1 &
for _ in $(seq 60); do [ "$(grep -c 'listening rank=' $D.log)" -ge 3 ] && break; sleep 1; done
A=$(grep -o 'rank=1 flight=[0-9.:]*' $D.log | cut -d= -f3)
$B sql --connect $A -e "CREATE TABLE t2 (k BIGINT, s VARCHAR) WITH (shard_key = 'k', replicas = 2)" > /dev/null
$B sql --connect $A -e "INSERT INTO t2 SELECT value, 'str' || (value % 1000) FROM generate_series(1, 1000000)" > /dev/null
$B sql --connect $A -e "OPTIMIZE TABLE t2 FINAL" > /dev/null
for limit in $LIMITS; do
  echo "max_memory_usage = $limit: $($B sql --connect $A --format csv \
    -e "SELECT k, s FROM t2 ORDER BY s, k SETTINGS max_memory_usage = $limit" 2>&1 | tail -1 | cut -c1-200)"
done
pkill -f "data-dir $D"; sleep 1; rm -rf $D $D.log
