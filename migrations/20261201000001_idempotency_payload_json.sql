-- The outcome payload is kept as the JSON text the serializer wrote (json, not jsonb): jsonb
-- refuses the \u0000 escape and reorders keys and rewrites numbers, so replays were not
-- byte-identical. Existing rows keep their values (in jsonb's normalized spelling).
ALTER TABLE "idempotency_records" ALTER COLUMN result_payload TYPE json USING result_payload::text::json;
