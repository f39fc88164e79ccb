//! Where the records are: the URL and names the command line gave, and the store they open.

use idem_core::{Error, Field};
use idem_ops::Operator;
use idem_postgres::{PgStore, StatementMode};
use idem_redis::RedisStore;
use idem_sqlite::SqliteStore;
use std::path::PathBuf;

/// A store's location, from `--url`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Target {
    /// A SQLite file.
    Sqlite(PathBuf),
    /// A PostgreSQL server (the URL as given: it may hold a password, so it is never printed).
    Postgres(String),
    /// One Redis node.
    Redis(String),
    /// A Redis Cluster, by the URLs of some of its nodes.
    RedisCluster(Vec<String>),
}

/// The names of the store's table, schema or key prefix, where the command line set them.
#[derive(Debug, Clone, Default)]
pub(crate) struct Names {
    /// `--table`.
    pub table: Option<String>,
    /// `--schema`.
    pub schema: Option<String>,
    /// `--prefix`.
    pub prefix: Option<String>,
}

/// A mistake on the command line: exit status 2.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Usage(pub String);

impl Target {
    /// Reads `--url`: `sqlite://PATH` (relative) or `sqlite:///PATH` (absolute), `postgres://…`
    /// or `postgresql://…`, `redis://…` or `rediss://…`, and
    /// `redis+cluster://[user:password@]host:port,host:port,…` for a Redis Cluster (any of its
    /// nodes; the credentials apply to each).
    pub(crate) fn parse(url: &str) -> Result<Self, Usage> {
        let (scheme, rest) = url.split_once("://").unwrap_or(("", ""));
        match scheme.to_ascii_lowercase().as_str() {
            "sqlite" => {
                let path = rest;
                if path.is_empty() {
                    return Err(Usage("sqlite:// needs a path: sqlite://idem.db or sqlite:///var/lib/app/idem.db".into()));
                }
                // Read as a file name, `?mode=ro` would name another file, and `migrate` would
                // create an empty database there.
                if path.contains(['?', '#']) {
                    return Err(Usage(
                        "sqlite:// takes a path and no parameters (no `?` or `#`): sqlite://idem.db"
                            .into(),
                    ));
                }
                Ok(Target::Sqlite(PathBuf::from(path)))
            }
            "postgres" | "postgresql" => Ok(Target::Postgres(url.to_owned())),
            "redis" | "rediss" => Ok(Target::Redis(url.to_owned())),
            "redis+cluster" | "rediss+cluster" => {
                let scheme = scheme.trim_end_matches("+cluster");
                let (credentials, hosts) = match rest.rsplit_once('@') {
                    Some((credentials, hosts)) => (format!("{credentials}@"), hosts),
                    None => (String::new(), rest),
                };
                let nodes: Vec<String> = hosts
                    .split(',')
                    .filter(|host| !host.is_empty())
                    .map(|host| format!("{scheme}://{credentials}{host}"))
                    .collect();
                if nodes.is_empty() {
                    return Err(Usage("redis+cluster:// needs nodes: redis+cluster://host:port,host:port".into()));
                }
                Ok(Target::RedisCluster(nodes))
            }
            _ => Err(Usage(
                "--url must start with sqlite://, postgres://, postgresql://, redis://, rediss:// or redis+cluster://"
                    .into(),
            )),
        }
    }

    /// Refuses a name the target does not have (a `--schema` for SQLite...), or one its store
    /// would refuse.
    pub(crate) fn check(&self, names: &Names) -> Result<(), Usage> {
        self.fits(names)?;
        let invalid = |flag: &'static str| move |e: Error| Usage(format!("{flag}: {e}"));
        match self {
            Target::Sqlite(_) => names.table.as_deref().map_or(Ok(()), |t| {
                idem_sqlite::validate_table_name(t).map_err(invalid("--table"))
            }),
            Target::Postgres(_) => {
                if let Some(table) = names.table.as_deref() {
                    idem_postgres::validate_table_name(table).map_err(invalid("--table"))?;
                }
                names.schema.as_deref().map_or(Ok(()), |s| {
                    idem_postgres::validate_identifier(s).map_err(invalid("--schema"))
                })
            }
            Target::Redis(_) | Target::RedisCluster(_) => {
                names.prefix.as_deref().map_or(Ok(()), |p| {
                    idem_redis::validate_prefix(p).map_err(invalid("--prefix"))
                })
            }
        }
    }

    fn fits(&self, names: &Names) -> Result<(), Usage> {
        let refuse =
            |flag: &str, what: &str| Err(Usage(format!("{flag} does not apply to {what}")));
        match self {
            Target::Sqlite(_) if names.schema.is_some() => refuse("--schema", "SQLite"),
            Target::Sqlite(_) | Target::Postgres(_) if names.prefix.is_some() => {
                refuse("--prefix", "a SQL store")
            }
            Target::Redis(_) | Target::RedisCluster(_) if names.table.is_some() => {
                refuse("--table", "Redis")
            }
            Target::Redis(_) | Target::RedisCluster(_) if names.schema.is_some() => {
                refuse("--schema", "Redis")
            }
            _ => Ok(()),
        }
    }

    /// Opens the store without changing anything: a SQLite file must exist and its table be
    /// at the current schema version (an application's release owns its schema; `idem migrate`
    /// upgrades it on purpose).
    pub(crate) async fn open(&self, names: &Names) -> Result<Box<dyn Operator>, Error> {
        Ok(match self {
            Target::Sqlite(path) if !path.exists() => {
                return Err(Error::invalid(
                    Field::Config,
                    format!(
                        "no SQLite database at {} (`idem migrate` creates one)",
                        path.display()
                    ),
                ))
            }
            Target::Sqlite(path) => Box::new(
                with(SqliteStore::builder(path), &names.table, |b, t| b.table(t))
                    .readers(1)
                    .migrate(false)
                    .open()
                    .await?,
            ),
            Target::Postgres(url) => {
                let store = postgres(url, names).await?;
                check_postgres_version(&store, names).await?;
                Box::new(store)
            }
            // The command only reads (and a Redis store has nothing to purge): a server that
            // may evict records is worth inspecting, not refusing.
            Target::Redis(url) => Box::new(redis(names).connect(url).await?),
            Target::RedisCluster(nodes) => {
                let nodes: Vec<&str> = nodes.iter().map(String::as_str).collect();
                Box::new(redis(names).connect_cluster(&nodes).await?)
            }
        })
    }

    /// The SQLite store, for the outbox beside it (the file must exist).
    pub(crate) async fn open_sqlite(&self, names: &Names) -> Result<SqliteStore, Error> {
        match self {
            Target::Sqlite(path) if path.exists() => {
                with(SqliteStore::builder(path), &names.table, |b, t| b.table(t))
                    .readers(1)
                    .migrate(false)
                    .open()
                    .await
            }
            Target::Sqlite(path) => Err(Error::invalid(
                Field::Config,
                format!("no SQLite database at {}", path.display()),
            )),
            _ => Err(Error::invalid(Field::Config, "not a SQLite target")),
        }
    }

    /// The PostgreSQL store, for the outbox beside it.
    pub(crate) async fn open_postgres(&self, names: &Names) -> Result<PgStore, Error> {
        match self {
            Target::Postgres(url) => postgres(url, names).await,
            _ => Err(Error::invalid(Field::Config, "not a PostgreSQL target")),
        }
    }

    /// Applies the schema: creates a SQLite file if needed and brings the table up to date, or
    /// runs the PostgreSQL migrations. `None` for Redis, which has no schema.
    pub(crate) async fn migrate(&self, names: &Names) -> Result<Option<()>, Error> {
        match self {
            Target::Sqlite(path) => {
                with(SqliteStore::builder(path), &names.table, |b, t| b.table(t))
                    .readers(1)
                    .open()
                    .await?;
                Ok(Some(()))
            }
            Target::Postgres(url) => postgres(url, names).await?.migrate().await.map(Some),
            Target::Redis(_) | Target::RedisCluster(_) => Ok(None),
        }
    }

    /// The schema's SQL for the target's table, or `None` for Redis.
    pub(crate) fn schema_sql(&self, names: &Names) -> Result<Option<String>, Error> {
        let table = names.table.as_deref().unwrap_or("idem_records");
        match self {
            Target::Sqlite(_) => {
                idem_sqlite::validate_table_name(table)?;
                Ok(Some(idem_sqlite::schema_sql(table)))
            }
            Target::Postgres(_) => {
                let schema = names.schema.as_deref().unwrap_or("public");
                idem_postgres::schema_sql(schema, table).map(Some)
            }
            Target::Redis(_) | Target::RedisCluster(_) => Ok(None),
        }
    }
}

async fn postgres(url: &str, names: &Names) -> Result<PgStore, Error> {
    let builder = with(PgStore::builder(), &names.schema, |b, s| b.schema(s));
    // The simple protocol works on a direct connection and through a pooler in transaction
    // mode (PgBouncer) alike; a command's few statements gain nothing from preparing them.
    with(builder, &names.table, |b, t| b.table(t))
        .statements(StatementMode::Simple)
        .max_connections(1)
        .connect(url)
        .await
}

/// The table's schema version, read from its schema's migrations table (0 when none was ever
/// applied); a version other than this command's is an [`Error::SchemaVersion`], to which the
/// command adds the advice that helps (upgrade the command for a newer table, `idem migrate`
/// for an older one).
async fn check_postgres_version(store: &PgStore, names: &Names) -> Result<(), Error> {
    use idem_postgres::sqlx::{self, AssertSqlSafe, Row};
    let schema = names.schema.as_deref().unwrap_or("public");
    let table = names.table.as_deref().unwrap_or("idem_records");
    // Both names were checked as identifiers (`Target::check`): no quote can occur in them.
    let migrations = format!("\"{schema}\".idem_schema_migrations");
    let store_error =
        |e: sqlx::Error| Error::store("postgres", idem_core::StoreErrorKind::Unavailable, e);
    let exists = sqlx::raw_sql(AssertSqlSafe(format!(
        "SELECT to_regclass('{}') IS NOT NULL",
        migrations.replace('\'', "''")
    )))
    .fetch_one(store.pool())
    .await
    .map_err(store_error)?;
    let applied: i64 = if exists.try_get::<bool, _>(0).map_err(store_error)? {
        sqlx::raw_sql(AssertSqlSafe(format!(
            "SELECT COALESCE(MAX(version), 0)::bigint FROM {migrations} WHERE table_name = '{schema}.{table}'"
        )))
        .fetch_one(store.pool())
        .await
        .map_err(store_error)?
        .try_get(0)
        .map_err(store_error)?
    } else {
        0
    };
    let current = idem_postgres::SCHEMA_VERSION;
    if applied != current {
        return Err(Error::SchemaVersion {
            table: format!("{schema}.{table}"),
            found: applied,
            expected: current,
        });
    }
    Ok(())
}

fn redis(names: &Names) -> idem_redis::RedisStoreBuilder {
    with(RedisStore::builder(), &names.prefix, |b, p| b.prefix(p)).allow_eviction(true)
}

/// Applies `set` to `builder` when the command line gave a value.
fn with<B>(builder: B, value: &Option<String>, set: impl FnOnce(B, &str) -> B) -> B {
    match value {
        Some(value) => set(builder, value),
        None => builder,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_name_their_store() {
        assert_eq!(
            Target::parse("sqlite://idem.db"),
            Ok(Target::Sqlite("idem.db".into()))
        );
        assert_eq!(
            Target::parse("sqlite:///var/lib/app/idem.db"),
            Ok(Target::Sqlite("/var/lib/app/idem.db".into()))
        );
        assert!(matches!(
            Target::parse("postgresql://u:secret@db/app"),
            Ok(Target::Postgres(_))
        ));
        assert!(matches!(
            Target::parse("redis://127.0.0.1:6379"),
            Ok(Target::Redis(_))
        ));
        for bad in [
            "sqlite://",
            "sqlite:///var/lib/app/idem.db?mode=ro",
            "sqlite://idem.db#x",
            "mysql://db",
            "idem.db",
            "",
        ] {
            assert!(Target::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn names_must_fit_the_store() {
        let names = |table: Option<&str>, schema: Option<&str>, prefix: Option<&str>| Names {
            table: table.map(Into::into),
            schema: schema.map(Into::into),
            prefix: prefix.map(Into::into),
        };
        let sqlite = Target::Sqlite("x.db".into());
        let redis = Target::Redis("redis://h".into());
        let pg = Target::Postgres("postgres://h".into());
        assert!(sqlite.check(&names(Some("t"), None, None)).is_ok());
        assert!(sqlite.check(&names(None, Some("s"), None)).is_err());
        assert!(pg.check(&names(Some("t"), Some("s"), None)).is_ok());
        assert!(pg.check(&names(None, None, Some("p"))).is_err());
        assert!(redis.check(&names(None, None, Some("p"))).is_ok());
        assert!(redis.check(&names(Some("t"), None, None)).is_err());
        assert!(sqlite.check(&names(Some("bad name"), None, None)).is_err());
        assert!(pg.check(&names(Some(&"t".repeat(52)), None, None)).is_err());
        assert!(pg.check(&names(None, Some("Bad"), None)).is_err());
        assert!(redis.check(&names(None, None, Some(""))).is_err());
    }
}
