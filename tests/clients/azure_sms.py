"""Sends one SMS with azure-communication-sms, unmodified, through the
gateway at the URL given as the first argument (a fake SMS API behind it),
with the SDK's own retry policy on, and prints what the SDK did as one JSON
line: {"outcome": "resolved", "ids": [...]} or {"outcome": "raised",
"status", "repeatability_result"}, plus "attempts" (HTTP requests the SDK
sent, its retries included) and "request_ids" (the repeatability request
id each attempt's body carried)."""

import base64
import json
import sys

from azure.communication.sms import SmsClient
from azure.core.credentials import AzureKeyCredential
from azure.core.exceptions import HttpResponseError


def main() -> None:
    access_key = base64.b64encode(b"idemgate-test-access-key-0123456").decode()
    attempts = []

    def count(request):
        body = json.loads(request.http_request.body or "{}")
        attempts.append(body["smsRecipients"][0]["repeatabilityRequestId"])

    # The endpoint and key as SmsClient takes them: a connection string
    # would force https on the endpoint's host; the HMAC signing is the same.
    client = SmsClient(
        sys.argv[1],
        AzureKeyCredential(access_key),
        retry_total=2,
        retry_backoff_factor=0.1,
        raw_request_hook=count,
    )
    try:
        sent = client.send(from_="+18005550100", to="+18005550101", message="hello")
        report = {"outcome": "resolved", "ids": [r.message_id for r in sent]}
    except HttpResponseError as err:
        headers = err.response.headers if err.response is not None else {}
        report = {
            "outcome": "raised",
            "status": err.status_code,
            "repeatability_result": headers.get("repeatability-result"),
        }
    report["attempts"] = len(attempts)
    report["request_ids"] = sorted(set(attempts))
    print(json.dumps(report))


if __name__ == "__main__":
    main()
