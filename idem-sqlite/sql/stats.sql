-- Records by state at ?1 (now), for operators (store rule 6): in progress live, orphaned,
-- completed live, expired awaiting the purge, the oldest known reservation time in progress, and
-- the live completed records in doubt (counted as completed too). One pass over the table.
SELECT coalesce(sum(state = 0 AND deadline > ?1), 0),
       coalesce(sum(state = 0 AND deadline <= ?1), 0),
       coalesce(sum(state = 1 AND deadline > ?1), 0),
       coalesce(sum(state = 1 AND deadline <= ?1), 0),
       min(CASE WHEN state = 0 AND reserved_at > 0 THEN reserved_at END),
       coalesce(sum(state = 1 AND deadline > ?1 AND doubt IS NOT NULL), 0)
FROM idem_records
