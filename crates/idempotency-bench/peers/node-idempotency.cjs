// First executions through @node-idempotency/core with its Redis storage adapter, for the load
// bench's peer rows (`idempotency-bench --only-first --peers DIR`). Each operation is what that
// library's middleware does for a new key: `onRequest` (SET NX of an in-progress record), the
// business insert autocommitted in PostgreSQL (the same statement as the bench's), `onResponse`
// (SET of the completed record). Not transactional: the record and the insert commit apart.
//
//   node node-idempotency.cjs --clients 4 --seconds 2 --schema S --prefix P
//
// DATABASE_URL and REDIS_URL as for the bench; prints one JSON line:
// {"elapsed_s": <measured window>, "latencies_us": [<one per operation>]}.
"use strict";
const { Idempotency } = require("@node-idempotency/core");
const { RedisStorageAdapter } = require("@node-idempotency/storage-adapter-redis");
const { Pool } = require("pg");

function args() {
  const out = { clients: 4, seconds: 1, schema: "public", prefix: `peer-${process.pid}` };
  const argv = process.argv.slice(2);
  for (let i = 0; i < argv.length; i += 2) {
    const name = argv[i].replace(/^--/, "");
    if (!(name in out)) throw new Error(`unknown option ${argv[i]}`);
    out[name] = typeof out[name] === "number" ? Number(argv[i + 1]) : argv[i + 1];
  }
  return out;
}

async function main() {
  const { clients, seconds, schema, prefix } = args();
  const pool = new Pool({
    connectionString: process.env.DATABASE_URL || "postgres://postgres@127.0.0.1:5432/test",
    max: clients,
    options: `-c search_path=${schema}`,
  });
  const storage = new RedisStorageAdapter({ url: process.env.REDIS_URL || "redis://127.0.0.1:6379" });
  await storage.connect();
  const idempotency = new Idempotency(storage, { cacheTTLMS: 3600 * 1000 });
  // Every connection opened before the clock starts, as the other scenarios' pools are.
  const warm = await Promise.all(Array.from({ length: clients }, () => pool.connect()));
  warm.forEach((c) => c.release());

  const latencies = [];
  const started = process.hrtime.bigint();
  const deadline = started + BigInt(Math.round(seconds * 1e9));
  const client = async (c) => {
    for (let i = 0; process.hrtime.bigint() < deadline; i++) {
      const began = process.hrtime.bigint();
      const key = `${prefix}-${c}-${i}`;
      const body = { orderId: key, recipient: "alice", amount: "100.00" };
      const req = { method: "POST", path: "/payments", headers: { "idempotency-key": key }, body };
      const replayed = await idempotency.onRequest(req);
      if (replayed) throw new Error(`fresh key ${key} replayed`);
      const { rows } = await pool.query({
        name: "insert_payment",
        text: "INSERT INTO bench_payments (order_id, amount) VALUES ($1, 100.00) RETURNING id",
        values: [key],
      });
      const payment = { paymentId: Number(rows[0].id), orderId: key, amount: "100.00", status: "CONFIRMED" };
      await idempotency.onResponse(req, { body: payment, additional: { status: 201 } });
      latencies.push(Number((process.hrtime.bigint() - began) / 1000n));
    }
  };
  await Promise.all(Array.from({ length: clients }, (_, c) => client(c)));
  const elapsed = Number(process.hrtime.bigint() - started) / 1e9;
  process.stdout.write(JSON.stringify({ elapsed_s: elapsed, latencies_us: latencies }) + "\n");
  await storage.disconnect();
  await pool.end();
}

main().catch((err) => {
  console.error(err);
  process.exit(1);
});
