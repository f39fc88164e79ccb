-- One delivery per named endpoint, in the caller's transaction, and none unless every named
-- endpoint is registered. ?6 is a JSON array of distinct endpoint names.
INSERT INTO idem_outbox_deliveries
    (message_id, endpoint, payload, content_type, headers, created_at, state, next_at, attempts)
SELECT ?1, e.name, ?2, ?3, ?4, ?5, 'pending', ?5, 0
FROM idem_outbox_endpoints AS e
WHERE e.name IN (SELECT value FROM json_each(?6))
  AND (SELECT count(*) FROM idem_outbox_endpoints WHERE name IN (SELECT value FROM json_each(?6)))
      = json_array_length(?6)
