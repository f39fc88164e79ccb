-- The audit trail of one (consumer, route, key) (Operator rule 4): its entries kept past ?4
-- (now), the newest ?5 of them, oldest first, through the trail's index.
SELECT at, entry
FROM (
    SELECT id, at, entry
    FROM idem_records_reconciliations
    WHERE consumer = ?1 AND route = ?2 AND key = ?3 AND kept_until > ?4
    ORDER BY id DESC
    LIMIT ?5
)
ORDER BY id
