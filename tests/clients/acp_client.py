"""A small ACP checkout client that follows §6 of the Agentic Commerce
Protocol's checkout RFC as written, and nothing else: one UUID v4
Idempotency-Key per intended POST, kept for every retry of it (§6.1); a
retry after a 5xx or a 409 idempotency_in_flight, honouring Retry-After
(§6.4, §6.5); 422 idempotency_conflict is permanent, never retried (§6.4).

Usage: acp_client.py URL MAX_ATTEMPTS MAX_WAIT_SECONDS. Creates one
checkout session at URL and prints one JSON line: {"outcome": "created" |
"held" | "refused", "statuses": [...], "keys": [...], "codes": [...],
"echoed": [...]} (the Idempotency-Key each answer echoed, §3.1)."""

import json
import sys
import time
import urllib.error
import urllib.request
import uuid


def post(url, key, body):
    request = urllib.request.Request(
        url,
        data=json.dumps(body).encode(),
        method="POST",
        headers={
            "Authorization": "Bearer agent-token",
            "Content-Type": "application/json",
            "API-Version": "2026-01-16",
            "Idempotency-Key": key,
        },
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, dict(response.headers), response.read()
    except urllib.error.HTTPError as err:
        return err.code, dict(err.headers), err.read()


def main() -> None:
    url, max_attempts, max_wait = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
    body = {"line_items": [{"id": "item_123", "quantity": 1}]}
    key = str(uuid.uuid4())
    report = {"statuses": [], "keys": [], "codes": [], "echoed": []}
    outcome = "held"
    for _ in range(max_attempts):
        status, headers, raw = post(url, key, body)
        headers = {k.lower(): v for k, v in headers.items()}
        try:
            code = json.loads(raw).get("code")
        except (ValueError, AttributeError):
            code = None
        report["statuses"].append(status)
        report["keys"].append(key)
        report["codes"].append(code)
        report["echoed"].append(headers.get("idempotency-key"))
        if 200 <= status < 300:
            outcome = "created"
            break
        if status == 409 and code == "idempotency_in_flight" or status >= 500:
            time.sleep(min(float(headers.get("retry-after", "1")), max_wait))
            continue
        outcome = "refused"
        break
    report["outcome"] = outcome
    print(json.dumps(report))


if __name__ == "__main__":
    main()
