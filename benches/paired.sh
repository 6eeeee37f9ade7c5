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
# Rounds alternate which build, and whose load, starts first.
# Each round prints both rates, p99 latencies and the CPU µs each process
# spent per request it answered, then the NEW/OLD ratio; the end, the
# median ratio. A build that spends more CPU per request yet runs faster
# is taking CPU from the other (more runnable threads): read the CPU
# column beside the ratio.
#
# LOAD is one of `load.lua`'s, as in compare_nginx.sh: `first` (a new key
# per request, the default), `replay` or `off` (forwarding). BODIES=distinct
# gives each first write a body of its own, ROTATED_KEYS=hold both builds'
# key route the rotated-key guard (docs/requests.md). Installs nginx and wrk from
# Debian's packages if missing; everything listens on 127.0.0.1 on free
# ports, every process started is stopped on exit and the temporary
# directory removed.
set -euo pipefail

[ $# -eq 2 ] || { sed -n '2,26p' "$0" >&2; exit 2; }
OLD=$(realpath "$1")
NEW=$(realpath "$2")
ROUNDS=${ROUNDS:-6}
DURATION=${DURATION:-8s}
LOAD=${LOAD:-first}
[[ $ROUNDS =~ ^[1-9][0-9]*$ ]] || { echo "ROUNDS must be a whole number of at least 1" >&2; exit 2; }
case $LOAD in first | replay | off) ;; *) echo "LOAD is first, replay or off" >&2; exit 2 ;; esac
here=$(cd "$(dirname "$0")" && pwd)

# shellcheck source=benches/rig.sh
. "$here/rig.sh"
need_commands nginx wrk
NGINX=$(command -v nginx || echo /usr/sbin/nginx)
rig_start idemgate-paired

upstream_port=$(free_port)
nginx_config "$dir/upstream.conf" "$dir/upstream" 2 "$(upstream_block "$upstream_port")"
"$NGINX" -p "$dir/upstream" -c "$dir/upstream.conf" -g 'daemon off;' 2>"$dir/upstream/logs/stderr.log" &
pids+=($!)
wait_port "$upstream_port" 60

# Starts build $2 as $1 on a fresh store; sets $addr and $pid.
start() {
    local name=$1 binary=$2
    rm -rf "${dir:?}/$name" && mkdir -p "$dir/$name"
    idemgate_toml "$dir/$name/idemgate.toml" "$dir/$name/idemgate.db" "$upstream_port" full
    "$binary" serve --config "$dir/$name/idemgate.toml" >"$dir/$name/out" 2>"$dir/$name/log" &
    pid=$!
    pids+=("$pid")
    addr=$(listening_address "$dir/$name/out" "$dir/$name/log" 10)
}

# wrk with $LOAD against $1 for $2, key prefix $3; prints wrk's RESULT line.
load() {
    MODE=$LOAD PREFIX=$3 REPLAY_KEYS=64 timeout 300 \
        wrk -t 1 -c 32 -d "$2" -s "$here/load.lua" "http://$1/" | sed -n 's/^RESULT //p'
}


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
echo "$LOAD: new/old median of $ROUNDS rounds: $(median "${ratios[@]}")×"
