-- Whether the index named $1 (schema-qualified, quoted) exists, and is valid: no row when it
-- does not exist, false when a concurrent build was interrupted.
SELECT i.indisvalid FROM pg_index i WHERE i.indexrelid = to_regclass($1)
