#!/usr/bin/env bash
# idemgate side by side with nginx as a plain pass-through proxy, measured as
# a new user would: wrk (2 threads, 64 connections) against each, in front of
# the same upstream, in one run.
#
#   benches/compare_nginx.sh              # 10 s per measured run, ~1.5 min in all
#   DURATION=30s benches/compare_nginx.sh
#   IDEMGATE=path/to/idemgate benches/compare_nginx.sh   # skip the release build
#
# The upstream is nginx itself, answering every request 201 with a small JSON
# body: the fastest upstream at hand, so neither proxy waits on it and both
# pay the same for it, and it is the upstream the project's first figures were
# measured against. (The idemgate mock API would count writes, but it is an
# in-process Rust server whose per-key map grows with every new key: it would
# tax both sides and skew the first-write runs. Exactly-once is what
# `idemgate bench` checks; this script measures speed.)
#
# Loads, each run against nginx pass-through, idemgate durability "full" and
# idemgate durability "normal" (idemgate with its default config otherwise,
# info logs to a file, as `serve` runs out of the box):
#   - first writes: every request has a new Idempotency-Key;
#   - replays: the keys cycle over a fixed set of 64, all created during a
#     warm-up, so the measured requests are replays (through nginx they are
#     plain writes: it does not deduplicate).
# Every run is preceded by a 2 s warm-up on the same load (connections,
# caches) whose figures are discarded.
#
# Installs nginx and wrk from Debian's packages if missing. Everything listens
# on 127.0.0.1 on free ports; every process started here is stopped on exit,
# and the temporary directory (configs, stores, logs) removed.
set -euo pipefail

DURATION=${DURATION:-10s}
THREADS=2
CONNECTIONS=64
REPLAY_KEYS=64
here=$(cd "$(dirname "$0")" && pwd)
repo=$(dirname "$here")

need_packages() {
    local missing=()
    command -v nginx >/dev/null || [ -x /usr/sbin/nginx ] || missing+=(nginx)
    command -v wrk >/dev/null || missing+=(wrk)
    [ ${#missing[@]} -eq 0 ] && return
    echo "installing ${missing[*]} (apt-get)" >&2
    local sudo=
    [ "$(id -u)" -eq 0 ] || sudo=sudo
    $sudo apt-get install -y "${missing[@]}" >&2 ||
        { $sudo apt-get update >&2 && $sudo apt-get install -y "${missing[@]}" >&2; }
}
need_packages
NGINX=$(command -v nginx || echo /usr/sbin/nginx)

if [ -z "${IDEMGATE:-}" ]; then
    echo "building idemgate (release)" >&2
    (cd "$repo" && cargo build --release --locked --bin idemgate >&2)
    IDEMGATE=$repo/target/release/idemgate
fi

dir=$(mktemp -d -t idemgate-compare.XXXXXX)
pids=()
cleanup() {
    for pid in "${pids[@]}"; do
        kill "$pid" 2>/dev/null || true
    done
    for pid in "${pids[@]}"; do
        wait "$pid" 2>/dev/null || true
    done
    rm -rf "$dir"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# A port nothing listens on (a connect refused), tried at most 100 times.
free_port() {
    local port
    for _ in $(seq 100); do
        port=$((20000 + RANDOM % 40000))
        if ! (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
            echo "$port"
            return
        fi
    done
    echo "no free port found" >&2
    return 1
}

# Waits up to 10 s for something to accept on 127.0.0.1:$1.
wait_port() {
    for _ in $(seq 100); do
        (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null && return
        sleep 0.1
    done
    echo "nothing listens on 127.0.0.1:$1 after 10 s" >&2
    return 1
}

upstream_port=$(free_port)
nginx_port=$(free_port)
mkdir -p "$dir/nginx/logs"
cat >"$dir/nginx/nginx.conf" <<EOF
worker_processes 2;
pid $dir/nginx/nginx.pid;
error_log $dir/nginx/logs/error.log warn;
events { worker_connections 4096; }
http {
    access_log off;
    client_body_temp_path $dir/nginx/body;
    proxy_temp_path $dir/nginx/proxy;
    fastcgi_temp_path $dir/nginx/fastcgi;
    uwsgi_temp_path $dir/nginx/uwsgi;
    scgi_temp_path $dir/nginx/scgi;
    keepalive_requests 1000000;
    # The upstream: every request is a created resource.
    server {
        listen 127.0.0.1:$upstream_port;
        location / {
            default_type application/json;
            return 201 '{"id":1,"status":"created"}';
        }
    }
    # The pass-through proxy, with keep-alive connections to the upstream
    # (as idemgate pools its own).
    upstream api {
        server 127.0.0.1:$upstream_port;
        keepalive 128;
    }
    server {
        listen 127.0.0.1:$nginx_port;
        location / {
            proxy_pass http://api;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
        }
    }
}
EOF
"$NGINX" -p "$dir/nginx" -c "$dir/nginx/nginx.conf" -g 'daemon off;' \
    2>"$dir/nginx/logs/stderr.log" &
pids+=($!)
wait_port "$upstream_port"
wait_port "$nginx_port"

# Starts `idemgate serve` with durability $1 and sets $started to its proxy
# address (not printed: a $(…) subshell would lose the pid to clean up).
start_idemgate() {
    local durability=$1
    cat >"$dir/idemgate-$durability.toml" <<EOF
[server]
listen = "127.0.0.1:0"
admin_listen = "127.0.0.1:0"
[store]
url = "sqlite://$dir/idemgate-$durability.db"
durability = "$durability"
[[routes]]
name = "orders"
path_prefix = "/"
upstream = "http://127.0.0.1:$upstream_port"
EOF
    "$IDEMGATE" serve --config "$dir/idemgate-$durability.toml" \
        >"$dir/idemgate-$durability.out" 2>"$dir/idemgate-$durability.log" &
    pids+=($!)
    started=
    for _ in $(seq 100); do
        started=$(sed -n 's/^listening proxy=\([^ ]*\) .*/\1/p' "$dir/idemgate-$durability.out")
        [ -n "$started" ] && return
        sleep 0.1
    done
    echo "idemgate ($durability) did not start within 10 s:" >&2
    cat "$dir/idemgate-$durability.log" >&2
    return 1
}
start_idemgate full
idemgate_full=$started
start_idemgate normal
idemgate_normal=$started

# The wrk script: first writes (a new key per request) or replays (the keys
# cycle over REPLAY_KEYS). Keys carry a per-run prefix, so no run replays
# another's keys.
cat >"$dir/load.lua" <<'EOF'
local mode = os.getenv("MODE")
local prefix = os.getenv("PREFIX")
local replay_keys = tonumber(os.getenv("REPLAY_KEYS"))
local body = '{"amount":1000,"currency":"eur","description":"bench order","customer":"cus_42"}'
local threads = 0
local counter = 0
-- `id` is a global each thread gets from setup().

function setup(thread)
    thread:set("id", threads)
    threads = threads + 1
end

request = function()
    counter = counter + 1
    local key
    if mode == "replay" then
        key = prefix .. "-" .. (counter % replay_keys)
    else
        key = prefix .. "-" .. id .. "-" .. counter
    end
    return wrk.format("POST", "/orders", {
        ["Authorization"] = "Bearer bench",
        ["Idempotency-Key"] = key,
        ["Content-Type"] = "application/json",
    }, body)
end

done = function(summary, latency, requests)
    local non2xx = summary.errors.status
    local errors = summary.errors.connect + summary.errors.read + summary.errors.write
        + summary.errors.timeout
    io.write(string.format("RESULT %.1f %.3f %.3f %d %d\n",
        summary.requests / (summary.duration / 1e6),
        latency:percentile(50) / 1000, latency:percentile(99) / 1000, non2xx, errors))
end
EOF

# Runs wrk with load $1 against $2 (host:port) for $3; prints
# "rps p50_ms p99_ms non2xx errors".
wrk_run() {
    local mode=$1 addr=$2 duration=$3 prefix=$4
    MODE=$mode PREFIX=$prefix REPLAY_KEYS=$REPLAY_KEYS \
        timeout 120 wrk -t "$THREADS" -c "$CONNECTIONS" -d "$duration" \
        -s "$dir/load.lua" "http://$addr/orders" | sed -n 's/^RESULT //p'
}

# One measured run after a warm-up: replays warm up on the same keys (so
# they exist before the measured run), first writes on other keys (so none
# of the warm-up's, possibly still in flight, is met again).
measure() {
    local mode=$1 addr=$2 prefix
    prefix="$mode-$(date +%s%N)"
    case $mode in
        first) wrk_run "$mode" "$addr" 2s "$prefix-warm-up" >/dev/null ;;
        replay) wrk_run "$mode" "$addr" 2s "$prefix" >/dev/null ;;
    esac
    wrk_run "$mode" "$addr" "$DURATION" "$prefix"
}

load_average=$(cut -d' ' -f1-3 /proc/loadavg)
echo "compare_nginx: wrk $THREADS threads, $CONNECTIONS connections, $DURATION per run"
echo "  $(date -u '+%Y-%m-%d %H:%M UTC'), $(nproc) CPUs ($(sed -n 's/^model name\s*: //p' /proc/cpuinfo | head -1)), load average before: $load_average"
echo "  idemgate $("$IDEMGATE" --version | cut -d' ' -f2) at $(cd "$repo" && git describe --always --dirty 2>/dev/null || echo '?'), $("$NGINX" -v 2>&1 | cut -d' ' -f3)"
printf '\n%-22s %10s %9s %9s %8s %7s %10s\n' "load / proxy" "req/s" "p50 ms" "p99 ms" "non-2xx" "errors" "vs nginx"
for mode in first replay; do
    case $mode in
        first) echo "first writes (a new key per request)" ;;
        replay) echo "replays ($REPLAY_KEYS keys, created in the warm-up)" ;;
    esac
    nginx_rps=
    for proxy in "nginx pass-through" "idemgate full" "idemgate normal"; do
        case $proxy in
            "nginx pass-through") addr=127.0.0.1:$nginx_port ;;
            "idemgate full") addr=$idemgate_full ;;
            "idemgate normal") addr=$idemgate_normal ;;
        esac
        read -r rps p50 p99 non2xx errors <<<"$(measure "$mode" "$addr")"
        if [ -z "$nginx_rps" ]; then
            nginx_rps=$rps
            ratio=1
        else
            ratio=$(awk -v a="$rps" -v b="$nginx_rps" 'BEGIN { printf "%.3f", a / b }')
        fi
        printf '  %-20s %10.0f %9.2f %9.2f %8d %7d %9s×\n' "$proxy" "$rps" "$p50" "$p99" "$non2xx" "$errors" "$ratio"
    done
done
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
