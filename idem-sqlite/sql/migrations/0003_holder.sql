-- idem SQLite schema, version 3, second step: which process made the current reservation
-- (`idem_core::Holder`, its stored form: `h1 <pid> <start id> <start time> <host>`), written by
-- a fresh reservation and by a takeover; NULL for a row reserved before version 3 (unknown).
ALTER TABLE idem_records ADD COLUMN holder TEXT;
