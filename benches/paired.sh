#!/usr/bin/env bash
# Two builds of idemgate side by side, at the same time: each gets its own
# wrk (1 thread, 32 connections) against the same upstream, and the ratio
# of their rates is the result. Meant for a change to the first-write path,
# whose rate moves by ±20 % from one run to the next on a shared VM: both
# builds share whatever the host does during the run, so the drift that
# swamps sequential runs cancels out of the ratio (an A/A run of one build
# gives 0.97–1.03 here).
#
#   benches/paired.sh OLD_BINARY NEW_BINARY
#   ROUNDS=6 DURATION=8s LOAD=first benches/paired.sh old new
#
# Rounds alternate which build listens where and whose wrk starts first.
# Each round prints both rates, p99 latencies and the CPU µs each process
# spent per request it answered, then the NEW/OLD ratio; the end, the
# median ratio. A build that spends more CPU per request yet runs faster
# is taking CPU from the other (more runnable threads): read the CPU
# column beside the ratio.
#
# LOAD is a `compare_nginx.sh` load: `first` (a new key per request, the
# default), `replay` or `off` (forwarding). Installs nginx and wrk from
# Debian's packages if missing; everything listens on 127.0.0.1 on free
# ports, every process started is stopped on exit and the temporary
# directory removed.
set -euo pipefail

[ $# -eq 2 ] || { sed -n '2,24p' "$0" >&2; exit 2; }
OLD=$(realpath "$1")
NEW=$(realpath "$2")
ROUNDS=${ROUNDS:-6}
DURATION=${DURATION:-8s}
LOAD=${LOAD:-first}
[[ $ROUNDS =~ ^[1-9][0-9]*$ ]] || { echo "ROUNDS must be a whole number of at least 1" >&2; exit 2; }
case $LOAD in first | replay | off) ;; *) echo "LOAD is first, replay or off" >&2; exit 2 ;; esac
here=$(cd "$(dirname "$0")" && pwd)

missing=()
command -v nginx >/dev/null || [ -x /usr/sbin/nginx ] || missing+=(nginx)
command -v wrk >/dev/null || missing+=(wrk)
if [ ${#missing[@]} -gt 0 ]; then
    sudo=
    [ "$(id -u)" -eq 0 ] || sudo=sudo
    $sudo apt-get install -y "${missing[@]}" >&2 ||
        { $sudo apt-get update >&2 && $sudo apt-get install -y "${missing[@]}" >&2; }
fi
NGINX=$(command -v nginx || echo /usr/sbin/nginx)

dir=$(mktemp -d -t idemgate-paired.XXXXXX)
pids=()
cleanup() {
    for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
    for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
    rm -rf "$dir"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# A port nothing listens on, below the ephemeral range (as compare_nginx.sh).
free_port() {
    local port low
    read -r low _ </proc/sys/net/ipv4/ip_local_port_range 2>/dev/null || low=32768
    [ "$low" -gt 11000 ] || low=32768
    for _ in $(seq 100); do
        port=$((10000 + RANDOM % (low - 10000)))
        if ! (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
            echo "$port"
            return
        fi
    done
    echo "no free port found" >&2
    return 1
}

# The upstream: every request is a created resource.
upstream_port=$(free_port)
mkdir -p "$dir/upstream/logs"
cat >"$dir/upstream.conf" <<EOF
worker_processes 2;
pid $dir/upstream/nginx.pid;
error_log $dir/upstream/logs/error.log warn;
events { worker_connections 4096; }
http {
    access_log off;
    client_body_temp_path $dir/upstream/body;
    proxy_temp_path $dir/upstream/proxy;
    fastcgi_temp_path $dir/upstream/fastcgi;
    uwsgi_temp_path $dir/upstream/uwsgi;
    scgi_temp_path $dir/upstream/scgi;
    keepalive_requests 1000000;
    server {
        listen 127.0.0.1:$upstream_port;
        location / {
            default_type application/json;
            return 201 '{"id":1,"status":"created"}';
        }
    }
}
EOF
"$NGINX" -p "$dir/upstream" -c "$dir/upstream.conf" -g 'daemon off;' 2>"$dir/upstream/logs/stderr.log" &
pids+=($!)

# compare_nginx.sh's wrk script, so that the loads are the same.
# shellcheck disable=SC2016 # the `$dir` is compare_nginx.sh's text, matched
sed -n '/^cat >"\$dir\/load.lua" <<.EOF.$/,/^EOF$/p' "$here/compare_nginx.sh" | sed '1d;$d' >"$dir/load.lua"
[ -s "$dir/load.lua" ] || { echo "no wrk script found in compare_nginx.sh" >&2; exit 1; }

# Starts build $2 as $1 on a fresh store; sets $addr and $pid.
start() {
    local name=$1 binary=$2
    rm -rf "${dir:?}/$name" && mkdir -p "$dir/$name"
    cat >"$dir/$name/idemgate.toml" <<EOF
[server]
listen = "127.0.0.1:0"
admin_listen = "127.0.0.1:0"
[store]
url = "sqlite://$dir/$name/idemgate.db"
durability = "full"
[[routes]]
name = "plain"
path_prefix = "/plain"
upstream = "http://127.0.0.1:$upstream_port"
key = "off"
[[routes]]
name = "orders"
path_prefix = "/"
upstream = "http://127.0.0.1:$upstream_port"
EOF
    "$binary" serve --config "$dir/$name/idemgate.toml" >"$dir/$name/out" 2>"$dir/$name/log" &
    pid=$!
    pids+=("$pid")
    addr=
    for _ in $(seq 100); do
        addr=$(sed -n 's/^listening proxy=\([^ ]*\) .*/\1/p' "$dir/$name/out")
        [ -n "$addr" ] && return
        sleep 0.1
    done
    echo "$binary did not start:" >&2
    cat "$dir/$name/log" >&2
    return 1
}

# wrk with $LOAD against $1 for $2, key prefix $3; prints wrk's RESULT line.
load() {
    MODE=$LOAD PREFIX=$3 REPLAY_KEYS=64 timeout 300 \
        wrk -t 1 -c 32 -d "$2" -s "$dir/load.lua" "http://$1/" | sed -n 's/^RESULT //p'
}

cpu_ticks() { sed 's/.*) //' "/proc/$1/stat" | awk '{ print $12 + $13 }'; }

hz=$(getconf CLK_TCK)
ratios=()
printf '%-5s %-4s %9s %8s %9s   %-4s %9s %8s %9s   %s\n' round "" "req/s" "p99 ms" "CPU µs" "" "req/s" "p99 ms" "CPU µs" "new/old"
for round in $(seq "$ROUNDS"); do
    # Odd rounds start the old build first, even rounds the new one.
    if [ $((round % 2)) -eq 1 ]; then order=(old new); else order=(new old); fi
    declare -A addrs=() procs=()
    for name in "${order[@]}"; do
        if [ "$name" = old ]; then start old "$OLD"; else start new "$NEW"; fi
        addrs[$name]=$addr
        procs[$name]=$pid
    done
    stamp=$(date +%s%N)
    # Warm-up on other keys (replays warm up on their own, so they exist).
    loads=()
    for name in "${order[@]}"; do
        warm=$stamp-$name-warm
        [ "$LOAD" = replay ] && warm=$stamp-$name
        load "${addrs[$name]}" 2s "$warm" >/dev/null &
        loads+=($!)
    done
    wait "${loads[@]}"
    declare -A before=()
    for name in "${order[@]}"; do before[$name]=$(cpu_ticks "${procs[$name]}"); done
    loads=()
    for name in "${order[@]}"; do
        load "${addrs[$name]}" "$DURATION" "$stamp-$name" >"$dir/$name.result" &
        loads+=($!)
    done
    wait "${loads[@]}"
    declare -A rate=() p99=() cpu=()
    for name in old new; do
        read -r r _ p _ _ n <"$dir/$name.result"
        ticks=$(($(cpu_ticks "${procs[$name]}") - ${before[$name]}))
        rate[$name]=$r
        p99[$name]=$p
        cpu[$name]=$(awk -v t="$ticks" -v hz="$hz" -v n="$n" 'BEGIN { printf "%.1f", t * 1e6 / hz / n }')
        kill "${procs[$name]}"
        wait "${procs[$name]}" 2>/dev/null || true
    done
    ratio=$(awk -v a="${rate[old]}" -v b="${rate[new]}" 'BEGIN { printf "%.3f", b / a }')
    ratios+=("$ratio")
    printf '%-5s %-4s %9s %8s %9s   %-4s %9s %8s %9s   %s\n' "#$round" old "${rate[old]}" "${p99[old]}" "${cpu[old]}" \
        new "${rate[new]}" "${p99[new]}" "${cpu[new]}" "$ratio"
done
median=$(printf '%s\n' "${ratios[@]}" | sort -n | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }')
echo "$LOAD: new/old median of $ROUNDS rounds: ${median}×"
