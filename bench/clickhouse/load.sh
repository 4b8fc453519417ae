#!/usr/bin/env bash
# Bulk CSV load peer: time ClickHouse (Debian's clickhouse-server 18.16) loading a
# db-benchmark groupby CSV through a Distributed table with synchronous insert.
#
# Usage: bench/clickhouse/load.sh CSV_FILE [--shards 2] [--replicas 1] [--servers N]
#
# Starts throw-away clickhouse-server instances on free loopback ports in a temp dir,
# creates the tables, times
#   clickhouse-client --query "INSERT INTO bench.dist FORMAT CSVWithNames" < CSV_FILE
# (wall clock, servers already up), checks the row count, prints one JSON line on
# stdout and stops the servers. Everything else goes to stderr. See bench/README.md.
#
# Layout: S shards with R replicas each on N servers (default N = S + R - 1: S servers
# for R = 1, 3 servers for S = 2, R = 2). Replica r of shard s lives on server
# (s*R + r) mod N, in database bench_s<s> (table bench_s<s>.local), so a server that
# holds replicas of two shards keeps them apart. The cluster's replicas carry
# <default_database>bench_s<s></default_database>, the Distributed table names
# database '' and <internal_replication>false</internal_replication> makes it write
# every replica itself.
#
# Environment: CLICKHOUSE_SERVER, CLICKHOUSE_CLIENT (binaries), TMPDIR (where the temp
# dir goes), CH_LOAD_START_TIMEOUT (seconds to wait for each server, default 60).

set -euo pipefail

PROG=${0##*/}

usage() {
    cat >&2 <<EOF
usage: $PROG CSV_FILE [--shards 2] [--replicas 1] [--servers N]

  CSV_FILE      db-benchmark groupby CSV with a header row
                (id1,id2,id3,id4,id5,id6,v1,v2,v3), e.g. from bench/gen_groupby_csv.py
  --shards S    number of shards (default 2)
  --replicas R  copies of each shard, all written by the Distributed table (default 1)
  --servers N   number of clickhouse-server processes (default S + R - 1)

Prints one JSON line on stdout:
  {"system":"clickhouse-18.16","shards":S,"replicas":R,"rows":N,"seconds":T,"rows_per_s":X}
EOF
}

log() { printf '[%s +%ss] %s\n' "$PROG" "$SECONDS" "$*" >&2; }
die() { log "error: $*"; exit 1; }

# ---------------------------------------------------------------- arguments
csv=""
shards=2
replicas=1
servers=""

need_value() { [[ $# -ge 2 && -n $2 ]] || { usage; die "$1 needs a value"; }; }

while [[ $# -gt 0 ]]; do
    case $1 in
        --shards) need_value "$@"; shards=$2; shift 2 ;;
        --shards=*) shards=${1#*=}; shift ;;
        --replicas) need_value "$@"; replicas=$2; shift 2 ;;
        --replicas=*) replicas=${1#*=}; shift ;;
        --servers) need_value "$@"; servers=$2; shift 2 ;;
        --servers=*) servers=${1#*=}; shift ;;
        -h|--help) usage; exit 0 ;;
        --) shift; [[ $# -eq 1 && -z $csv ]] || { usage; die "bad arguments"; }; csv=$1; shift ;;
        -*) usage; die "unknown option: $1" ;;
        *) [[ -z $csv ]] || { usage; die "more than one CSV_FILE"; }; csv=$1; shift ;;
    esac
done

[[ -n $csv ]] || { usage; die "CSV_FILE missing"; }
[[ -f $csv && -r $csv ]] || die "cannot read CSV file: $csv"
is_count() { [[ $1 =~ ^[1-9][0-9]*$ ]]; }
is_count "$shards" || die "--shards must be a positive integer: $shards"
is_count "$replicas" || die "--replicas must be a positive integer: $replicas"
[[ -n $servers ]] || servers=$((shards + replicas - 1))
is_count "$servers" || die "--servers must be a positive integer: $servers"
((servers >= replicas)) || die "--servers ($servers) must be >= --replicas ($replicas): replicas of a shard need distinct servers"
((servers <= shards * replicas)) || die "--servers ($servers) must be <= shards*replicas ($((shards * replicas))): a server would hold nothing"

# Absolute path, so the script works from any cwd.
csv_dir=$(cd "$(dirname -- "$csv")" && pwd -P)
csv="$csv_dir/$(basename -- "$csv")"

# ---------------------------------------------------------------- binaries
find_bin() {
    local name=$1 override=$2 dir
    if [[ -n $override ]]; then
        [[ -x $override ]] || die "not executable: $override"
        printf '%s\n' "$override"; return
    fi
    if command -v "$name" >/dev/null 2>&1; then
        command -v "$name"; return
    fi
    # Debian puts the server in /usr/sbin, which a normal user's PATH may lack.
    for dir in /usr/sbin /usr/bin /sbin /usr/local/bin /usr/local/sbin; do
        if [[ -x $dir/$name ]]; then printf '%s\n' "$dir/$name"; return; fi
    done
    die "$name not found; install it: sudo apt-get install -y clickhouse-server clickhouse-client"
}
server_bin=$(find_bin clickhouse-server "${CLICKHOUSE_SERVER:-}")
client_bin=$(find_bin clickhouse-client "${CLICKHOUSE_CLIENT:-}")
start_timeout=${CH_LOAD_START_TIMEOUT:-60}
is_count "$start_timeout" || die "CH_LOAD_START_TIMEOUT must be a positive integer"

# ---------------------------------------------------------------- CSV header
expected_header="id1,id2,id3,id4,id5,id6,v1,v2,v3"
IFS= read -r header < "$csv" || true
header=${header%$'\r'}
header=${header//\"/}
[[ $header == "$expected_header" ]] ||
    die "unexpected CSV header '$header' (want '$expected_header': the db-benchmark groupby schema)"

# ---------------------------------------------------------------- temp dir, cleanup
workdir=$(mktemp -d "${TMPDIR:-/tmp}/ch-load.XXXXXX")
declare -a pids=() ports=()
client_pid=""

dump_logs() {
    local i f
    for ((i = 0; i < ${#pids[@]}; i++)); do
        for f in "$workdir/node$i/log/server.err.log" "$workdir/node$i/stdout.log"; do
            if [[ -s $f ]]; then
                log "---- tail of $f"
                tail -n 20 "$f" >&2 || true
            fi
        done
    done
}

stop_servers() {
    local pid i
    for pid in "${pids[@]}"; do
        kill -TERM "$pid" 2>/dev/null || true
    done
    for pid in "${pids[@]}"; do
        for ((i = 0; i < 300; i++)); do
            kill -0 "$pid" 2>/dev/null || break
            sleep 0.1
        done
        if kill -0 "$pid" 2>/dev/null; then
            log "server pid $pid did not stop in 30 s; killing it"
            kill -KILL "$pid" 2>/dev/null || true
        fi
        wait "$pid" 2>/dev/null || true
    done
    pids=()
}

cleanup() {
    local rc=$?
    trap - EXIT INT TERM HUP
    if [[ -n $client_pid ]]; then
        kill -TERM "$client_pid" 2>/dev/null || true
        wait "$client_pid" 2>/dev/null || true
    fi
    if ((rc != 0)) && [[ -d $workdir ]]; then
        dump_logs
    fi
    stop_servers
    rm -rf -- "$workdir"
    exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
trap 'exit 129' HUP

# ---------------------------------------------------------------- ports
# A port is taken as free when nothing accepts a connection on it. Used ports are
# remembered so two servers never get the same one.
port_in_use() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
pick_port() {
    local p tries
    for ((tries = 0; tries < 200; tries++)); do
        p=$((20000 + RANDOM % 30000))
        [[ " ${ports[*]} " == *" $p "* ]] && continue
        port_in_use "$p" && continue
        printf '%s\n' "$p"; return
    done
    die "no free loopback port found"
}
for ((i = 0; i < servers; i++)); do
    port=$(pick_port) || exit 1
    ports+=("$port")
done

# ---------------------------------------------------------------- configs
xml_escape() {
    local s=$1
    s=${s//&/&amp;}; s=${s//</&lt;}; s=${s//>/&gt;}
    printf '%s' "$s"
}

# Replica r of shard s -> server (s*R + r) mod N. The R replicas of a shard are R
# consecutive slots, so they land on distinct servers as long as R <= N, and the S*R
# slots cover every server as long as N <= S*R. N = S*R gives one replica per server.
node_of() { echo $((($1 * replicas + $2) % servers)); }

remote_servers_xml() {
    local s r n
    echo "    <remote_servers>"
    echo "        <bench>"
    for ((s = 0; s < shards; s++)); do
        echo "            <shard>"
        echo "                <internal_replication>false</internal_replication>"
        for ((r = 0; r < replicas; r++)); do
            n=$(node_of "$s" "$r")
            echo "                <replica>"
            echo "                    <default_database>bench_s$s</default_database>"
            echo "                    <host>127.0.0.1</host>"
            echo "                    <port>${ports[$n]}</port>"
            echo "                </replica>"
        done
        echo "            </shard>"
    done
    echo "        </bench>"
    echo "    </remote_servers>"
}
cluster_xml=$(remote_servers_xml)

for ((i = 0; i < servers; i++)); do
    d="$workdir/node$i"
    mkdir -p "$d/data" "$d/tmp" "$d/user_files" "$d/format_schemas" "$d/log"
    de=$(xml_escape "$d")
    cat >"$d/config.xml" <<EOF
<?xml version="1.0"?>
<yandex>
    <logger>
        <level>warning</level>
        <log>$de/log/server.log</log>
        <errorlog>$de/log/server.err.log</errorlog>
        <size>100M</size>
        <count>1</count>
    </logger>
    <listen_host>127.0.0.1</listen_host>
    <tcp_port>${ports[$i]}</tcp_port>
    <max_connections>256</max_connections>
    <keep_alive_timeout>3</keep_alive_timeout>
    <max_concurrent_queries>32</max_concurrent_queries>
    <uncompressed_cache_size>1073741824</uncompressed_cache_size>
    <mark_cache_size>1073741824</mark_cache_size>
    <path>$de/data/</path>
    <tmp_path>$de/tmp/</tmp_path>
    <user_files_path>$de/user_files/</user_files_path>
    <format_schema_path>$de/format_schemas/</format_schema_path>
    <users_config>$de/users.xml</users_config>
    <default_profile>default</default_profile>
    <default_database>default</default_database>
    <timezone>UTC</timezone>
    <mlock_executable>false</mlock_executable>
    <builtin_dictionaries_reload_interval>3600</builtin_dictionaries_reload_interval>
    <max_session_timeout>3600</max_session_timeout>
    <default_session_timeout>60</default_session_timeout>
$cluster_xml
</yandex>
EOF
    cat >"$d/users.xml" <<'EOF'
<?xml version="1.0"?>
<yandex>
    <profiles>
        <default>
            <max_memory_usage>10000000000</max_memory_usage>
            <use_uncompressed_cache>0</use_uncompressed_cache>
            <load_balancing>random</load_balancing>
            <insert_distributed_sync>1</insert_distributed_sync>
        </default>
    </profiles>
    <users>
        <default>
            <password></password>
            <networks>
                <ip>127.0.0.1</ip>
                <ip>::1</ip>
            </networks>
            <profile>default</profile>
            <quota>default</quota>
        </default>
    </users>
    <quotas>
        <default>
            <interval>
                <duration>3600</duration>
                <queries>0</queries>
                <errors>0</errors>
                <result_rows>0</result_rows>
                <read_rows>0</read_rows>
                <execution_time>0</execution_time>
            </interval>
        </default>
    </quotas>
</yandex>
EOF
done

# ---------------------------------------------------------------- start servers
ch() { # ch NODE_INDEX QUERY  -- run one query, stdin closed
    "$client_bin" --host 127.0.0.1 --port "${ports[$1]}" --query "$2" </dev/null
}

log "$(basename -- "$server_bin") x$servers (shards=$shards replicas=$replicas) on ports ${ports[*]} in $workdir"
for ((i = 0; i < servers; i++)); do
    d="$workdir/node$i"
    # cd into the node's dir: the server may write files relative to its cwd.
    (cd "$d" && exec "$server_bin" --config-file="$d/config.xml") >"$d/stdout.log" 2>&1 &
    pids+=("$!")
done

for ((i = 0; i < servers; i++)); do
    deadline=$((SECONDS + start_timeout))
    until ch "$i" "SELECT 1" >/dev/null 2>&1; do
        kill -0 "${pids[$i]}" 2>/dev/null || die "server $i (port ${ports[$i]}) exited during start-up"
        ((SECONDS < deadline)) || die "server $i (port ${ports[$i]}) not ready after ${start_timeout}s"
        sleep 0.2
    done
done
version=$(ch 0 "SELECT version()")
IFS=. read -r v_major v_minor _ <<<"$version"
system="clickhouse-$v_major.$v_minor"
log "servers up: ClickHouse $version"

# ---------------------------------------------------------------- tables
columns="id1 String, id2 String, id3 String, id4 Int32, id5 Int32, id6 Int32, v1 Int32, v2 Int32, v3 Float64"
for ((s = 0; s < shards; s++)); do
    for ((r = 0; r < replicas; r++)); do
        n=$(node_of "$s" "$r")
        ch "$n" "CREATE DATABASE bench_s$s"
        ch "$n" "CREATE TABLE bench_s$s.local ($columns) ENGINE = MergeTree() ORDER BY tuple()"
    done
done
for ((i = 0; i < servers; i++)); do
    ch "$i" "CREATE DATABASE bench"
    ch "$i" "CREATE TABLE bench.dist ($columns) ENGINE = Distributed(bench, '', local, cityHash64(id1, id2, id3))"
done

# ---------------------------------------------------------------- load
# Expected rows: lines minus the header (plus one if the last line has no newline).
# Counting reads the whole file, so the timed load reads it from the page cache in
# every run (given the memory), not from disk in the first run only.
bytes=$(wc -c <"$csv")
lines=$(wc -l <"$csv")
if [[ $(tail -c 1 "$csv" | od -An -c | tr -d ' ') != '\n' ]]; then lines=$((lines + 1)); fi
expected=$((lines - 1))
log "loading $csv ($bytes bytes) through bench.dist on server 0 (port ${ports[0]}), insert_distributed_sync=1"
# CPU accounting, for stderr only: this machine is shared, so a slow run should be
# told apart from a busy machine.
clk_tck=$(getconf CLK_TCK 2>/dev/null || echo 100)
proc_ticks() { # proc_ticks PID FIRST_FIELD SECOND_FIELD: sum of two /proc/PID/stat fields
    local stat rest
    stat=$(<"/proc/$1/stat") || { echo 0; return; }
    rest=${stat##*) }  # fields from 3 on; comm (field 2) may hold spaces
    awk -v a="$2" -v b="$3" '{ print $(a - 2) + $(b - 2) }' <<<"$rest"
}
servers_ticks() {
    local pid sum=0
    for pid in "${pids[@]}"; do sum=$((sum + $(proc_ticks "$pid" 14 15))); done
    echo "$sum"
}
read -r loadavg_before _ </proc/loadavg
srv0=$(servers_ticks)
cli0=$(proc_ticks "$$" 16 17) # cutime + cstime: children this shell has waited for

# The client runs in the background so that a signal interrupts `wait` at once
# (bash defers traps until a foreground child exits); cleanup kills it.
t0=$(date +%s%N)
"$client_bin" --host 127.0.0.1 --port "${ports[0]}" --insert_distributed_sync=1 \
    --query "INSERT INTO bench.dist FORMAT CSVWithNames" <"$csv" &
client_pid=$!
wait "$client_pid" ||
    { rc=$?; client_pid=""; log "error: INSERT failed (clickhouse-client exit status $rc)"; exit "$rc"; }
t1=$(date +%s%N)
client_pid=""
elapsed_ns=$((t1 - t0))

cli1=$(proc_ticks "$$" 16 17)
srv1=$(servers_ticks)
read -r loadavg_after _ </proc/loadavg
log "$(awk -v c=$((cli1 - cli0)) -v s=$((srv1 - srv0)) -v t="$clk_tck" -v ns="$elapsed_ns" \
    -v la0="$loadavg_before" -v la1="$loadavg_after" -v cores="$(nproc 2>/dev/null || echo '?')" 'BEGIN {
    printf "cpu during load: client %.2f s, servers %.2f s, wall %.2f s; load average %s before, %s after (%s cores)",
        c / t, s / t, ns / 1e9, la0, la1, cores }')"

# ---------------------------------------------------------------- verify
rows=$(ch 0 "SELECT count() FROM bench.dist")
[[ $rows == "$expected" ]] || die "count() from bench.dist is $rows, the CSV has $expected data rows"

total=0
for ((s = 0; s < shards; s++)); do
    first=""
    for ((r = 0; r < replicas; r++)); do
        n=$(node_of "$s" "$r")
        c=$(ch "$n" "SELECT count() FROM bench_s$s.local")
        log "shard $s replica $r (server $n): $c rows"
        if [[ -z $first ]]; then first=$c; total=$((total + c));
        elif [[ $c != "$first" ]]; then die "replicas of shard $s differ: $first vs $c rows"; fi
    done
done
((total == expected)) || die "shards hold $total rows in total, expected $expected"

# ---------------------------------------------------------------- report
json=$(awk -v sys="$system" -v s="$shards" -v r="$replicas" -v n="$rows" -v ns="$elapsed_ns" 'BEGIN {
    sec = ns / 1e9
    printf "{\"system\":\"%s\",\"shards\":%d,\"replicas\":%d,\"rows\":%d,\"seconds\":%.3f,\"rows_per_s\":%d}\n", sys, s, r, n, sec, (sec > 0 ? n / sec + 0.5 : 0)
}')
log "loaded $rows rows in $(awk -v ns="$elapsed_ns" 'BEGIN { printf "%.3f", ns / 1e9 }') s on $servers server(s)"
printf '%s\n' "$json"
