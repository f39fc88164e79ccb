-- The deliveries whose ids are in $1, a JSON array of numbers, in any order: one statement
-- for all the dead ends a dispatcher keeps to confirm, however many.
SELECT id, message_id, endpoint, state, attempts, last_status, last_error
FROM idem_outbox_deliveries
WHERE id IN (SELECT value::bigint FROM json_array_elements_text($1::json) AS ids(value))
