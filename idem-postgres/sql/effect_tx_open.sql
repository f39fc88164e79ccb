-- Whether the transaction the store began for an effect is still open: its BEGIN made it
-- DEFERRABLE (src/session.rs; without effect on a transaction that is not SERIALIZABLE READ
-- ONLY), which RESET ALL leaves and any COMMIT or ROLLBACK ends, the effect's own included:
-- the next transaction takes default_transaction_deferrable, off unless a session or an
-- operator set it. Asked only when the effect failed or its completion changed nothing. In a
-- transaction an error aborted it fails (SQLSTATE 25P02), taken for the store's.
SELECT current_setting('transaction_deferrable') = 'on' AS open
