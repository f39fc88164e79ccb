-- Fresh reservation (C4): the unique constraint decides the race; 0 rows = someone else won.
INSERT INTO idem_records (consumer, route, key, fingerprint, token, state, deadline, response)
VALUES (?1, ?2, ?3, ?4, ?5, 0, ?6, NULL)
ON CONFLICT (consumer, route, key) DO NOTHING
