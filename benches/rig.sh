# shellcheck shell=bash
# What compare_nginx.sh and paired.sh share, sourced by both: the packages
# they need, a temporary directory whose processes are stopped on exit,
# free ports, nginx configs (the upstream that answers every request 201),
# and the gateway's config.

# Installs from Debian's packages whatever of the commands $@ is missing
# (each package is named as its command; nginx may be in /usr/sbin).
need_commands() {
    local missing=() command
    for command in "$@"; do
        command -v "$command" >/dev/null && continue
        [ "$command" = nginx ] && [ -x /usr/sbin/nginx ] && continue
        missing+=("$command")
    done
    [ ${#missing[@]} -eq 0 ] && return
    echo "installing ${missing[*]} (apt-get)" >&2
    local sudo=
    [ "$(id -u)" -eq 0 ] || sudo=sudo
    $sudo apt-get install -y "${missing[@]}" >&2 ||
        { $sudo apt-get update >&2 && $sudo apt-get install -y "${missing[@]}" >&2; }
}

# Sets $IDEMGATE to the binary to measure: as the environment gives it,
# else the release build of the repository at $1, built now.
idemgate_binary() {
    if [ -z "${IDEMGATE:-}" ]; then
        echo "building idemgate (release)" >&2
        (cd "$1" && cargo build --release --locked --bin idemgate >&2)
        IDEMGATE=$1/target/release/idemgate
    fi
}

# Makes the temporary directory $dir (named after $1) and arranges that on
# exit every process whose pid is added to $pids is stopped and $dir
# removed.
rig_start() {
    dir=$(mktemp -d -t "$1.XXXXXX")
    pids=()
    trap rig_cleanup EXIT
    trap 'exit 130' INT TERM
}

rig_cleanup() {
    local pid
    for pid in "${pids[@]}"; do
        kill "$pid" 2>/dev/null || true
    done
    for pid in "${pids[@]}"; do
        wait "$pid" 2>/dev/null || true
    done
    rm -rf "$dir"
}

# A port nothing listens on (a connect refused), tried at most 100 times.
# Below the kernel's ephemeral range: a port there may be the local end of
# a connection (wrk's, a database client's), which no probe sees and which
# makes a listener's bind fail.
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

# Waits up to $2 seconds (10 by default) for something to accept on 127.0.0.1:$1.
wait_port() {
    for _ in $(seq $((${2:-10} * 10))); do
        (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null && return
        sleep 0.1
    done
    echo "nothing listens on 127.0.0.1:$1 after ${2:-10} s" >&2
    return 1
}

# Prints the proxy address a gateway started with its output in $1 gives
# on its `listening` line, once there, waiting up to $3 seconds; else says
# so, with the gateway's log $2, and fails.
listening_address() {
    local address
    for _ in $(seq $(($3 * 10))); do
        # (The file may not be there yet: the shell that started the
        # gateway makes it in the child.)
        address=$(sed -n 's/^listening proxy=\([^ ]*\) .*/\1/p' "$1" 2>/dev/null)
        if [ -n "$address" ]; then
            echo "$address"
            return
        fi
        sleep 0.1
    done
    echo "the gateway did not start within $3 s:" >&2
    cat "$2" >&2
    return 1
}

# The CPU clock ticks process $1 has run so far: utime and stime, fields
# 14 and 15 of its stat, counted after the command's ")".
cpu_ticks() {
    sed 's/.*) //' "/proc/$1/stat" | awk '{ print $12 + $13 }'
}

# The median of the numbers $@, to three decimals.
median() {
    printf '%s\n' "$@" | sort -n | awk '{ v[NR] = $1 } END {
        printf "%.3f", NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'
}

# Writes an nginx config $1 for prefix $2: `worker_processes` $3, the
# server block $4.
nginx_config() {
    local file=$1 prefix=$2 workers=$3 server=$4
    mkdir -p "$prefix/logs"
    cat >"$file" <<CONF
worker_processes $workers;
pid $prefix/nginx.pid;
error_log $prefix/logs/error.log warn;
events { worker_connections 4096; }
http {
    access_log off;
    client_body_temp_path $prefix/body;
    proxy_temp_path $prefix/proxy;
    fastcgi_temp_path $prefix/fastcgi;
    uwsgi_temp_path $prefix/uwsgi;
    scgi_temp_path $prefix/scgi;
    keepalive_requests 1000000;
$server
}
CONF
}

# The upstream's server block on port $1: every request is a created
# resource, answered 201 with a small JSON body.
upstream_block() {
    cat <<CONF
    server {
        listen 127.0.0.1:$1;
        location / {
            default_type application/json;
            return 201 '{"id":1,"status":"created"}';
        }
    }
CONF
}

# Writes the gateway's config $1: the store at $2 with durability $4, and
# two routes to the upstream on port $3: `/plain` with `key = "off"`
# (forwarding only) and everything else requiring a key, with
# `rotated_keys = "$ROTATED_KEYS"` when that is set.
idemgate_toml() {
    cat >"$1" <<CONF
[server]
listen = "127.0.0.1:0"
admin_listen = "127.0.0.1:0"
[store]
url = "sqlite://$2"
durability = "$4"
[[routes]]
name = "plain"
path_prefix = "/plain"
upstream = "http://127.0.0.1:$3"
key = "off"
[[routes]]
name = "orders"
path_prefix = "/"
upstream = "http://127.0.0.1:$3"
${ROTATED_KEYS:+rotated_keys = \"$ROTATED_KEYS\"}
CONF
}
