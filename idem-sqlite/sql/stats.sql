-- Records by state at ?1 (now), for operators (store rule 6): in progress live, orphaned,
-- completed live, expired awaiting the purge, and the oldest known reservation time in progress.
-- One pass over the table.
SELECT coalesce(sum(state = 0 AND deadline > ?1), 0),
       coalesce(sum(state = 0 AND deadline <= ?1), 0),
       coalesce(sum(state = 1 AND deadline > ?1), 0),
       coalesce(sum(state = 1 AND deadline <= ?1), 0),
       min(CASE WHEN state = 0 AND reserved_at > 0 THEN reserved_at END)
FROM idem_records
