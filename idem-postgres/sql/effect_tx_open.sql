-- Whether the transaction the store began for an effect is still open: its BEGIN made it
-- DEFERRABLE (src/session.rs; without effect on a transaction that is not SERIALIZABLE READ
-- ONLY), which no statement in it can undo (not RESET ALL, not SET TRANSACTION after its
-- first query) and any COMMIT or ROLLBACK ends, the effect's own included: the next
-- transaction takes default_transaction_deferrable, off unless an operator set it. Asked only
-- when the effect failed or its completion changed nothing. In a transaction an error aborted
-- it fails (SQLSTATE 25P02): that transaction is still open.
SELECT current_setting('transaction_deferrable') = 'on' AS open
