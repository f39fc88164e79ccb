-- idem PostgreSQL schema, version 3: for operators (`inspect`, listings), when each completion
-- landed and which process made the current reservation. `completed_at` is the server's time
-- (C11), set by the completion and cleared by a new reservation; NULL in progress and for a row
-- completed before version 3 (unknown). `holder` is `idem_core::Holder`'s stored form
-- (`h1 <pid> <start id> <start time> <host>`), written by a fresh reservation and by a
-- takeover; NULL for a row reserved before version 3 (unknown). Nullable without a default:
-- adding them changes the catalog only and rewrites nothing. The index a lookup by key reads is
-- built afterwards, without blocking writes: index_key.sql.
ALTER TABLE idem_records
    ADD COLUMN IF NOT EXISTS completed_at timestamptz,
    ADD COLUMN IF NOT EXISTS holder text;
