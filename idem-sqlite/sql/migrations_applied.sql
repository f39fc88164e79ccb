SELECT COALESCE(MAX(version), 0) FROM idem_schema_migrations WHERE table_name = ?1
