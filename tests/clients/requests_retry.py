"""POSTs one JSON write with requests and urllib3's Retry (any method, on
502/503/504) and an explicit Idempotency-Key through the gateway, and prints
what the client ended with as one JSON line: {"outcome": "response",
"status", "content_type", "body" (parsed JSON, or null), "retried" (the
statuses urllib3 retried on)} or {"outcome": "raised", "class", "message"}.

Arguments: the URL to POST to, and the key."""

import json
import sys

import requests
from requests.adapters import HTTPAdapter
from urllib3.util.retry import Retry


def main() -> None:
    url, key = sys.argv[1], sys.argv[2]
    retry = Retry(total=3, allowed_methods=None, status_forcelist=[502, 503, 504])
    session = requests.Session()
    session.mount("http://", HTTPAdapter(max_retries=retry))
    try:
        response = session.post(
            url,
            json={"task": "write the report"},
            headers={"Idempotency-Key": key, "Authorization": "Bearer requests-client"},
            timeout=10,
        )
    except requests.RequestException as err:
        print(json.dumps({"outcome": "raised", "class": type(err).__name__, "message": str(err)}))
        return
    try:
        body = response.json()
    except ValueError:
        body = None
    history = response.raw.retries.history if response.raw.retries else ()
    print(
        json.dumps(
            {
                "outcome": "response",
                "status": response.status_code,
                "content_type": response.headers.get("content-type"),
                "body": body,
                "retried": [attempt.status for attempt in history],
            }
        )
    )


if __name__ == "__main__":
    main()
