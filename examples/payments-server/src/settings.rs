//! The server's settings: command-line flags first, then environment variables, then defaults.

use std::net::SocketAddr;
use std::time::Duration;

/// What the server runs with.
#[derive(Debug, Clone)]
pub struct Settings {
    /// Where it listens (`--addr`, `IDEM_ADDR`; default 127.0.0.1:8080).
    pub addr: SocketAddr,
    /// The database (`--database`, `DATABASE_URL`): a SQLite file (default `payments.db`) or a
    /// `postgres://` URL.
    pub database: Database,
    /// The idempotency lease (`--lease-ms`, `IDEM_LEASE_MS`; default 60 s).
    pub lease: Duration,
    /// Test hooks (`IDEM_TEST_HOOKS=1` only).
    pub test_hooks: bool,
}

/// Where charges and idempotency records live.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Database {
    /// An embedded SQLite file.
    Sqlite(String),
    /// A PostgreSQL server.
    Postgres(String),
}

impl Database {
    fn parse(text: &str) -> Self {
        if text.starts_with("postgres://") || text.starts_with("postgresql://") {
            Database::Postgres(text.to_owned())
        } else {
            let path = text.strip_prefix("sqlite://").unwrap_or(text);
            Database::Sqlite(path.to_owned())
        }
    }

    /// Says which database, without a password.
    pub fn describe(&self) -> String {
        match self {
            Database::Sqlite(path) => format!("SQLite file {path}"),
            Database::Postgres(url) => {
                let host = url.rsplit('@').next().unwrap_or("?");
                format!("PostgreSQL at {host}")
            }
        }
    }
}

const USAGE: &str = "usage: payments-server [--addr ADDR] [--database PATH|URL] [--lease-ms N]
  --addr       where to listen (env IDEM_ADDR; default 127.0.0.1:8080)
  --database   a SQLite file (default payments.db) or a postgres:// URL (env DATABASE_URL)
  --lease-ms   the idempotency lease in milliseconds (env IDEM_LEASE_MS; default 60000)
  IDEM_TEST_HOOKS=1 enables the test hooks (X-Test-Delay-Ms, GET /test/charges/count)";

impl Settings {
    /// From `args` (without the program name) and the environment.
    pub fn from_args(args: impl IntoIterator<Item = String>) -> Result<Self, String> {
        let env = |name: &str| std::env::var(name).ok().filter(|v| !v.is_empty());
        let mut addr = env("IDEM_ADDR");
        let mut database = env("DATABASE_URL");
        let mut lease = env("IDEM_LEASE_MS");
        let mut args = args.into_iter();
        while let Some(flag) = args.next() {
            let (name, inline) = match flag.split_once('=') {
                Some((name, value)) => (name.to_owned(), Some(value.to_owned())),
                None => (flag.clone(), None),
            };
            let slot = match name.as_str() {
                "--addr" => &mut addr,
                "--database" => &mut database,
                "--lease-ms" => &mut lease,
                "-h" | "--help" => return Err(USAGE.to_owned()),
                other => return Err(format!("unknown argument {other}\n{USAGE}")),
            };
            let value = inline.or_else(|| args.next());
            *slot = Some(value.ok_or_else(|| format!("{name} needs a value\n{USAGE}"))?);
        }
        let addr = addr.as_deref().unwrap_or("127.0.0.1:8080");
        let addr = addr
            .parse()
            .map_err(|e| format!("--addr {addr}: {e}\n{USAGE}"))?;
        let lease_ms: u64 = match lease {
            Some(ms) => ms
                .parse()
                .map_err(|e| format!("--lease-ms {ms}: {e}\n{USAGE}"))?,
            None => 60_000,
        };
        Ok(Self {
            addr,
            database: Database::parse(database.as_deref().unwrap_or("payments.db")),
            lease: Duration::from_millis(lease_ms),
            test_hooks: env("IDEM_TEST_HOOKS").as_deref() == Some("1"),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags_take_values_inline_or_after() {
        let s = Settings::from_args(
            [
                "--addr=127.0.0.1:0",
                "--database",
                "postgres://u@h/db",
                "--lease-ms",
                "2000",
            ]
            .map(String::from),
        )
        .expect("settings");
        assert_eq!(s.addr.port(), 0);
        assert_eq!(s.database, Database::Postgres("postgres://u@h/db".into()));
        assert_eq!(s.lease, Duration::from_secs(2));
        assert_eq!(
            Database::parse("sqlite://charges.db"),
            Database::Sqlite("charges.db".into())
        );
        assert!(Settings::from_args(["--nope".to_owned()]).is_err());
        assert!(Settings::from_args(["--addr".to_owned()]).is_err());
    }
}
