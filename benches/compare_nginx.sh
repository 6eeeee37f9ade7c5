#!/usr/bin/env bash
# idemgate side by side with nginx as a plain pass-through proxy, measured as
# a new user would: wrk (2 threads, 64 connections) against each, in front of
# the same upstream, in one run; and what one request costs each of them,
# physically: CPU time, context switches and system calls per request, and
# (CALLGRIND=1) instructions per request.
#
#   benches/compare_nginx.sh              # 10 s per measured run, ~1.5 min in all
#   DURATION=30s benches/compare_nginx.sh
#   IDEMGATE=path/to/idemgate benches/compare_nginx.sh   # skip the release build
#   DURABILITIES="full normal" benches/compare_nginx.sh  # also durability "normal"
#   LOADS="first" benches/compare_nginx.sh  # only some of the loads: off, first, replay
#   ROUNDS=3 benches/compare_nginx.sh     # each load 3 times, nginx and idemgate in turn, + the median ratio
#   TOKIO_WORKER_THREADS=2 benches/compare_nginx.sh      # the gateway's async workers
#   STRACE=1 benches/compare_nginx.sh     # + system calls by name (strace -c, short runs)
#   ALLOCS=1 benches/compare_nginx.sh     # + idemgate's heap allocations per request by thread (perf probe)
#   CALLGRIND=1 benches/compare_nginx.sh  # + instructions per request (valgrind, ~3 min)
#   CALLGRIND=1 CALLGRIND_KEEP=DIR benches/compare_nginx.sh  # and keep each load's profile in DIR
#   TMPDIR=/dev/shm LOADS=first benches/compare_nginx.sh  # the store on tmpfs: what the disk's syncs cost (not a deployment)
#   YARDSTICK=path/to/proto benches/compare_nginx.sh     # the yardstick's binary (else built from ../shared/ceiling)
#   YARDSTICK=off benches/compare_nginx.sh               # without the yardstick
#
# The yardstick (../shared/ceiling, `--variant v1`: a minimal durable
# idempotency proxy, one SQLite writer with group commit, synchronous=FULL)
# runs in the same rounds on first writes and replays, between nginx and
# idemgate: a measuring stick for what a durable first write costs on this
# machine, nothing of it copied. Each idemgate row then says its rate as a
# ratio of the yardstick's too ("vs yard"), and for both, per thread
# (perf's --per-thread, by thread name), CPU µs (and the share of it in
# user space, from /proc's clock ticks), context switches and system calls
# per request.
#
# The upstream is an nginx of its own, answering every request 201 with a
# small JSON body: the fastest upstream at hand, so neither proxy waits on it
# and both pay the same for it. It runs apart from the nginx that proxies, so
# that the proxy's counters hold the proxy's work alone. (The idemgate mock
# API would count writes, but it is an in-process Rust server whose per-key
# map grows with every new key: it would tax both sides and skew the
# first-write runs. Exactly-once is what `idemgate bench` checks; this script
# measures speed.)
#
# Loads, each run against nginx pass-through and idemgate (durability "full"
# by default; its default config otherwise, info logs to a file, as `serve`
# runs out of the box):
#   - forwarding: a route with `key = "off"`, the proxy alone (no store);
#   - first writes: every request has a new Idempotency-Key;
#   - replays: the keys cycle over a fixed set of 64, all created during a
#     warm-up, so the measured requests are replays (through nginx they are
#     plain writes: it does not deduplicate).
# Every run is preceded by a 2 s warm-up on the same load (connections,
# caches) whose figures are discarded.
#
# ROUNDS=N measures each load N times, nginx and the gateway in turn
# (nginx, idemgate, nginx, idemgate…), each round's ratio against the
# nginx run just before it, and prints the median ratio. On a shared VM
# the host's speed drifts over minutes (nginx's own CPU per request moved
# from 22 to 30 µs between two runs here), so a ratio of two runs taken
# back to back, and the median of several such, is what carries.
#
# Per-request costs, over each measured run, divided by the requests wrk
# completed in it:
#   - proxy CPU µs: the proxy's processes' CPU time (user + system): perf
#     stat's task-clock where perf works, else /proc/PID/stat;
#   - ctx sw: the proxy's context switches (perf's software counter; else
#     the voluntary + nonvoluntary counts of /proc/PID/task/*/status);
#   - syscalls: system calls the proxy entered (perf's raw_syscalls
#     tracepoint; "-" without perf);
#   - runq µs: the time the proxy's threads were ready to run but waited for
#     a CPU (/proc/PID/task/*/schedstat): on a machine that wrk, the
#     upstream and the proxy share, what a request loses to the others;
#   - disk KB: the KiB the proxy's processes wrote to the storage device
#     (`write_bytes` of /proc/PID/io, counted when a page is dirtied): the
#     store's WAL, its checkpoints and the log;
#   - machine CPU µs: the whole machine's busy time (/proc/stat), wrk and the
#     upstream included, which is what the rate is bounded by.
# The counters run during the measured run itself; perf's tracepoint costs
# both proxies the same few hundred nanoseconds per system call.
#
# CALLGRIND=1 then runs each proxy under valgrind's callgrind: started with
# instrumentation off, warmed up, counters zeroed, instrumentation on for a
# run of CALLGRIND_DURATION (8 connections: valgrind runs one thread at a
# time), off again, dumped; instructions counted divided by the requests
# wrk completed in that window; the yardstick too, under first writes and
# replays. For both the writer thread's share (the
# SQLite store's work) is given apart. Instruction counts repeat to within
# a percent or two from run to run where rates move by ±10 %, so they are
# the guide for changes; valgrind hides the CPU's SHA instructions and runs
# one thread at a time (bigger store batches than natively).
#
# Installs nginx and wrk (and valgrind for CALLGRIND, strace for STRACE)
# from Debian's packages if missing. Everything listens on 127.0.0.1 on free
# ports; every process started here is stopped on exit, and the temporary
# directory (configs, stores, logs) removed.
set -euo pipefail

DURATION=${DURATION:-10s}
CALLGRIND_DURATION=${CALLGRIND_DURATION:-10s}
DURABILITIES=${DURABILITIES:-full}
LOADS=${LOADS:-off first replay}
ROUNDS=${ROUNDS:-1}
[[ $ROUNDS =~ ^[1-9][0-9]*$ ]] || { echo "ROUNDS must be a whole number of at least 1, not '$ROUNDS'" >&2; exit 2; }
THREADS=2
CONNECTIONS=64
REPLAY_KEYS=64
here=$(cd "$(dirname "$0")" && pwd)
repo=$(dirname "$here")

# shellcheck source=benches/rig.sh
. "$here/rig.sh"
wanted=(nginx wrk)
[ "${CALLGRIND:-0}" = 1 ] && wanted+=(valgrind)
[ "${STRACE:-0}" = 1 ] && wanted+=(strace)
need_commands "${wanted[@]}"
if [ "${ALLOCS:-0}" = 1 ] && ! command -v perf >/dev/null; then
    echo "ALLOCS=1 needs perf (Debian's linux-perf)" >&2
    exit 2
fi
NGINX=$(command -v nginx || echo /usr/sbin/nginx)

# perf counts system calls and task time only where the kernel lets it.
# (Its answer read whole: `| grep -q` may end first and, under pipefail,
# fail the check with perf's SIGPIPE.)
use_perf=0
if command -v perf >/dev/null; then
    perf_probe=$(perf stat -x, -e raw_syscalls:sys_enter,context-switches,task-clock true 2>&1 >/dev/null || true)
    case $perf_probe in *,raw_syscalls:sys_enter*) use_perf=1 ;; esac
fi

# The yardstick, built once (its own target directory, outside the repo).
YARDSTICK=${YARDSTICK:-}
if [ -z "$YARDSTICK" ]; then
    ceiling=$(cd "$repo/.." && pwd)/shared/ceiling
    if [ -f "$ceiling/Cargo.toml" ]; then
        echo "building the yardstick (release)" >&2
        cargo build --release --manifest-path "$ceiling/Cargo.toml" \
            --target-dir "$HOME/.cache/ceiling-target" >&2
        YARDSTICK=$HOME/.cache/ceiling-target/release/proto
    else
        echo "no yardstick at $ceiling: running without it" >&2
        YARDSTICK=off
    fi
fi

idemgate_binary "$repo"

rig_start idemgate-compare

upstream_port=$(free_port)
nginx_port=$(free_port)
upstream_server=$(upstream_block "$upstream_port")
# The pass-through proxy, with keep-alive connections to the upstream (as
# idemgate pools its own).
proxy_server="    upstream api {
        server 127.0.0.1:$upstream_port;
        keepalive 128;
    }
    server {
        listen 127.0.0.1:$nginx_port;
        location / {
            proxy_pass http://api;
            proxy_http_version 1.1;
            proxy_set_header Connection \"\";
        }
    }"
nginx_config "$dir/upstream.conf" "$dir/upstream" 2 "$upstream_server"
nginx_config "$dir/nginx.conf" "$dir/nginx" 2 "$proxy_server"
"$NGINX" -p "$dir/upstream" -c "$dir/upstream.conf" -g 'daemon off;' \
    2>"$dir/upstream/logs/stderr.log" &
pids+=($!)
"$NGINX" -p "$dir/nginx" -c "$dir/nginx.conf" -g 'daemon off;' \
    2>"$dir/nginx/logs/stderr.log" &
nginx_pid=$!
pids+=("$nginx_pid")
# A machine that sat idle may take a while to start them (seen: > 10 s).
if ! { wait_port "$upstream_port" 60 && wait_port "$nginx_port" 60; }; then
    cat "$dir"/upstream/logs/*.log "$dir"/nginx/logs/*.log >&2
    exit 1
fi

# The gateway's config for durability $1 (`rig.sh`'s `idemgate_toml`).
idemgate_config() {
    idemgate_toml "$dir/idemgate-$1.toml" "$dir/idemgate-$1.db" "$upstream_port" "$1"
}

# Starts `$@ serve` (idemgate, or valgrind running it) with durability
# $durability within $within seconds, and sets $started to its proxy address
# and $started_pid to its pid (not printed: a $(…) subshell would lose the
# pid to clean up).
start_idemgate() {
    local name=$1 within=$2
    shift 2
    idemgate_config "$durability"
    rm -f "$dir/idemgate-$durability.db"*
    "$@" serve --config "$dir/idemgate-$durability.toml" \
        >"$dir/$name.out" 2>"$dir/$name.log" &
    started_pid=$!
    pids+=("$started_pid")
    started=$(listening_address "$dir/$name.out" "$dir/$name.log" "$within")
}


# Runs wrk with load $1 against $2 (host:port) for $3 with key prefix $4 and
# $5 connections; prints "rps p50_ms p99_ms non2xx errors requests".
wrk_run() {
    local mode=$1 addr=$2 duration=$3 prefix=$4 connections=${5:-$CONNECTIONS}
    MODE=$mode PREFIX=$prefix REPLAY_KEYS=$REPLAY_KEYS \
        timeout 300 wrk -t "$THREADS" -c "$connections" -d "$duration" \
        -s "$here/load.lua" "http://$addr/" | sed -n 's/^RESULT //p'
}

# The warm-up before a measured run: replays warm up on the run's own keys
# (so they exist before it), the other loads on other keys (so none of the
# warm-up's, possibly still in flight, is met again). Sets $prefix.
warm_up() {
    local mode=$1 addr=$2 connections=${3:-$CONNECTIONS}
    prefix="$mode-$(date +%s%N)"
    case $mode in
        replay) wrk_run "$mode" "$addr" 2s "$prefix" "$connections" >/dev/null ;;
        *) wrk_run "$mode" "$addr" 2s "$prefix-warm-up" "$connections" >/dev/null ;;
    esac
}

# The processes of a proxy whose main process is $1: itself and its children
# (nginx's workers).
proc_set() {
    local children
    read -ra children <<<"$(cat "/proc/$1/task/"*/children 2>/dev/null | tr '\n' ' ')"
    echo "$1" "${children[@]}"
}

# /proc counters of the processes $@: "cpu_ticks ctx_switches runq_ns
# disk_bytes".
proc_counters() {
    local ticks=0 switches=0 runq=0 disk=0 pid
    for pid in "$@"; do
        ticks=$((ticks + $(cpu_ticks "$pid")))
        switches=$((switches + $(cat "/proc/$pid/task/"*/status |
            awk '/ctxt_switches/ { n += $2 } END { print n + 0 }')))
        # schedstat: time on a CPU, time waiting for one (ns), time slices.
        runq=$((runq + $(cat "/proc/$pid/task/"*/schedstat 2>/dev/null |
            awk '{ n += $2 } END { printf "%d", n }')))
        # Bytes the process had sent (or queued) to the storage device.
        disk=$((disk + $(awk '/^write_bytes:/ { print $2 }' "/proc/$pid/io" 2>/dev/null || echo 0)))
    done
    echo "$ticks $switches $runq $disk"
}

# User and system clock ticks so far of each thread of the processes $@,
# summed by thread name: "name user system", one line per name.
thread_ticks() {
    local pid task
    for pid in "$@"; do
        for task in "/proc/$pid/task/"*; do
            # comm may hold spaces; utime and stime are fields 14 and 15.
            printf '%s %s\n' "$(tr ' ' '_' <"$task/comm")" \
                "$(sed 's/^.*) //' "$task/stat" | cut -d' ' -f12,13)" 2>/dev/null || true
        done
    done | awk '{ u[$1] += $2; s[$1] += $3 } END { for (n in u) print n, u[n], s[n] }' | sort
}

# The whole machine's busy clock ticks so far (all CPUs, idle and iowait left out).
machine_ticks() {
    awk '/^cpu / { print $2 + $3 + $4 + $7 + $8 + $9 }' /proc/stat
}

# One measured run of load $1 against $2 with the processes $3 (a list)
# counted; prints "rps p50 p99 non2xx errors cpu_us switches syscalls runq_us
# disk_kb machine_us". With perf, the counts per thread are left in
# $dir/threads.csv ("name cpu_ms switches syscalls requests user_share", one line per
# thread name).
measure() {
    local mode=$1 addr=$2 counted=$3 hz
    hz=$(getconf CLK_TCK)
    warm_up "$mode" "$addr"
    local perf_pid='' before machine_before result after machine_after
    rm -f "$dir/threads.csv"
    if [ "$use_perf" = 1 ]; then
        perf stat --per-thread -x, -e task-clock,context-switches,raw_syscalls:sys_enter \
            -p "${counted// /,}" -o "$dir/perf.csv" 2>/dev/null &
        perf_pid=$!
        sleep 0.3
    fi
    # shellcheck disable=SC2086 # a list of pids
    before=$(proc_counters $counted)
    # shellcheck disable=SC2086
    thread_ticks $counted >"$dir/ticks.before"
    machine_before=$(machine_ticks)
    result=$(wrk_run "$mode" "$addr" "$DURATION" "$prefix")
    machine_after=$(machine_ticks)
    # shellcheck disable=SC2086
    after=$(proc_counters $counted)
    # shellcheck disable=SC2086
    thread_ticks $counted >"$dir/ticks.after"
    local cpu_ms switches syscalls=
    read -r ticks_before switches_before runq_before disk_before <<<"$before"
    read -r ticks_after switches_after runq_after disk_after <<<"$after"
    cpu_ms=$(((ticks_after - ticks_before) * 1000 / hz))
    switches=$((switches_after - switches_before))
    read -r rps p50 p99 non2xx errors requests <<<"$result"
    if [ -n "$perf_pid" ]; then
        kill -INT "$perf_pid"
        wait "$perf_pid" || true
        # --per-thread: "comm-tid,value,unit,event,…"; threads summed by name.
        awk -F, -v n="$requests" '
            $1 ~ /-[0-9]+$/ && $2 ~ /^[0-9.]+$/ {
                name = $1; sub(/-[0-9]+$/, "", name)
                if ($4 ~ /^task-clock/) cpu[name] += $2
                else if ($4 == "context-switches") sw[name] += $2
                else if ($4 == "raw_syscalls:sys_enter") sc[name] += $2
                seen[name] = 1
            }
            END { for (name in seen) printf "%s %f %d %d %d\n", name, cpu[name], sw[name], sc[name], n }
        ' "$dir/perf.csv" | sort >"$dir/threads.perf"
        # The share of each thread's CPU time spent in user space, from
        # /proc's clock ticks over the same run.
        join -a 1 "$dir/ticks.before" "$dir/ticks.after" | join -a 1 "$dir/threads.perf" - |
            awk '{ u = $8 - $6; t = u + $9 - $7
                   printf "%s %s %s %s %s %s\n", $1, $2, $3, $4, $5, (t > 0 ? u / t : "-") }' \
            >"$dir/threads.csv"
        cpu_ms=$(awk '{ n += $2 } END { printf "%d", n }' "$dir/threads.csv")
        switches=$(awk '{ n += $3 } END { print n + 0 }' "$dir/threads.csv")
        syscalls=$(awk '{ n += $4 } END { print n + 0 }' "$dir/threads.csv")
    fi
    awk -v rps="$rps" -v p50="$p50" -v p99="$p99" -v non2xx="$non2xx" -v errors="$errors" \
        -v n="$requests" -v cpu_ms="$cpu_ms" -v sw="$switches" -v sc="$syscalls" \
        -v runq=$((runq_after - runq_before)) -v disk=$((disk_after - disk_before)) \
        -v machine=$((machine_after - machine_before)) -v hz="$hz" 'BEGIN {
            n = n > 0 ? n : 1
            printf "%s %s %s %s %s %.1f %.2f %s %.1f %.1f %.1f\n", rps, p50, p99, non2xx, errors,
                cpu_ms * 1000 / n, sw / n, sc == "" ? "-" : sprintf("%.2f", sc / n),
                runq / 1000 / n, disk / 1024 / n, machine * 1e6 / hz / n
        }'
}

load_average=$(cut -d' ' -f1-3 /proc/loadavg)
echo "compare_nginx: wrk $THREADS threads, $CONNECTIONS connections, $DURATION per run"
echo "  $(date -u '+%Y-%m-%d %H:%M UTC'), $(nproc) CPUs ($(sed -n 's/^model name\s*: //p' /proc/cpuinfo | head -1)), load average before: $load_average"
echo "  idemgate $("$IDEMGATE" --version | cut -d' ' -f2) at $(cd "$repo" && git describe --always --dirty 2>/dev/null || echo '?'), TOKIO_WORKER_THREADS=${TOKIO_WORKER_THREADS:-default}, $("$NGINX" -v 2>&1 | cut -d' ' -f3)"
[ "$use_perf" = 1 ] || echo "  (perf stat unavailable: CPU and switches from /proc, no system call counts)"

gateways=()
for durability in $DURABILITIES; do
    start_idemgate "idemgate-$durability" 10 "$IDEMGATE"
    gateways+=("idemgate $durability=$started=$started_pid")
done

yardstick=()
if [ "$YARDSTICK" != off ]; then
    yardstick_port=$(free_port)
    mkdir -p "$dir/yardstick"
    "$YARDSTICK" --variant v1 --listen "$yardstick_port" --upstream "$upstream_port" \
        --path "$dir/yardstick/store" --threads 2 >"$dir/yardstick/out" 2>&1 &
    yardstick_pid=$!
    pids+=("$yardstick_pid")
    wait_port "$yardstick_port" 60 || { cat "$dir/yardstick/out" >&2; exit 1; }
    yardstick=("yardstick v1=127.0.0.1:$yardstick_port=$yardstick_pid")
fi

# Per thread, from measure's $dir/threads.csv, under the row just printed.
print_threads() {
    [ -s "$dir/threads.csv" ] || return 0
    awk '{ n = $5 > 0 ? $5 : 1
           printf "      %-18s CPU µs %7.1f  (user %s)  ctx sw %5.2f  syscalls %6.2f\n",
        $1, $2 * 1000 / n, $6 == "-" ? "   -" : sprintf("%3.0f %%", $6 * 100), $3 / n, $4 / n }' \
        "$dir/threads.csv"
}

printf '\n%-22s %8s %7s %7s %7s %6s %8s %8s  %8s %6s %8s %7s %7s %8s\n' "load / proxy" "req/s" "p50 ms" \
    "p99 ms" "non-2xx" "errors" "vs nginx" "vs yard" "CPU µs" "ctx sw" "syscalls" "runq µs" "disk KB" "machine"
for mode in $LOADS; do
    case $mode in
        off) echo "forwarding (key = \"off\", a new key per request)" ;;
        first) echo "first writes (a new key per request)" ;;
        replay) echo "replays ($REPLAY_KEYS keys, created in the warm-up)" ;;
    esac
    # The yardstick stores every write: on forwarding it would not compare.
    measured=("${gateways[@]}")
    [ "$mode" = off ] || measured=("${yardstick[@]}" "${gateways[@]}")
    # Each target's ratios over the rounds, space-separated (vs nginx, and
    # idemgate's vs the yardstick).
    declare -A ratios=() yard_ratios=()
    for round in $(seq "$ROUNDS"); do
        nginx_rps= yard_rps=
        for target in "nginx pass-through=127.0.0.1:$nginx_port=$nginx_pid" "${measured[@]}"; do
            IFS='=' read -r proxy addr pid <<<"$target"
            read -r rps p50 p99 non2xx errors cpu switches syscalls runq disk machine \
                <<<"$(measure "$mode" "$addr" "$(proc_set "$pid")")"
            yard=-
            if [ -z "$nginx_rps" ]; then
                nginx_rps=$rps
                ratio=1
            else
                ratio=$(awk -v a="$rps" -v b="$nginx_rps" 'BEGIN { printf "%.3f", a / b }')
                ratios[$proxy]+="$ratio "
            fi
            case $proxy in
                yardstick*) yard_rps=$rps ;;
                idemgate*) if [ -n "$yard_rps" ]; then
                    yard=$(awk -v a="$rps" -v b="$yard_rps" 'BEGIN { printf "%.3f", a / b }')
                    yard_ratios[$proxy]+="$yard "
                    yard+="×"
                fi ;;
            esac
            label=$proxy
            if [ "$ROUNDS" -gt 1 ]; then label="$proxy #$round"; fi
            printf '  %-21s%8.0f %7.2f %7.2f %7d %6d %7s× %8s  %8s %6s %8s %7s %7s %8s\n' "$label" "$rps" "$p50" \
                "$p99" "$non2xx" "$errors" "$ratio" "$yard" "$cpu" "$switches" "$syscalls" "$runq" "$disk" "$machine"
            [ "$proxy" = "nginx pass-through" ] || print_threads
        done
    done
    if [ "$ROUNDS" -gt 1 ]; then
        for target in "${measured[@]}"; do
            IFS='=' read -r proxy _ <<<"$target"
            # shellcheck disable=SC2086 # a list of ratios
            printf '  %-20s median of %d rounds: %s× nginx' "$proxy" "$ROUNDS" "$(median ${ratios[$proxy]})"
            # shellcheck disable=SC2086
            [ -z "${yard_ratios[$proxy]:-}" ] || printf ', %s× the yardstick' "$(median ${yard_ratios[$proxy]})"
            echo
        done
    fi
    unset ratios yard_ratios
done
echo "  (per request: the proxy's CPU µs, context switches, system calls, µs waiting for a CPU and KiB sent to the disk; the machine's CPU µs)"
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)"

# A short run of load $1 against $2 (3 s, 16 connections, after a warm-up)
# while the counter `$3 …` (started in the background, stopped with SIGINT)
# counts; prints the requests the run made.
counted_run() {
    local mode=$1 addr=$2 counter_pid requests
    shift 2
    warm_up "$mode" "$addr" 16
    "$@" 2>/dev/null &
    counter_pid=$!
    sleep 0.5
    read -r _ _ _ _ _ requests <<<"$(wrk_run "$mode" "$addr" 3s "$prefix" 16)"
    kill -INT "$counter_pid"
    wait "$counter_pid" || true
    echo "$requests"
}

# System calls by name, per request: strace -c on a short run of each load
# (strace slows the proxy down several times; the counts per request hold).
if [ "${STRACE:-0}" = 1 ]; then
    echo
    echo "system calls per request by name (strace -c -f, 3 s per load, 16 connections)"
    for mode in $LOADS; do
        for target in "nginx pass-through=127.0.0.1:$nginx_port=$nginx_pid" "${gateways[@]}"; do
            IFS='=' read -r proxy addr pid <<<"$target"
            traced=()
            for p in $(proc_set "$pid"); do traced+=(-p "$p"); done
            requests=$(counted_run "$mode" "$addr" strace -c -f -o "$dir/strace.txt" "${traced[@]}")
            printf '  %-7s %-20s' "$mode" "$proxy"
            awk -v n="$requests" '$NF ~ /^[a-z_0-9]+$/ && $4 ~ /^[0-9]+$/ && $NF != "total" {
                    calls[$NF] = $4
                }
                END {
                    for (name in calls) if (calls[name] / n >= 0.01) printf " %s %.2f", name, calls[name] / n
                    print ""
                }' "$dir/strace.txt"
        done
    done
fi

# idemgate's heap allocations per request, by thread: uprobes on the
# entry points of its allocator (mimalloc's `mi_*_aligned`, which every
# Rust allocation goes through; SQLite's own use the C library's malloc and
# are not counted), on a short run of each load.
if [ "${ALLOCS:-0}" = 1 ]; then
    echo
    echo "idemgate's heap allocations per request by thread (perf probe on mimalloc, 3 s per load, 16 connections)"
    events=()
    for fn in mi_malloc_aligned mi_zalloc_aligned mi_realloc_aligned; do
        perf probe -q -x "$IDEMGATE" -a "idemgate_allocs:$fn=$fn"
        events+=(-e "idemgate_allocs:$fn")
    done
    trap 'perf probe -q -d "idemgate_allocs:*" 2>/dev/null || true; rig_cleanup' EXIT
    for mode in $LOADS; do
        for target in "${gateways[@]}"; do
            IFS='=' read -r proxy addr pid <<<"$target"
            requests=$(counted_run "$mode" "$addr" \
                perf stat --per-thread -x, "${events[@]}" -p "$pid" -o "$dir/allocs.csv")
            printf '  %-7s %-20s' "$mode" "$proxy"
            # "comm-tid,count,,event,…"; threads summed by name.
            awk -F, -v n="$requests" '$1 ~ /-[0-9]+$/ && $2 ~ /^[0-9]+$/ {
                    name = $1; sub(/-[0-9]+$/, "", name); count[name] += $2; all += $2
                }
                END {
                    n = n > 0 ? n : 1
                    printf " %.1f:", all / n
                    for (name in count) if (count[name] / n >= 0.05) printf " %s %.1f", name, count[name] / n
                    print ""
                }' "$dir/allocs.csv"
        done
    done
fi

# Instructions per request under callgrind, for each load: counters zeroed
# after the warm-up, instrumentation on for the measured run only.
callgrind_window() {
    local pid=$1 mode=$2 addr=$3 out=$4 result requests
    warm_up "$mode" "$addr" 8
    callgrind_control -z "$pid" >/dev/null 2>&1
    callgrind_control -i on "$pid" >/dev/null 2>&1
    result=$(wrk_run "$mode" "$addr" "$CALLGRIND_DURATION" "$prefix" 8)
    sleep 1
    callgrind_control -i off "$pid" >/dev/null 2>&1
    callgrind_control -d "$mode" "$pid" >/dev/null 2>&1
    read -r _ _ _ _ _ requests <<<"$result"
    # The newest dump is this window's.
    local dump
    dump=$(find "$(dirname "$out")" -maxdepth 1 -name "$(basename "$out").*" -printf '%T@ %p\n' |
        sort -n | tail -1 | cut -d' ' -f2-)
    if [ -n "${CALLGRIND_KEEP:-}" ]; then
        mkdir -p "$CALLGRIND_KEEP"
        cp "$dump" "$CALLGRIND_KEEP/$(basename "$out" .cg)-$mode.callgrind"
    fi
    callgrind_annotate --inclusive=yes --threshold=100 "$dump" 2>/dev/null |
        awk -v n="$requests" -v mode="$mode" '
            /PROGRAM TOTALS/ { gsub(",", "", $1); total = $1 }
            # The writer thread: its loop, or the thread entry it is inlined
            # into (the yardstick'"'"'s: `writer_loop`).
            /writer::write_batches|sqlite\/writer.rs:std::sys::backtrace::__rust_begin_short_backtrace|store::writer_loop/ && writer == "" {
                gsub(",", "", $1); writer = $1
            }
            /log_sink::write_out/ && logs == "" { gsub(",", "", $1); logs = $1 }
            END {
                printf "  %-7s %8d requests  %9.0f instructions per request", mode, n, total / n
                if (writer != "") printf "  (writer thread %.0f, log thread %.0f, the rest %.0f)",
                    writer / n, logs / n, (total - writer - logs) / n
                print ""
            }'
}

if [ "${CALLGRIND:-0}" = 1 ]; then
    echo
    echo "instructions per request under callgrind ($CALLGRIND_DURATION per load, 8 connections)"
    valgrind=(valgrind --tool=callgrind --instr-atstart=no --dump-instr=no)
    echo " nginx pass-through (one worker)"
    nginx_config "$dir/nginx-vg.conf" "$dir/nginx-vg" 1 "${proxy_server/$nginx_port/$(free_port)}"
    sed -i '1i master_process off;' "$dir/nginx-vg.conf"
    vg_port=$(sed -n 's/^ *listen 127.0.0.1:\([0-9]*\);/\1/p' "$dir/nginx-vg.conf")
    "${valgrind[@]}" --callgrind-out-file="$dir/nginx.cg" \
        "$NGINX" -p "$dir/nginx-vg" -c "$dir/nginx-vg.conf" -g 'daemon off;' \
        2>"$dir/nginx-vg/logs/stderr.log" &
    vg_pid=$!
    pids+=("$vg_pid")
    wait_port "$vg_port" 60
    callgrind_window "$vg_pid" off "127.0.0.1:$vg_port" "$dir/nginx.cg"
    kill "$vg_pid"
    for durability in $DURABILITIES; do
        echo " idemgate $durability"
        start_idemgate "idemgate-vg-$durability" 120 \
            "${valgrind[@]}" --callgrind-out-file="$dir/idemgate-$durability.cg" "$IDEMGATE"
        for mode in $LOADS; do
            callgrind_window "$started_pid" "$mode" "$started" "$dir/idemgate-$durability.cg"
        done
        kill "$started_pid"
    done
    if [ "$YARDSTICK" != off ]; then
        echo " yardstick v1"
        yardstick_vg_port=$(free_port)
        mkdir -p "$dir/yardstick-vg"
        "${valgrind[@]}" --callgrind-out-file="$dir/yardstick.cg" "$YARDSTICK" --variant v1 \
            --listen "$yardstick_vg_port" --upstream "$upstream_port" \
            --path "$dir/yardstick-vg/store" --threads 2 >"$dir/yardstick-vg/out" 2>&1 &
        vg_pid=$!
        pids+=("$vg_pid")
        wait_port "$yardstick_vg_port" 120
        for mode in $LOADS; do
            # It stores every write: forwarding would not compare.
            [ "$mode" = off ] ||
                callgrind_window "$vg_pid" "$mode" "127.0.0.1:$yardstick_vg_port" "$dir/yardstick.cg"
        done
        kill "$vg_pid"
    fi
fi
