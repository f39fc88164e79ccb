INSERT INTO idem_schema_migrations (table_name, version) VALUES ($1, $2)
