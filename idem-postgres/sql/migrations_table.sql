-- Which idem migrations have been applied, per idem table (schema-qualified name).
CREATE TABLE IF NOT EXISTS idem_schema_migrations (
    table_name text        NOT NULL,
    version    bigint      NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (table_name, version)
)
