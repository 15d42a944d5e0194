-- From the table of the Spring Boot idempotency starter (its idempotency-records.sql) to the
-- canonical records table, default name `idempotency_records`. For another name (the starter's
-- `table-name`, schema-qualified or not), run the same statements with that name.
--
-- The starter keys records by (operation, idempotency_key), keeps the outcome as jsonb and the
-- Java class of the value in result_type. This migration:
--   * adds `scope` with the empty string, the default scope: every existing row keeps answering
--     calls made without a scope, as the starter's calls were;
--   * re-keys the primary key to (operation, scope, idempotency_key), which ON CONFLICT needs;
--   * converts result_payload to json (the text as written; jsonb rewrote keys and numbers), the
--     value of a COMPLETED row or the details of a REJECTED row, as the starter wrote them;
--     error_code already is the rejection code;
--   * drops result_type, which the store neither reads nor writes (delete that line to keep the
--     column: `validate` accepts extra nullable columns);
--   * adds the status CHECK and the created_at default of the canonical DDL, and replaces the
--     starter's expiry index with the canonical partial one.
-- Every row stays replayable: status, request_hash, payload and error_code are kept as they were.
-- The starter's fingerprint equals this library's for most requests, not all: see "Coming from
-- the starter" in crates/idempotency-pg/README.md.
--
-- Stop the starter's instances first: their INSERT ... ON CONFLICT (operation, idempotency_key)
-- fails once the key has changed. The conversion rewrites the table under an ACCESS EXCLUSIVE
-- lock.
--
-- On a table that already has `scope` (made by the canonical DDL), or with no table, this does
-- nothing: the file is safe in the `sqlx migrate run` sequence of this directory.
DO $$
DECLARE
    pkey name;
BEGIN
    IF to_regclass('idempotency_records') IS NULL OR EXISTS (
        SELECT 1 FROM pg_attribute
        WHERE attrelid = to_regclass('idempotency_records')
          AND attname = 'scope' AND NOT attisdropped
    ) THEN
        RETURN;
    END IF;

    SELECT conname INTO pkey FROM pg_constraint
    WHERE conrelid = to_regclass('idempotency_records') AND contype = 'p';
    IF pkey IS NOT NULL THEN
        EXECUTE format('ALTER TABLE idempotency_records DROP CONSTRAINT %I', pkey);
    END IF;

    ALTER TABLE idempotency_records
        ADD COLUMN scope VARCHAR(255) NOT NULL DEFAULT '',
        ALTER COLUMN result_payload TYPE json USING result_payload::text::json,
        ALTER COLUMN created_at SET DEFAULT now(),
        DROP COLUMN IF EXISTS result_type,
        ADD CONSTRAINT idempotency_records_status_check
            CHECK (status IN ('PROCESSING', 'COMPLETED', 'REJECTED')),
        ADD PRIMARY KEY (operation, scope, idempotency_key);

    DROP INDEX IF EXISTS idx_idempotency_records_expires_at;
    CREATE INDEX IF NOT EXISTS idempotency_records_expires_at_idx
        ON idempotency_records (expires_at) WHERE expires_at IS NOT NULL;
END
$$;
