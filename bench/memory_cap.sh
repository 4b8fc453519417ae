#!/bin/bash
# max_server_memory_usage against a query whose operators undercount what they hold: a 3-node
# cluster capped at 3 GB per node, db-benchmark's 1e7 rows with replicas = 2, a 10M-group GROUP BY
# with count(DISTINCT); prints each node's resident size before and its peak (VmHWM) after.
# usage: bench/memory_cap.sh [SHARDWISE_BINARY] [CSV]   (a release build; the 1e7-row groupby CSV)
set -u
B=${1:-target/release/shardwise}; CSV=${2:-/tmp/G1_1e7.csv}; rm -rf /tmp/mc

SHARDWISE_MAX_SERVER_MEMORY_BYTES=3000000000 $B launch --nproc 3 --data-dir /tmp/mc --insecure > /tmp/mc.log 2>&1 &
for _ in $(seq 60); do [ "$(grep -c 'listening rank=' /tmp/mc.log)" -ge 3 ] && break; sleep 1; done
A=$(grep -o 'rank=0 flight=[0-9.:]*' /tmp/mc.log | cut -d= -f3)
$B sql --connect $A -e "CREATE TABLE g2 (id1 VARCHAR, id2 VARCHAR, id3 VARCHAR, id4 BIGINT, id5 BIGINT, id6 BIGINT, v1 BIGINT, v2 BIGINT, v3 DOUBLE) WITH (shard_key = 'id6', replicas = 2)"
$B load --connect $A g2 "$CSV" | tail -1
L=$(pgrep -f 'launch --nproc 3 --data-dir /tmp/mc'); NODES=$(pgrep -P $L)
for p in $NODES; do echo "before pid $p $(grep -E 'VmRSS' /proc/$p/status)"; done
start=$(date +%s)
timeout 600 $B sql --connect $A -e "SELECT count(*), sum(s), sum(c), sum(d) FROM (SELECT id4, id5, id6, sum(v1) s, count(*) c, count(distinct id3) d FROM g2 GROUP BY id4,id5,id6)" 2>&1 | tail -5
echo "query took $(( $(date +%s) - start )) s"
for p in $NODES; do echo "after pid $p $(grep -E 'VmHWM|VmRSS' /proc/$p/status | tr '\n' ' ')"; done
$B sql --connect $A -e "SELECT count(*) FROM g2"
pkill -f 'data-dir /tmp/mc'
