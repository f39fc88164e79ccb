-- Fresh reservation (C4): the unique constraint decides the race; 0 rows = someone else won.
-- ?7 is now: when the reservation was made; ?8 the holder (the reserving process). A new
-- execution is not in doubt.
INSERT INTO idem_records (consumer, route, key, fingerprint, token, state, deadline, response, reserved_at, holder, doubt, doubt_check_at)
VALUES (?1, ?2, ?3, ?4, ?5, 0, ?6, NULL, ?7, ?8, NULL, NULL)
ON CONFLICT (consumer, route, key) DO NOTHING
