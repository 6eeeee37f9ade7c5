#!/usr/bin/env bash
# What synchronous replication costs a first write on the PostgreSQL store
# (docs/replicas.md, "Failover"): two PostgreSQL clusters of this machine's
# version made for the run (Debian's pg_createcluster, a primary and a
# streaming standby by pg_basebackup), the replication link through
# delay_relay.py (DELAY ms each way), one `idemgate serve` on the primary in
# front of `idemgate mock-upstream`, and `idemgate bench` (first writes, a
# new key each, exactly once checked at the mock) for DURATION in each mode:
#   - async: PostgreSQL's default, the standby as far as DELAY;
#   - sync: `synchronous_standby_names` naming the standby and the
#     gateway's `store.require_synchronous_standby = true`.
#
#   benches/failover.sh                       # DELAY=20 DURATION=10s
#   DELAY=0 benches/failover.sh               # the link on loopback
#   IDEMGATE=path/to/idemgate benches/failover.sh   # skip the release build
#
# Needs root (or sudo) for pg_createcluster; the clusters, their data and
# every process started are removed on exit. Loopback only.
set -euo pipefail

DELAY=${DELAY:-20}
DURATION=${DURATION:-10s}
here=$(cd "$(dirname "$0")" && pwd)
repo=$(dirname "$here")

# shellcheck source=benches/rig.sh
. "$here/rig.sh"
version=$(pg_lsclusters --no-header | awk '{ print $1; exit }')
[ -n "$version" ] || { echo "no PostgreSQL cluster tools here (postgresql-common)" >&2; exit 1; }
sudo=
[ "$(id -u)" -eq 0 ] || sudo=sudo

idemgate_binary "$repo"

rig_start idemgate-failover
# The clusters' data directories are in it, owned by postgres.
chmod 711 "$dir"
clusters=()
drop_clusters() {
    local name
    for name in "${clusters[@]}"; do
        $sudo pg_dropcluster --stop "$version" "$name" 2>/dev/null || true
    done
    rig_cleanup
}
trap drop_clusters EXIT

# psql against port $1, then its arguments.
sql() {
    local port=$1
    shift
    psql -X -q -t -A -h 127.0.0.1 -p "$port" -U postgres -d postgres "$@"
}

# Makes cluster $1 on port $2 (trust on 127.0.0.1, replication allowed).
make_cluster() {
    local name=$1 port=$2
    $sudo pg_createcluster -q "$version" "$name" -p "$port" -d "$dir/$name" \
        -- --auth-host=trust --auth-local=trust >/dev/null
    clusters+=("$name")
    local conf=/etc/postgresql/$version/$name
    echo "host replication all 127.0.0.1/32 trust" | $sudo tee -a "$conf/pg_hba.conf" >/dev/null
    $sudo tee -a "$conf/postgresql.conf" >/dev/null <<CONF
listen_addresses = '127.0.0.1'
wal_level = replica
max_wal_senders = 4
CONF
}

# One mode ($1: async or sync): a fresh primary and standby, a gateway,
# the load; prints one result line.
run_mode() {
    local mode=$1 tag primary standby primary_port standby_port relay_port
    tag="igfo$$$mode"
    primary=${tag}p standby=${tag}s
    primary_port=$(free_port) standby_port=$(free_port) relay_port=$(free_port)
    make_cluster "$primary" "$primary_port"
    if [ "$mode" = sync ]; then
        echo "synchronous_standby_names = 'standby'" |
            $sudo tee -a "/etc/postgresql/$version/$primary/postgresql.conf" >/dev/null
    fi
    $sudo pg_ctlcluster "$version" "$primary" start
    python3 "$here/delay_relay.py" "$relay_port" "$primary_port" "$DELAY" &
    pids+=($!)
    wait_port "$relay_port" 10
    # The standby: a copy of the primary through the relay, streaming from
    # it as `standby`.
    make_cluster "$standby" "$standby_port"
    $sudo rm -rf "$dir/$standby"
    $sudo pg_basebackup -h 127.0.0.1 -p "$relay_port" -U postgres -D "$dir/$standby" -X stream -R
    echo "primary_conninfo = 'host=127.0.0.1 port=$relay_port user=postgres application_name=standby'" |
        $sudo tee -a "$dir/$standby/postgresql.auto.conf" >/dev/null
    $sudo chown -R postgres:postgres "$dir/$standby"
    $sudo chmod 700 "$dir/$standby"
    $sudo pg_ctlcluster "$version" "$standby" start
    for _ in $(seq 100); do
        [ "$(sql "$primary_port" -c "SELECT count(*) FROM pg_stat_replication WHERE state = 'streaming'")" = 1 ] && break
        sleep 0.1
    done
    local mock_port required=false
    mock_port=$(free_port)
    "$IDEMGATE" mock-upstream --listen "127.0.0.1:$mock_port" >"$dir/mock-$mode.out" 2>&1 &
    pids+=($!)
    wait_port "$mock_port" 10
    [ "$mode" = sync ] && required=true
    cat >"$dir/gateway-$mode.toml" <<CONF
[server]
listen = "127.0.0.1:0"
admin_listen = "127.0.0.1:0"
[store]
url = "postgres://postgres@127.0.0.1:$primary_port/postgres"
durability = "full"
require_synchronous_standby = $required
[[routes]]
name = "orders"
path_prefix = "/"
upstream = "http://127.0.0.1:$mock_port"
CONF
    IDEMGATE_SCOPE_KEY=$(head -c 32 /dev/urandom | base64) \
        "$IDEMGATE" serve --config "$dir/gateway-$mode.toml" >"$dir/gw-$mode.out" 2>"$dir/gw-$mode.log" &
    local gw_pid=$!
    pids+=("$gw_pid")
    local addr
    addr=$(listening_address "$dir/gw-$mode.out" "$dir/gw-$mode.log" 30)
    "$IDEMGATE" bench --target "http://$addr/orders" \
        --upstream-effects "http://127.0.0.1:$mock_port/_effects" \
        --retries 1 --concurrency 64 --duration "$DURATION" --json >"$dir/bench-$mode.json"
    python3 - "$mode" "$dir/bench-$mode.json" <<'PY'
import json, sys
mode, path = sys.argv[1], sys.argv[2]
r = json.load(open(path))
latency = r["latency_ms"]
print(f"  {mode:<6} {r['throughput_rps']:9.0f}/s  p50 {latency['p50']:7.1f} ms  "
      f"p99 {latency['p99']:7.1f} ms  {r['requests']} first writes, "
      f"{r['upstream_writes']} reached the API, exactly once: {r['exactly_once']}")
PY
    kill "$gw_pid"
    wait "$gw_pid" 2>/dev/null || true
}

echo "failover.sh: PostgreSQL $version, the replication link delayed ${DELAY} ms each way, $DURATION of first writes per mode"
echo "  $(date -u '+%Y-%m-%d %H:%M UTC'), $(nproc) CPUs, idemgate at $(cd "$repo" && git describe --always --dirty 2>/dev/null || echo '?')"
for mode in async sync; do
    run_mode "$mode"
done
