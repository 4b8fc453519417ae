#!/bin/sh
# Which disk writes the delay-mode insert tail follows: `shardwise bench insert` with rank 0's
# shard stores (its data dir's `tables/`) and ranks 1 and 2's data each on the disk or on tmpfs,
# rank 0's outbox always on the disk.
#
#   bench/stores_on_tmpfs.sh RANK0_STORES OTHERS [BINARY] [COUNT]
#     RANK0_STORES, OTHERS: disk | tmpfs
#
# Rank 0's `tables/` becomes a symlink to /dev/shm as soon as the node has written its IDENTITY
# (before any table exists). Prints the command's delay-mode lines. Used for "What the tail waits
# for" in BENCHMARKS.md. Needs /dev/shm and a disk-backed /var/tmp.
set -eu
r0=$1 others=$2 bin=${3:-target/release/shardwise} count=${4:-10000}
base=/var/tmp/sw-stores-$$ shm=/dev/shm/sw-stores-$$
trap 'rm -rf "$base" "$shm"' EXIT
mkdir -p "$base/data" "$base/others" "$shm/rank0-tables" "$shm/others"
if [ "$r0" = tmpfs ]; then
  (
    i=0
    while [ $i -lt 4000 ]; do
      if [ -f "$base/data/rank-0/IDENTITY" ]; then
        [ -e "$base/data/rank-0/tables" ] || ln -s "$shm/rank0-tables" "$base/data/rank-0/tables"
        break
      fi
      sleep 0.005
      i=$((i + 1))
    done
  ) &
fi
others_dir="$base/others"
[ "$others" = tmpfs ] && others_dir="$shm/others"
echo "rank 0's shard stores on $r0, ranks 1 and 2 on $others"
"$bin" bench insert --count "$count" --data-dir "$base/data" --others-data-dir "$others_dir" |
  grep -E '^(bare|delay_mode_distributed)|stolen'
if [ "$r0" = tmpfs ] && [ ! -L "$base/data/rank-0/tables" ]; then
  echo "warning: rank 0's tables/ was not on tmpfs (the node made it first)" >&2
fi
