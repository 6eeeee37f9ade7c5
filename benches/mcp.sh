#!/usr/bin/env bash
# What a protected MCP tool call costs beside an HTTP first write, in the
# same run: one gateway with both routes in front of one nginx upstream,
# wrk (2 threads, 64 connections) on each load in turn, ROUNDS times.
#
#   benches/mcp.sh                          # 10 s per run, 3 rounds, ~1.5 min
#   ROUNDS=5 DURATION=20s benches/mcp.sh
#   IDEMGATE=path/to/idemgate benches/mcp.sh   # skip the release build
#
# Loads:
#   - first writes: POST /orders, a new Idempotency-Key each (load.lua);
#   - tool calls: POST /mcp, one JSON-RPC tools/call each with a new key in
#     params._meta (mcp.lua), on a route with profile = "mcp".
# The upstream answers /mcp with a JSON-RPC result for id 1 (every call
# carries id 1: an id is never part of a call's identity) and anything
# else with 201. Durability "full", as `serve` runs by default.
#
# Per run: req/s, p50/p99 ms, the gateway's CPU µs per request
# (/proc/PID/stat), and answers that were not 2xx or failed (must be 0).
# Then the median ratio of tool calls to first writes, and what the store
# keeps per operation of each route (its response and request summary,
# bytes, from the SQLite file).
set -euo pipefail

DURATION=${DURATION:-10s}
ROUNDS=${ROUNDS:-3}
[[ $ROUNDS =~ ^[1-9][0-9]*$ ]] || { echo "ROUNDS must be a whole number of at least 1" >&2; exit 2; }
THREADS=2
CONNECTIONS=64
here=$(cd "$(dirname "$0")" && pwd)
repo=$(dirname "$here")

. "$here/rig.sh"
need_commands nginx wrk python3
NGINX=$(command -v nginx || echo /usr/sbin/nginx)

idemgate_binary "$repo"

rig_start idemgate-mcp

upstream_port=$(free_port)
upstream_server="    server {
        listen 127.0.0.1:$upstream_port;
        location /mcp {
            default_type application/json;
            return 200 '{\"jsonrpc\":\"2.0\",\"id\":1,\"result\":{\"content\":[{\"type\":\"text\",\"text\":\"created task 1\"}],\"isError\":false}}';
        }
        location / {
            default_type application/json;
            return 201 '{\"id\":1,\"status\":\"created\"}';
        }
    }"
nginx_config "$dir/upstream.conf" "$dir/upstream" 2 "$upstream_server"
"$NGINX" -p "$dir/upstream" -c "$dir/upstream.conf" -g 'daemon off;' \
    2>"$dir/upstream/logs/stderr.log" &
pids+=($!)
wait_port "$upstream_port" 60

cat >"$dir/idemgate.toml" <<CONF
[server]
listen = "127.0.0.1:0"
admin_listen = "127.0.0.1:0"
[store]
url = "sqlite://$dir/idemgate.db"
[[routes]]
name = "tools"
profile = "mcp"
path_prefix = "/mcp"
upstream = "http://127.0.0.1:$upstream_port"
[[routes]]
name = "orders"
path_prefix = "/"
upstream = "http://127.0.0.1:$upstream_port"
CONF
"$IDEMGATE" serve --config "$dir/idemgate.toml" >"$dir/gateway.out" 2>"$dir/gateway.log" &
gateway_pid=$!
pids+=("$gateway_pid")
address=$(listening_address "$dir/gateway.out" "$dir/gateway.log" 30)
ticks_per_second=$(getconf CLK_TCK)

# One wrk run of script $1 (MODE=$2) for $3: "rate p50 p99 non2xx errors requests".
wrk_run() {
    MODE=$2 PREFIX="$2-$(date +%s%N)" REPLAY_KEYS=1 \
        timeout 300 wrk -t "$THREADS" -c "$CONNECTIONS" -d "$3" \
        -s "$here/$1" "http://$address/" | sed -n 's/^RESULT //p'
}

# A measured run of load $1 (script $2, MODE $3): prints its line and sets $rate.
measure() {
    wrk_run "$2" "$3" 2s >/dev/null
    local before after result
    before=$(cpu_ticks "$gateway_pid")
    result=$(wrk_run "$2" "$3" "$DURATION")
    after=$(cpu_ticks "$gateway_pid")
    read -r rate p50 p99 non2xx errors requests <<<"$result"
    local cpu_us
    cpu_us=$(awk -v t=$((after - before)) -v hz="$ticks_per_second" -v n="$requests" \
        'BEGIN { printf "%.1f", n ? t / hz * 1e6 / n : 0 }')
    printf '%-12s %10s req/s  p50 %7s ms  p99 %7s ms  CPU %6s µs/request  non-2xx %s  errors %s\n' \
        "$1" "$rate" "$p50" "$p99" "$cpu_us" "$non2xx" "$errors"
}

ratios=()
for round in $(seq "$ROUNDS"); do
    echo "round $round"
    measure "first writes" load.lua first
    http=$rate
    measure "tool calls" mcp.lua call
    mcp=$rate
    ratios+=("$(awk -v a="$mcp" -v b="$http" 'BEGIN { printf "%.3f", a / b }')")
done
echo "tool calls / first writes, each round: ${ratios[*]}; median $(median "${ratios[@]}")"

python3 - "$dir/idemgate.db" <<'PY'
import sqlite3, sys
db = sqlite3.connect(sys.argv[1])
rows = db.execute(
    """SELECT route, count(*),
              avg(coalesce(length(response_body), 0) + coalesce(length(response_headers), 0)),
              avg(length(idem_key) + length(request_path) + length(request_method))
       FROM operations GROUP BY route ORDER BY route""").fetchall()
for route, count, response, request in rows:
    print(f"stored per operation, route {route}: response {response:.0f} B, key and request line {request:.0f} B ({count} operations)")
PY
