"""First executions through Powertools for AWS Lambda (Python) with its Redis persistence layer,
for the load bench's peer rows (`idempotency-bench --only-first --peers DIR`).

Each operation is a call of an `idempotent_function` whose body is the business insert,
autocommitted in PostgreSQL (the same statement as the bench's): Powertools writes an in-progress
record (SET NX), runs the function, then writes the completed record (SET). Not transactional:
the record and the insert commit apart. One process per client, as Lambda runs one request per
process.

    python powertools.py --clients 4 --seconds 2 --schema S --prefix P

DATABASE_URL and REDIS_URL as for the bench; prints one JSON line:
{"elapsed_s": <measured window>, "latencies_us": [<one per operation>]}.
"""

import argparse
import json
import multiprocessing
import os
import time
import warnings

DATABASE_URL = os.environ.get("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/test")
REDIS_URL = os.environ.get("REDIS_URL", "redis://127.0.0.1:6379")


def client(index, schema, prefix, start, deadline):
    import psycopg
    from aws_lambda_powertools.utilities.idempotency import IdempotencyConfig, idempotent_function
    from aws_lambda_powertools.utilities.idempotency.persistence.cache import CachePersistenceLayer

    # Outside Lambda there is no remaining time to register, and the persistence layer's alias
    # warns about its own deprecation: neither says anything about the measurement.
    warnings.filterwarnings("ignore", message="Couldn't determine the remaining time left")
    warnings.filterwarnings("ignore", message="RedisCachePersistenceLayer will be removed")
    conn = psycopg.connect(DATABASE_URL, autocommit=True, options=f"-c search_path={schema}")
    layer = CachePersistenceLayer(url=REDIS_URL)
    config = IdempotencyConfig(expires_after_seconds=3600)

    @idempotent_function(data_keyword_argument="request", persistence_store=layer, config=config)
    def pay(request):
        (payment_id,) = conn.execute(
            "INSERT INTO bench_payments (order_id, amount) VALUES (%s, 100.00) RETURNING id",
            (request["orderId"],),
            prepare=True,
        ).fetchone()
        return {"paymentId": payment_id, "orderId": request["orderId"], "amount": "100.00", "status": "CONFIRMED"}

    latencies = []
    while time.time() < start:
        time.sleep(0.001)
    i = 0
    while time.time() < deadline:
        began = time.perf_counter()
        key = f"{prefix}-{index}-{i}"
        payment = pay(request={"orderId": key, "recipient": "alice", "amount": "100.00"})
        if payment["orderId"] != key:
            raise RuntimeError(f"fresh key {key} answered with {payment}")
        latencies.append(int((time.perf_counter() - began) * 1e6))
        i += 1
    conn.close()
    return latencies


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--seconds", type=float, default=1.0)
    parser.add_argument("--schema", default="public")
    parser.add_argument("--prefix", default=f"peer-{os.getpid()}")
    args = parser.parse_args()
    # The clock starts once every process has imported its modules and connected.
    start = time.time() + 1.5
    deadline = start + args.seconds
    work = [(c, args.schema, args.prefix, start, deadline) for c in range(args.clients)]
    with multiprocessing.Pool(args.clients) as pool:
        # A client that raises makes starmap raise here, and the run fails.
        latencies = [micros for part in pool.starmap(client, work) for micros in part]
    print(json.dumps({"elapsed_s": args.seconds, "latencies_us": latencies}))


if __name__ == "__main__":
    main()
