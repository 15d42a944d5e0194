-- The outbox's payload and headers become `json` (idempotency-outbox), default names.
-- `jsonb` reorders keys, drops duplicate keys, rewrites numbers (1e2 becomes 100) and refuses the
-- \u0000 escape: the relay published a normalized copy of what was enqueued, and an event whose
-- payload or headers held U+0000 could not be enqueued at all. `json` keeps the input text as
-- given (checked to be JSON), so the relay publishes exactly the bytes that were enqueued.
-- Rows already stored keep their normalized text. The conversion rewrites the table under an
-- ACCESS EXCLUSIVE lock: run it when the outbox is small (after the relay drained it).
-- For another table name, run the same statements with that name.
ALTER TABLE "outbox"
    ALTER COLUMN payload TYPE json USING payload::text::json,
    ALTER COLUMN headers DROP DEFAULT,
    ALTER COLUMN headers TYPE json USING headers::text::json,
    ALTER COLUMN headers SET DEFAULT '{}';
