-- A record changed (its completion landed, or it was released): tell the change feeds of other
-- processes (C5, the bounded wait of a duplicate). Delivered when the statement's transaction
-- commits, to every session that LISTENs on the channel in this database.
-- $1 the channel, $2 the payload (the record's digest as 64 hex digits, or a feed's ping).
SELECT pg_notify($1, $2)
