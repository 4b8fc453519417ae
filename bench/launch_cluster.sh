# Sourced by the bench scripts that need a local cluster: `launch_cluster BIN NODES NAME` starts
# `BIN launch --nproc NODES` on a fresh data dir under /tmp (removed, with the cluster, when the
# script exits) and waits for every rank to listen. Sets D (the scratch dir), LAUNCHER (its pid)
# and F0 (rank 0's Flight SQL address).
launch_cluster() {
  local bin=$1 nodes=$2 name=$3
  D=$(mktemp -d "/tmp/$name.XXXXXX")
  trap 'kill $(jobs -p) 2>/dev/null; rm -rf "$D"' EXIT
  "$bin" launch --nproc "$nodes" --data-dir "$D/data" --insecure > "$D/log" 2>&1 &
  LAUNCHER=$!
  for _ in $(seq 1 60); do grep -q "listening rank=$((nodes - 1))" "$D/log" 2>/dev/null && break; sleep 0.5; done
  F0=$(grep -o "rank=0 flight=[0-9.:]*" "$D/log" | head -1 | cut -d= -f3)
}
