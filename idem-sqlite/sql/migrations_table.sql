-- Which migrations have been applied, per idem table.
CREATE TABLE IF NOT EXISTS idem_schema_migrations (
    table_name TEXT    NOT NULL,
    version    INTEGER NOT NULL,
    applied_at INTEGER NOT NULL,
    PRIMARY KEY (table_name, version)
);
