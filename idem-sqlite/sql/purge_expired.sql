-- One bounded batch of expired records (C10); the deadline index finds them.
DELETE FROM idem_records
WHERE rowid IN (SELECT rowid FROM idem_records WHERE deadline <= ?1 LIMIT ?2)
