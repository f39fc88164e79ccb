-- Records by state at the server's now (store rule 6): in progress live, orphaned, completed
-- live, expired awaiting the purge, the oldest known reservation time in progress, and the live
-- completed records in doubt (counted as completed too). One pass over the table. The oldest
-- is read among finite times: a reservation at infinity (a hand-made row) is counted, not dated.
WITH clock AS (
    SELECT clock_timestamp() AS now
)
SELECT floor(date_part('epoch', c.now) * 1000 + 0.0005)::bigint AS now_ms,
       count(r.state) FILTER (WHERE r.state = 0 AND r.deadline > c.now) AS in_progress,
       count(r.state) FILTER (WHERE r.state = 0 AND r.deadline <= c.now) AS orphaned,
       count(r.state) FILTER (WHERE r.state = 1 AND r.deadline > c.now) AS completed,
       count(r.state) FILTER (WHERE r.state = 1 AND r.deadline <= c.now) AS expired,
       round(extract(epoch FROM min(r.reserved_at) FILTER (WHERE r.state = 0 AND r.reserved_at > 'epoch' AND isfinite(r.reserved_at))) * 1000)::bigint AS oldest_ms,
       count(r.state) FILTER (WHERE r.state = 1 AND r.deadline > c.now AND r.doubt IS NOT NULL) AS in_doubt
FROM clock c
LEFT JOIN idem_records r ON true
GROUP BY c.now
