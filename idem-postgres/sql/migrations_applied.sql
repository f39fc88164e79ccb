SELECT COALESCE(MAX(version), 0)::bigint FROM idem_schema_migrations WHERE table_name = $1
