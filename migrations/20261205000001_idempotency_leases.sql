-- Leased claims (LeasedClaims, IdempotencyLayer::leased): the lease columns of the records
-- table and the sequence the fencing tokens come from, as the canonical DDL has them. A
-- sequence created over a table that already carries tokens (leases prepared by an earlier
-- release) starts above the highest of them. Idempotent.
ALTER TABLE "idempotency_records" ADD COLUMN IF NOT EXISTS lease_token BIGINT,
                                  ADD COLUMN IF NOT EXISTS lease_expires_at TIMESTAMPTZ;
CREATE SEQUENCE IF NOT EXISTS "idempotency_records_lease_token_seq";
SELECT setval('"idempotency_records_lease_token_seq"', x.m)
  FROM (SELECT max(lease_token) AS m FROM "idempotency_records") AS x,
       "idempotency_records_lease_token_seq" AS s
 WHERE x.m IS NOT NULL AND NOT s.is_called;
