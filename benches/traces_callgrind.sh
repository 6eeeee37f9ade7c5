#!/usr/bin/env bash
# What traces cost a request: instructions per request under callgrind for
# one `idemgate serve`, with traces off (no OTEL_* endpoint) and on (every
# span sampled and exported to a collector that answers at once), on two
# loads: forwarding (a route with `key = "off"`, no store) and first writes
# (every request a new key).
#
#   benches/traces_callgrind.sh                 # ~2 min; builds the release binary
#   IDEMGATE=target/release/idemgate REQUESTS=4000 benches/traces_callgrind.sh
#
# The upstream and the collector are `idemgate mock-upstream` processes (the
# collector is one too: it answers the exporter's POST 201, which OTLP/HTTP
# takes as accepted), the load `idemgate bench --target` at 8 connections;
# neither is under valgrind. Instrumentation is on only for the measured
# requests, after a warm-up of the same load; the count is the whole
# gateway process's (workers, the store's writer, the log thread and, on,
# the span exporter's thread, whose share is also given apart), divided by
# the requests sent. `IDEMGATE=` another tree's binary measures that tree
# (one without traces ignores the OTEL_* variables: both runs are "off"). Instruction
# counts repeat to within a percent or two where a loaded machine's rates do
# not, so this runs on a busy machine too. Everything listens on 127.0.0.1
# on ports the processes pick; every process started here is stopped on
# exit and the temporary directory removed (KEEP=1 keeps it, with the dumps). Installs valgrind (Debian's
# package) if missing.
set -euo pipefail

REQUESTS=${REQUESTS:-2000}
here=$(cd "$(dirname "$0")" && pwd)
repo=$(dirname "$here")

if ! command -v valgrind >/dev/null; then
    apt-get install -y valgrind >&2 || { apt-get update >&2 && apt-get install -y valgrind >&2; }
fi
if [ -z "${IDEMGATE:-}" ]; then
    (cd "$repo" && cargo build --release --locked --bin idemgate >&2)
    IDEMGATE=$repo/target/release/idemgate
fi

dir=$(mktemp -d -t idemgate-traces.XXXXXX)
pids=()
cleanup() {
    for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
    for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
    if [ -n "${KEEP:-}" ]; then echo "kept $dir" >&2; else rm -rf "$dir"; fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# Waits up to 120 s for the line of file $1 that starts with "listening" and
# prints it.
listening_line() {
    for _ in $(seq 1200); do
        if grep -q '^listening' "$1" 2>/dev/null; then
            grep -m1 '^listening' "$1"
            return
        fi
        sleep 0.1
    done
    echo "no listening line in $1" >&2
    cat "$1" >&2
    return 1
}

# A mock API on a port of its own; prints its address.
mock() {
    "$IDEMGATE" mock-upstream --listen 127.0.0.1:0 >"$dir/$1.out" 2>"$dir/$1.err" &
    pids+=($!)
    listening_line "$dir/$1.out" | sed 's/.*mock=//'
}

upstream=$(mock upstream)
collector=$(mock collector)

for traces in off on; do
    cat >"$dir/$traces.toml" <<EOF
[server]
listen = "127.0.0.1:0"
admin_listen = "127.0.0.1:0"

[store]
url = "sqlite://$dir/$traces.db"

[[routes]]
name = "forward"
path_prefix = "/forward"
upstream = "http://$upstream"
key = "off"

[[routes]]
name = "write"
path_prefix = "/"
upstream = "http://$upstream"
EOF
    env=()
    if [ "$traces" = on ]; then
        env=(OTEL_EXPORTER_OTLP_ENDPOINT="http://$collector" OTEL_BSP_SCHEDULE_DELAY=200)
    fi
    env "${env[@]}" valgrind --tool=callgrind --instr-atstart=no --dump-instr=no \
        --callgrind-out-file="$dir/$traces.cg" \
        "$IDEMGATE" serve --config "$dir/$traces.toml" \
        >"$dir/$traces.out" 2>"$dir/$traces.err" &
    gateway=$!
    pids+=("$gateway")
    proxy=$(listening_line "$dir/$traces.out" | sed 's/.*proxy=\([^ ]*\).*/\1/')
    admin=$(listening_line "$dir/$traces.out" | sed 's/.*admin=\([^ ]*\).*/\1/')
    for load in forward first; do
        path=/orders
        [ "$load" = forward ] && path=/forward/orders
        drive() {
            "$IDEMGATE" bench --target "http://$proxy$path" --requests "$1" \
                --retries 1 --concurrency 8 --json >"$dir/bench.json"
        }
        drive 200
        callgrind_control -z "$gateway" >/dev/null 2>&1
        callgrind_control -i on "$gateway" >/dev/null 2>&1
        drive "$REQUESTS"
        # The spans of the last requests are exported within the schedule delay.
        sleep 1
        callgrind_control -i off "$gateway" >/dev/null 2>&1
        callgrind_control -d "$load" "$gateway" >/dev/null 2>&1
        dump=$(find "$dir" -maxdepth 1 -name "$traces.cg.*" -printf '%T@ %p\n' |
            sort -n | tail -1 | cut -d' ' -f2-)
        # The exporter's thread: the SDK's batch processor and what it calls.
        callgrind_annotate --inclusive=yes --threshold=100 "$dump" 2>/dev/null |
            awk -v n="$REQUESTS" -v what="traces $traces, $load" '
            /PROGRAM TOTALS/ { gsub(",", "", $1); total = $1 }
            /BatchSpanProcessor::get_spans_and_export/ && exporter == "" { gsub(",", "", $1); exporter = $1 }
            /write_batches/ && writer == "" { gsub(",", "", $1); writer = $1 }
            END {
                printf "%-22s %9.0f instructions per request", what, total / n
                printf " (store writer %.0f, exporter %.0f, the rest %.0f)", writer / n, exporter / n,
                    (total - writer - exporter) / n
                print ""
            }'
    done
    # How many calls the store's group commits took together, which is what
    # the writer thread's share per write follows.
    curl -s "http://$admin/metrics" | awk -v what="traces $traces" '
        /^idemgate_store_batch_calls_sum/ { sum = $2 }
        /^idemgate_store_batch_calls_count/ { count = $2 }
        END { if (count > 0) printf "%-22s %9.1f store calls per batch\n", what, sum / count }'
    kill "$gateway"
    wait "$gateway" 2>/dev/null || true
done
