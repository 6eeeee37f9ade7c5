#!/usr/bin/env python3
"""Chaos across PostgreSQL replicas: freezes, lease stalls and kills.

Two (or more) `idemgate serve` replicas share one PostgreSQL schema in
front of `idemgate mock-upstream`. Clients write keys through both,
retrying each key through the other replica until it settles, while the
chaos loop, for a bounded time, does one of these at random:

- SIGSTOP a replica for 0.3-3 s, then SIGCONT (a GC pause, a frozen VM);
- stall a replica's lease: hold its `replicas` row with another
  transaction for 1-3 s, so it cannot renew while everything else works;
- SIGKILL a replica and start it again.

Then it checks the two promises:

- duplicates: the mock's `GET /_effects` says how many writes it
  committed and under how many distinct keys: `writes - keys` is the
  number of duplicate upstream writes (must be 0);
- told but not held: every key whose client was told 201 is written
  once more after the chaos; the answer must be a replay of the very
  body the client got (else the client was told a success the store
  does not hold).

Only 127.0.0.1 is used; every loop is bounded in count and time. Needs
PostgreSQL at 127.0.0.1:5432 (trust auth, database `test`) and `psql`.

    cargo build --release
    python3 benches/chaos_replicas.py --binary target/release/idemgate --seconds 60
"""

import argparse
import base64
import http.client
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid

TOKEN = "chaos-admin-token"
# Every replica keys scopes with the same secret.
SCOPE_KEY = base64.b64encode(os.urandom(32)).decode()
PG = "postgres://postgres@127.0.0.1:5432/test"


def psql(sql):
    return subprocess.run(
        ["psql", PG, "-Atqc", sql], check=True, capture_output=True, text=True
    ).stdout.strip()


class Replica:
    """One `idemgate serve` process, restartable."""

    def __init__(self, binary, config, log_dir, name):
        self.binary, self.config, self.name = binary, config, name
        self.log_dir = log_dir
        self.starts = 0
        self.start()

    def start(self):
        self.starts += 1
        log = open(os.path.join(self.log_dir, f"{self.name}-{self.starts}.log"), "w")
        env = dict(os.environ, IDEMGATE_CHAOS_TOKEN=TOKEN, IDEMGATE_SCOPE_KEY=SCOPE_KEY)
        self.proc = subprocess.Popen(
            [self.binary, "serve", "--config", self.config],
            stdout=subprocess.PIPE,
            stderr=log,
            env=env,
            text=True,
        )
        line = self.proc.stdout.readline()
        if not line.startswith("listening"):
            raise SystemExit(f"{self.name} did not start: {line!r}")
        fields = dict(part.split("=", 1) for part in line.split()[1:])
        self.proxy = fields["proxy"]
        self.admin = fields["admin"]

    def signal(self, sig):
        try:
            os.kill(self.proc.pid, sig)
        except ProcessLookupError:
            pass

    def kill(self):
        self.signal(signal.SIGKILL)
        self.proc.wait()


def request(addr, method, path, body=None, headers=None, timeout=30):
    host, port = addr.rsplit(":", 1)
    conn = http.client.HTTPConnection(host, int(port), timeout=timeout)
    try:
        conn.request(method, path, body=body, headers=headers or {})
        resp = conn.getresponse()
        return resp.status, dict(resp.getheaders()), resp.read()
    finally:
        conn.close()


def write(addr, key, body):
    headers = {
        "Idempotency-Key": key,
        "Content-Type": "application/json",
        "Authorization": "Bearer chaos-client",
    }
    return request(addr, "POST", "/orders/slow?ms=30", body, headers)


class Tally:
    def __init__(self):
        self.lock = threading.Lock()
        self.told = {}  # key -> body the client was told with a 201
        self.answers = {}  # status/problem -> count
        self.unsettled = 0
        self.keys = 0

    def count(self, what):
        with self.lock:
            self.answers[what] = self.answers.get(what, 0) + 1


def client(replicas, name, most, tally, deadline, chaos_over):
    """New keys until the chaos is over (at most `most`), each until it
    settles: 201 (fresh or replay) or held (409 outcome-unknown), retried
    through the replicas in turn."""
    for k in range(most):
        if chaos_over.is_set():
            return
        key = f"{name}-k{k}"
        with tally.lock:
            tally.keys += 1
        body = json.dumps({"order": key, "amount": 250})
        for attempt in range(60):
            if time.monotonic() > deadline:
                tally.unsettled += 1
                return
            replica = replicas[(hash(key) + attempt) % len(replicas)]
            try:
                status, headers, got = write(replica.proxy, key, body)
            except OSError:
                tally.count("connection error")
                time.sleep(0.1)
                continue
            if status == 201:
                with tally.lock:
                    first = tally.told.setdefault(key, got)
                if first != got:
                    tally.count("201 with another body (told twice differently)")
                tally.count("201 replay" if headers.get("idempotent-replayed") else "201 fresh")
                break
            try:
                code = json.loads(got).get("error", {}).get("code", "?")
            except ValueError:
                code = "?"
            tally.count(f"{status} {code}")
            if status == 409 and code == "outcome-unknown":
                break
            time.sleep(0.05 + random.random() * 0.1)
        else:
            tally.unsettled += 1


def chaos(replicas, seconds, events):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        time.sleep(random.uniform(0.5, 1.5))
        victim = random.choice(replicas)
        what = random.choices(["stop", "stall", "kill"], weights=[5, 4, 1])[0]
        if what == "stop":
            pause = random.uniform(0.3, 3.0)
            victim.signal(signal.SIGSTOP)
            time.sleep(pause)
            victim.signal(signal.SIGCONT)
        elif what == "stall":
            owners = psql(f"SELECT id FROM {SCHEMA}.replicas ORDER BY random() LIMIT 1")
            if not owners:
                continue
            hold = random.uniform(1.0, 3.0)
            holder = subprocess.Popen(
                ["psql", PG, "-qc",
                 f"BEGIN; SELECT 1 FROM {SCHEMA}.replicas WHERE id = '{owners}' FOR UPDATE; "
                 f"SELECT pg_sleep({hold:.2f}); COMMIT;"],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            )
            holder.wait(timeout=30)
        else:
            victim.kill()
            victim.start()
        events[what] = events.get(what, 0) + 1
    for replica in replicas:
        replica.signal(signal.SIGCONT)


def main():
    global SCHEMA
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--binary", default="target/release/idemgate")
    parser.add_argument("--seconds", type=float, default=60)
    parser.add_argument("--replicas", type=int, default=2)
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--keys", type=int, default=5000, help="most keys per client")
    parser.add_argument("--lease", default="1s")
    parser.add_argument("--seed", type=int, default=None)
    args = parser.parse_args()
    seed = args.seed if args.seed is not None else random.randrange(1 << 30)
    random.seed(seed)

    SCHEMA = f"idemgate_chaos_{uuid.uuid4().hex[:12]}"
    psql(f"CREATE SCHEMA {SCHEMA}")
    work = tempfile.mkdtemp(prefix="idemgate-chaos-")
    mock = subprocess.Popen(
        [args.binary, "mock-upstream", "--listen", "127.0.0.1:0"],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
    )
    mock_addr = mock.stdout.readline().split("mock=")[1].strip()
    config = os.path.join(work, "replica.toml")
    with open(config, "w") as f:
        f.write(f"""
[server]
listen = "127.0.0.1:0"
admin_listen = "127.0.0.1:0"
admin_token_env = "IDEMGATE_CHAOS_TOKEN"

[store]
url = "{PG}?options[search_path]={SCHEMA}"
lease = "{args.lease}"

[[routes]]
name = "orders"
path_prefix = "/orders"
upstream = "http://{mock_addr}"
key = "require"
scope_headers = ["authorization"]
methods = ["POST"]
upstream_timeout = "5s"
""")
    replicas = [Replica(args.binary, config, work, f"r{i}") for i in range(args.replicas)]
    tally, events, stop = Tally(), {}, threading.Event()
    deadline = time.monotonic() + args.seconds + 60
    threads = [
        threading.Thread(target=client, args=(replicas, f"c{c}", args.keys, tally, deadline, stop))
        for c in range(args.clients)
    ]
    chaos_thread = threading.Thread(target=chaos, args=(replicas, args.seconds, events))
    started = time.monotonic()
    chaos_thread.start()
    for t in threads:
        t.start()
    chaos_thread.join()
    stop.set()
    for t in threads:
        t.join()
    elapsed = time.monotonic() - started

    # After the chaos: every key told 201 must replay exactly that body.
    not_held = 0
    for key, body in tally.told.items():
        expected = json.dumps({"order": key, "amount": 250})
        for attempt in range(50):
            status, headers, got = write(replicas[attempt % len(replicas)].proxy, key, expected)
            if status != 503:
                break
            time.sleep(0.2)
        if status != 201 or got != body:
            not_held += 1
            print(f"told 201 but the store answers {status}: {key}", file=sys.stderr)
    _, _, effects = request(mock_addr, "GET", "/_effects")
    effects = json.loads(effects)
    report = {
        "seed": seed,
        "seconds": round(elapsed, 1),
        "replicas": args.replicas,
        "lease": args.lease,
        "chaos_events": events,
        "keys": tally.keys,
        "upstream_writes": effects["writes"],
        "upstream_keys": effects["keys"],
        "duplicate_upstream_writes": effects["writes"] - effects["keys"],
        "clients_told_201": len(tally.told),
        "told_success_store_does_not_hold": not_held,
        "answers": dict(sorted(tally.answers.items())),
        "unsettled_keys": tally.unsettled,
    }
    print(json.dumps(report, indent=2))
    for replica in replicas:
        replica.kill()
    mock.kill()
    psql(f"DROP SCHEMA {SCHEMA} CASCADE")
    ok = report["duplicate_upstream_writes"] == 0 and not_held == 0
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
