"""Creates one customer with stripe-python, unmodified, through the gateway
at the URL given as the first argument, and prints what the SDK did as one
JSON line: {"outcome": "resolved", "id": ...} or {"outcome": "raised",
"class", "type", "code", "status", "message"}."""

import json
import sys

import stripe


def main() -> None:
    client = stripe.StripeClient(
        "sk_test_idemgate",
        base_addresses={"api": sys.argv[1]},
        max_network_retries=2,
    )
    try:
        customer = client.v1.customers.create(params={"email": "jenny@example.com"})
        report = {"outcome": "resolved", "id": customer.to_dict().get("id")}
    except stripe.StripeError as err:
        envelope = err.error
        report = {
            "outcome": "raised",
            "class": type(err).__name__,
            "type": getattr(envelope, "type", None),
            "code": getattr(envelope, "code", None) or err.code,
            "status": err.http_status,
            "message": err.user_message,
        }
    print(json.dumps(report))


if __name__ == "__main__":
    main()
