#!/usr/bin/env bash
# The store at scale: a store holding N completed operations, served by a
# running `idemgate serve` with its admin listener and token, measured in
# one run against the same gateway on an empty store.
#
#   benches/scale.sh                      # SQLite, N=5,000,000: ~15-25 min of populating here
#   N=1000000 benches/scale.sh
#   N=1000000 DURATION=20 IDEMGATE=target/release/idemgate benches/scale.sh
#   BACKEND=postgres N=1000000 benches/scale.sh
#
# BACKEND=postgres puts each gateway's store in a schema of its own on the
# server at PGURL (default postgres://postgres@127.0.0.1:5432/test, trust
# auth), created for the run and dropped after it (KEEP=1 keeps them).
#
# Steps, all on 127.0.0.1 (free ports, port 0 for the gateways):
#   1. `idemgate mock-upstream`, and two gateways in front of it (durability
#      "full", the defaults otherwise, info logs to a file): "big" and
#      "empty", each with its own store (a SQLite file, or a PostgreSQL
#      schema) and an admin token;
#   2. one write with a known key (the probe key) into "big", then
#      `idemgate bench --target … --populate N` through it: N completed
#      operations, written through the gateway as a client would;
#   3. first writes (a new key per request, `idemgate bench --target
#      --duration`, 64 connections, after a 2 s warm-up) on "big", then on
#      "empty", each without and then with a `GET /metrics` scrape every
#      second (rate, p50/p99/p99.9, the scrape's own latency);
#   4. sequential probes on "big": `GET /metrics`, the console's first page
#      `GET /admin/keys?state=unknown&limit=50`, the probe key's status
#      `GET /.idemgate/operations/{key}` on the proxy listener with the
#      scope header, and `GET /admin/stats` (p50/p99 over PROBES calls);
#   5. "big"'s resident memory (VmRSS, VmHWM; the gateway's own, not the
#      PostgreSQL server's) and store bytes (.db + -wal, or the schema's
#      relations with their indexes), per million operations.
# Then one table, with the issue's targets beside the figures.
#
# Every wait is bounded, every loop counted; every process started here is
# stopped on exit, and the temporary directory (stores, logs) removed
# (KEEP=1 keeps it and says where).
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
repo=$(dirname "$here")
if [ -z "${IDEMGATE:-}" ]; then
    echo "building idemgate (release)" >&2
    (cd "$repo" && cargo build --release --locked --bin idemgate >&2)
    IDEMGATE=$repo/target/release/idemgate
fi
export IDEMGATE REPO="$repo"
exec python3 - "$@" <<'PYTHON'
import base64
import http.client
import json
import math
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

BIN = os.environ["IDEMGATE"]
N = int(os.environ.get("N", "5000000"))
DURATION = int(os.environ.get("DURATION", "20"))  # seconds per measured run
WARM_UP = 2
CONCURRENCY = int(os.environ.get("CONCURRENCY", "64"))
PROBES = int(os.environ.get("PROBES", "50"))
AUTH = "Bearer idemgate-bench"  # what `idemgate bench` sends: one scope
TOKEN = secrets.token_hex(24)
PROBE_KEY = "scale-probe-" + secrets.token_hex(6)
BACKEND = os.environ.get("BACKEND", "sqlite")
if BACKEND not in ("sqlite", "postgres"):
    raise SystemExit(f"BACKEND={BACKEND}: sqlite or postgres")
PGURL = os.environ.get("PGURL", "postgres://postgres@127.0.0.1:5432/test")
SCOPE_KEY = base64.b64encode(os.urandom(32)).decode()  # the PostgreSQL stores'
RUN = secrets.token_hex(4)
schemas = []

work = tempfile.mkdtemp(prefix="idemgate-scale.")
procs = []


def cleanup():
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    for p in procs:
        try:
            p.wait(timeout=15)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait(timeout=5)
    if not os.environ.get("KEEP"):
        for schema in schemas:
            psql(f"DROP SCHEMA IF EXISTS {schema} CASCADE")
    if os.environ.get("KEEP"):
        print(f"kept {work}", file=sys.stderr)
    else:
        shutil.rmtree(work, ignore_errors=True)


def on_signal(signum, _frame):
    raise SystemExit(128 + signum)


signal.signal(signal.SIGTERM, on_signal)
signal.signal(signal.SIGINT, on_signal)


def psql(sql):
    """One statement on PGURL's database: its first value, as text."""
    r = subprocess.run(["psql", PGURL, "-v", "ON_ERROR_STOP=1", "-Atqc", sql],
                       capture_output=True, text=True, timeout=600)
    if r.returncode != 0:
        raise SystemExit(f"psql: {sql}: {r.stderr.strip()}")
    return r.stdout.strip()


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_port(port, seconds=10):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.1)
    raise SystemExit(f"nothing listens on 127.0.0.1:{port} after {seconds} s")


def start_gateway(name, upstream_port):
    if BACKEND == "sqlite":
        db = os.path.join(work, f"{name}.db")
        store = f'url = "sqlite://{db}"'
    else:
        db = f"idemgate_scale_{RUN}_{name}"
        psql(f"CREATE SCHEMA {db}")
        schemas.append(db)
        store = f'url = "{PGURL}?options[search_path]={db}"\nscope_key_env = "SCALE_SCOPE_KEY"'
    config = os.path.join(work, f"{name}.toml")
    with open(config, "w") as f:
        f.write(f"""[server]
listen = "127.0.0.1:0"
admin_listen = "127.0.0.1:0"
admin_token_env = "SCALE_ADMIN_TOKEN"
[store]
{store}
durability = "full"
[[routes]]
name = "orders"
path_prefix = "/"
upstream = "http://127.0.0.1:{upstream_port}"
""")
    out = open(os.path.join(work, f"{name}.out"), "w+")
    log = open(os.path.join(work, f"{name}.log"), "w")
    env = dict(os.environ, SCALE_ADMIN_TOKEN=TOKEN, SCALE_SCOPE_KEY=SCOPE_KEY)
    p = subprocess.Popen([BIN, "serve", "--config", config], stdout=out, stderr=log, env=env)
    procs.append(p)
    for _ in range(200):
        out.seek(0)
        m = re.search(r"^listening proxy=(\S+) admin=(\S+)", out.read(), re.M)
        if m:
            return {"name": name, "pid": p.pid, "db": db, "proxy": m.group(1), "admin": m.group(2)}
        if p.poll() is not None:
            break
        time.sleep(0.1)
    sys.stderr.write(open(os.path.join(work, f"{name}.log")).read())
    raise SystemExit(f"gateway {name} did not start within 20 s")


def request(addr, method, path, headers=None, body=None, timeout=15):
    """One request on a new connection: (status, body, milliseconds)."""
    host, port = addr.rsplit(":", 1)
    conn = http.client.HTTPConnection(host, int(port), timeout=timeout)
    try:
        t0 = time.perf_counter()
        conn.request(method, path, body=body, headers=headers or {})
        r = conn.getresponse()
        data = r.read()
        return r.status, data, (time.perf_counter() - t0) * 1000
    finally:
        conn.close()


def probe(addr, path, headers, expect=200):
    """PROBES sequential GETs on one keep-alive connection: latencies in ms."""
    host, port = addr.rsplit(":", 1)
    conn = http.client.HTTPConnection(host, int(port), timeout=15)
    times = []
    try:
        for _ in range(PROBES):
            t0 = time.perf_counter()
            conn.request("GET", path, headers=headers)
            r = conn.getresponse()
            r.read()
            times.append((time.perf_counter() - t0) * 1000)
            if r.status != expect:
                raise SystemExit(f"GET {path}: {r.status}, expected {expect}")
    finally:
        conn.close()
    return times


def pct(values, q):
    if not values:
        return float("nan")
    s = sorted(values)  # nearest rank
    return s[min(len(s) - 1, max(0, math.ceil(q * len(s)) - 1))]


def bench(args, seconds_bound):
    cmd = [BIN, "bench", "--json", "--concurrency", str(CONCURRENCY)] + args
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=seconds_bound)
    if r.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed: {r.stderr.strip()}")
    return json.loads(r.stdout)


def first_writes(gw, scrape):
    """A warm-up, then DURATION s of first writes; with `scrape`, a GET
    /metrics every second meanwhile (its latencies returned too)."""
    target = f"http://{gw['proxy']}/orders"
    bench(["--target", target, "--retries", "1", "--duration", f"{WARM_UP}s"], WARM_UP + 60)
    scrapes, stop = [], threading.Event()

    def scraper():
        for _ in range(DURATION + 30):  # bounded; ends with the run
            if stop.wait(1.0):
                return
            status, _, ms = request(gw["admin"], "GET", "/metrics")
            if status == 200:
                scrapes.append(ms)

    t = threading.Thread(target=scraper, daemon=True)
    if scrape:
        t.start()
    try:
        report = bench(["--target", target, "--retries", "1", "--duration", f"{DURATION}s"], DURATION + 120)
    finally:
        stop.set()
        if scrape:
            t.join(timeout=20)
    lat = report["latency_ms"]
    ok = report["outcomes"]
    return {
        "rps": report["throughput_rps"], "p50": lat["p50"], "p99": lat["p99"], "p999": lat["p999"],
        "requests": report["requests"], "outcomes": ok, "scrapes": scrapes,
    }


def rss(pid):
    with open(f"/proc/{pid}/status") as f:
        status = f.read()
    kib = lambda name: int(re.search(rf"^{name}:\s+(\d+) kB", status, re.M).group(1))
    return kib("VmRSS") * 1024, kib("VmHWM") * 1024


def store_bytes(db):
    if BACKEND == "postgres":  # the schema's tables with their indexes and TOAST
        return int(psql(f"""SELECT coalesce(sum(pg_total_relation_size(c.oid)), 0)
                            FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
                            WHERE n.nspname = '{db}' AND c.relkind = 'r'"""))
    total = 0
    for path in (db, db + "-wal"):
        if os.path.exists(path):
            total += os.path.getsize(path)
    return total


def operations(gw):
    status, body, _ = request(gw["admin"], "GET", "/admin/stats", {"Authorization": f"Bearer {TOKEN}"})
    if status != 200:
        return None
    stats = json.loads(body)
    # The counts by state: sum whatever numbers the `counts`/`states` part holds.
    def total(v):
        if isinstance(v, dict):
            return sum(total(x) for x in v.values())
        return v if isinstance(v, int) else 0
    for key in ("by_state", "states", "counts", "operations"):
        if key in stats:
            return total(stats[key])
    return None


def main():
    load_before = open("/proc/loadavg").read().split()[:3]
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    mock_port = free_port()
    mock = subprocess.Popen([BIN, "mock-upstream", "--listen", f"127.0.0.1:{mock_port}"],
                            stdout=subprocess.DEVNULL, stderr=open(os.path.join(work, "mock.log"), "w"))
    procs.append(mock)
    wait_port(mock_port)
    big = start_gateway("big", mock_port)
    empty = start_gateway("empty", mock_port)
    write_headers = {"Authorization": AUTH, "Content-Type": "application/json"}

    # The probe key, written first: the oldest of the N.
    status, _, _ = request(big["proxy"], "POST", "/orders",
                           dict(write_headers, **{"Idempotency-Key": PROBE_KEY}), b'{"probe":1}')
    if status != 201:
        raise SystemExit(f"probe write answered {status}")

    print(f"scale: populating {N:,} operations through {big['proxy']} ...", file=sys.stderr, flush=True)
    t0 = time.monotonic()
    store_file = ["--store-file", big["db"]] if BACKEND == "sqlite" else []
    pop = bench(["--target", f"http://{big['proxy']}/orders", "--populate", str(N),
                 "--gateway-pid", str(big["pid"])] + store_file,
                seconds_bound=max(600, N // 500))
    populated = pop["populate"]
    print(f"scale: populated in {time.monotonic() - t0:.0f} s, {populated['rate_per_second']:.0f}/s",
          file=sys.stderr, flush=True)
    rss_populated, _ = rss(big["pid"])
    bytes_populated = store_bytes(big["db"])

    runs = {}
    for label, gw, scrape in (("big", big, False), ("empty", empty, False),
                              ("big+scrape", big, True), ("empty+scrape", empty, True)):
        print(f"scale: first writes, {label} ...", file=sys.stderr, flush=True)
        runs[label] = first_writes(gw, scrape)

    admin_auth = {"Authorization": f"Bearer {TOKEN}"}
    probes = {
        "GET /metrics": probe(big["admin"], "/metrics", {}),
        "GET /admin/keys?state=unknown&limit=50": probe(big["admin"], "/admin/keys?state=unknown&limit=50", admin_auth),
        "GET /admin/keys?limit=50": probe(big["admin"], "/admin/keys?limit=50", admin_auth),
        "GET /.idemgate/operations/{key}": probe(big["proxy"], f"/.idemgate/operations/{PROBE_KEY}", {"Authorization": AUTH}),
        "GET /admin/stats": probe(big["admin"], "/admin/stats", admin_auth),
    }
    rss_end, hwm_end = rss(big["pid"])
    bytes_end = store_bytes(big["db"])
    ops_end = operations(big)
    load_after = open("/proc/loadavg").read().split()[:3]

    mib = 1 << 20
    millions = (N + 1) / 1e6
    version = subprocess.run([BIN, "--version"], capture_output=True, text=True).stdout.split()[-1]
    try:
        commit = subprocess.run(["git", "-C", os.environ["REPO"], "describe", "--always", "--dirty"],
                                capture_output=True, text=True, timeout=10).stdout.strip() or "?"
    except Exception:
        commit = "?"
    backend = "SQLite" if BACKEND == "sqlite" else "PostgreSQL"
    print(f"scale: {backend} (durability full), N = {N:,}, {DURATION} s per run, {CONCURRENCY} connections, {PROBES} probes")
    print(f"  {started}, {os.cpu_count()} CPUs, load average before: {' '.join(load_before)}, after: {' '.join(load_after)}")
    print(f"  idemgate {version} at {commit}")
    print()
    print(f"populate      {populated['operations']:,} operations at {populated['rate_per_second']:.0f}/s")
    print(f"store         {bytes_populated / mib:.1f} MiB after populating = {bytes_populated / mib / millions:.1f} MiB per million;"
          f" {bytes_end / mib:.1f} MiB at the end ({ops_end if ops_end is not None else '?'} operations)")
    print(f"resident      {rss_populated / mib:.1f} MiB after populating = {rss_populated / mib / millions:.1f} MiB per million;"
          f" {rss_end / mib:.1f} MiB at the end, peak {hwm_end / mib:.1f} MiB")
    print()
    print(f"{'first writes':<30} {'req/s':>9} {'p50 ms':>8} {'p99 ms':>8} {'p99.9 ms':>9} {'/metrics p50':>13} {'p99':>7}  outcomes")
    for label, r in runs.items():
        s = r["scrapes"]
        sc = f"{pct(s, .5):13.2f} {pct(s, .99):7.2f}" if s else f"{'-':>13} {'-':>7}"
        out = ",".join(f"{k}={v}" for k, v in sorted(r["outcomes"].items()))
        print(f"  {label:<28} {r['rps']:9.0f} {r['p50']:8.2f} {r['p99']:8.2f} {r['p999']:9.2f} {sc}  {out}")
    print()
    print(f"{'probe on big (sequential)':<46} {'p50 ms':>8} {'p99 ms':>8} {'max ms':>8}")
    for name, t in probes.items():
        print(f"  {name:<44} {pct(t, .5):8.2f} {pct(t, .99):8.2f} {max(t):8.2f}")
    print()
    b, bs, e = runs["big"], runs["big+scrape"], runs["empty"]
    metrics_p99 = pct(probes["GET /metrics"] + b["scrapes"] + bs["scrapes"], .99)
    console_p99 = pct(probes["GET /admin/keys?state=unknown&limit=50"], .99)
    checks = [
        ("/metrics p99 < 20 ms (probes and scrapes)", f"{metrics_p99:.2f} ms", metrics_p99 < 20),
        ("console first page p99 < 20 ms", f"{console_p99:.2f} ms", console_p99 < 20),
        ("rate with 1 Hz scrape >= 0.95x without", f"{bs['rps'] / b['rps']:.3f}x", bs["rps"] / b["rps"] >= 0.95),
        ("p99.9 with scrape <= 1.5x without", f"{bs['p999'] / b['p999']:.2f}x", bs["p999"] / b["p999"] <= 1.5),
        ("rate at N >= 0.9x empty", f"{b['rps'] / e['rps']:.3f}x", b["rps"] / e["rps"] >= 0.9),
        ("RSS <= 150 MiB", f"{max(rss_populated, rss_end) / mib:.1f} MiB", max(rss_populated, rss_end) <= 150 * mib),
    ]
    print(f"{'target':<46} {'measured':>12}  met")
    for name, value, met in checks:
        print(f"  {name:<44} {value:>12}  {'yes' if met else 'NO'}")


try:
    main()
finally:
    cleanup()
PYTHON
