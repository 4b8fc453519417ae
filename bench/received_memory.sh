#!/bin/bash
# max_server_memory_usage against shard results that arrive large: a 2-node cluster capped at
# CAP bytes per node, ROWS rows of (id, k10, s), then array_agg(repeat(s, REPEAT)) by ten keys
# through rank 0, whose partial states arrive from the shards one group per row. Prints rank 0's
# resident size before, the query's answer or error and time, and rank 0's peak resident size
# (VmRSS sampled every 0.1 s).
# usage: bench/received_memory.sh [SHARDWISE_BINARY] [ROWS] [REPEAT] [CAP]
set -u
B=${1:-target/release/shardwise}; ROWS=${2:-4000000}; REP=${3:-40}; CAP=${4:-800000000}; D=/tmp/rm-bench
rm -rf $D
SHARDWISE_MAX_SERVER_MEMORY_BYTES=$CAP $B launch --nproc 2 --data-dir $D --insecure > $D.log 2>&1 &
for _ in $(seq 60); do [ "$(grep -c 'listening rank=' $D.log)" -ge 2 ] && break; sleep 1; done
A=$(grep -o 'rank=0 flight=[0-9.:]*' $D.log | cut -d= -f3)
L=$(pgrep -f "launch --nproc 2 --data-dir $D"); P0=""
for p in $(pgrep -P $L); do tr '\0' '\n' < /proc/$p/environ | grep -qx 'RANK=0' && P0=$p; done
$B sql --connect $A -e "CREATE TABLE t (id BIGINT, k10 BIGINT, s VARCHAR) WITH (shard_key = 'id')" > /dev/null
$B sql --connect $A -e "INSERT INTO t SELECT value, value % 10, 'str' || (value % 1000) FROM generate_series(1, $ROWS)" > /dev/null
echo "rank 0 before: $(grep VmRSS /proc/$P0/status)"
( peak=0; while kill -0 $P0 2>/dev/null; do
    r=$(awk '/VmRSS/ {print $2}' /proc/$P0/status 2>/dev/null); [ -n "$r" ] && [ "$r" -gt "$peak" ] && peak=$r && echo $peak > $D.peak
    sleep 0.1; done ) &
start=$(date +%s.%N)
$B sql --connect $A --format csv -e "SELECT k10, cardinality(array_agg(repeat(s, $REP))) FROM t GROUP BY k10 ORDER BY k10" 2>&1 | tail -3 | cut -c1-400
echo "query took $(echo "$(date +%s.%N) - $start" | bc) s; rank 0 peak VmRSS $(cat $D.peak) kB (cap $CAP bytes)"
pkill -f "data-dir $D"; sleep 1; rm -rf $D $D.log $D.peak
