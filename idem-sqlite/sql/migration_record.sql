INSERT INTO idem_schema_migrations (table_name, version, applied_at) VALUES (?1, ?2, ?3)
