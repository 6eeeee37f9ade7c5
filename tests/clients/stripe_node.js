// Creates one customer with stripe-node, unmodified, through the gateway at
// the URL given as the first argument, and prints what the SDK did as one
// JSON line: {"outcome": "resolved", "id": ...} or {"outcome": "raised",
// "class", "type", "code", "status", "message"}, plus "attempts" (HTTP
// requests the SDK sent, its own retries included).
'use strict';

const Stripe = require('stripe');

async function main() {
  const gateway = new URL(process.argv[2]);
  const stripe = new Stripe('sk_test_idemgate', {
    host: gateway.hostname,
    port: Number(gateway.port),
    protocol: gateway.protocol.replace(':', ''),
    maxNetworkRetries: 2,
    timeout: 10000,
  });
  let attempts = 0;
  stripe.on('request', () => {
    attempts += 1;
  });
  let report;
  try {
    const customer = await stripe.customers.create({ email: 'jenny@example.com' });
    report = { outcome: 'resolved', id: customer.id ?? null };
  } catch (err) {
    report = {
      outcome: 'raised',
      class: err.type ?? err.constructor.name,
      type: err.raw?.type ?? null,
      code: err.code ?? null,
      status: err.statusCode ?? null,
      message: err.message ?? null,
    };
  }
  report.attempts = attempts;
  console.log(JSON.stringify(report));
}

main().catch((err) => {
  console.error(err);
  process.exit(2);
});
