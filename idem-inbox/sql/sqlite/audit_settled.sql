-- An outcome: processed (1) is final, so a row already processed is never changed; the
-- processed time is set only with it. No row: nothing was delivered, nothing to record.
-- ?1 source, ?2 event key, ?3 outcome code, ?4 settled at (ms).
UPDATE idem_records_inbox_audit
SET outcome = ?3,
    processed = CASE WHEN ?3 = 1 THEN ?4 ELSE processed END
WHERE source = ?1 AND event_key = ?2 AND outcome <> 1
