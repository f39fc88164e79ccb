-- The audit entry of a decision applied (store rule 7), in the transaction of its change: the
-- record's (consumer, route, key) ?1..?3, when (?4, now), the entry's bytes (?5) and until when
-- it is kept (?6).
INSERT INTO idem_records_reconciliations (consumer, route, key, at, entry, kept_until)
VALUES (?1, ?2, ?3, ?4, ?5, ?6)
