//! The server's settings: command-line flags first, then environment variables, then defaults.

use serving::Limits;
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
    /// What a connection and a request may cost (`--header-timeout-ms`,
    /// `--body-timeout-ms`, `--max-connections`, `--max-buffered-body-bytes`).
    pub limits: Limits,
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
                       [--header-timeout-ms N] [--body-timeout-ms N] [--max-connections N]
                       [--max-buffered-body-bytes N]
  --addr                     where to listen (env IDEM_ADDR; default 127.0.0.1:8080)
  --database                 a SQLite file (default payments.db) or a postgres:// URL (env DATABASE_URL)
  --lease-ms                 the idempotency lease in milliseconds (env IDEM_LEASE_MS; default 60000)
  --header-timeout-ms        how long a client may take to send a request's head, and how long an
                             idle connection stays open (env IDEM_HEADER_TIMEOUT_MS; default 10000)
  --body-timeout-ms          how long a client may take to send a request's body; past it: 408
                             (env IDEM_BODY_TIMEOUT_MS; default 30000)
  --max-connections          connections open at once; more wait to be accepted
                             (env IDEM_MAX_CONNECTIONS; default 1024)
  --max-buffered-body-bytes  request-body bytes held at once, all requests together
                             (env IDEM_MAX_BUFFERED_BODY_BYTES; default 16777216)
  IDEM_TEST_HOOKS=1 enables the test hooks (X-Test-Delay-Ms, GET /test/charges/count)";

/// Parses `value` of `flag` as a whole number within `range`.
fn number(
    flag: &str,
    value: Option<&str>,
    default: u64,
    range: std::ops::RangeInclusive<u64>,
) -> Result<u64, String> {
    let Some(text) = value else {
        return Ok(default);
    };
    text.trim()
        .parse::<u64>()
        .ok()
        .filter(|n| range.contains(n))
        .ok_or_else(|| {
            format!(
                "{flag} {text}: a whole number from {} to {}\n{USAGE}",
                range.start(),
                range.end()
            )
        })
}

impl Settings {
    /// From `args` (without the program name) and the environment.
    pub fn from_args(args: impl IntoIterator<Item = String>) -> Result<Self, String> {
        Self::from_args_and_env(args, |name| std::env::var(name).ok())
    }

    /// From `args` and the variables `env` gives (tests pass their own).
    pub fn from_args_and_env(
        args: impl IntoIterator<Item = String>,
        env: impl Fn(&str) -> Option<String>,
    ) -> Result<Self, String> {
        let env = |name: &str| env(name).filter(|v| !v.is_empty());
        let mut addr = env("IDEM_ADDR");
        let mut database = env("DATABASE_URL");
        let mut lease = env("IDEM_LEASE_MS");
        let mut header_timeout = env("IDEM_HEADER_TIMEOUT_MS");
        let mut body_timeout = env("IDEM_BODY_TIMEOUT_MS");
        let mut max_connections = env("IDEM_MAX_CONNECTIONS");
        let mut max_buffered = env("IDEM_MAX_BUFFERED_BODY_BYTES");
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
                "--header-timeout-ms" => &mut header_timeout,
                "--body-timeout-ms" => &mut body_timeout,
                "--max-connections" => &mut max_connections,
                "--max-buffered-body-bytes" => &mut max_buffered,
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
        let defaults = Limits::default();
        let millis = |d: Duration| u64::try_from(d.as_millis()).unwrap_or(u64::MAX);
        let day_ms = 86_400_000;
        let limits = Limits {
            header_timeout: Duration::from_millis(number(
                "--header-timeout-ms",
                header_timeout.as_deref(),
                millis(defaults.header_timeout),
                1..=day_ms,
            )?),
            body_timeout: Duration::from_millis(number(
                "--body-timeout-ms",
                body_timeout.as_deref(),
                millis(defaults.body_timeout),
                1..=day_ms,
            )?),
            max_connections: usize::try_from(number(
                "--max-connections",
                max_connections.as_deref(),
                defaults.max_connections as u64,
                1..=1_000_000,
            )?)
            .unwrap_or(usize::MAX),
            max_buffered_body_bytes: usize::try_from(number(
                "--max-buffered-body-bytes",
                max_buffered.as_deref(),
                defaults.max_buffered_body_bytes as u64,
                1..=1 << 40,
            )?)
            .unwrap_or(usize::MAX),
        };
        Ok(Self {
            addr,
            database: Database::parse(database.as_deref().unwrap_or("payments.db")),
            lease: Duration::from_millis(lease_ms),
            limits,
            test_hooks: env("IDEM_TEST_HOOKS").as_deref() == Some("1"),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str], env: &[(&str, &str)]) -> Result<Settings, String> {
        let env: Vec<(String, String)> = env
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        Settings::from_args_and_env(args.iter().map(|s| (*s).to_owned()), |name| {
            env.iter().find(|(k, _)| k == name).map(|(_, v)| v.clone())
        })
    }

    #[test]
    fn flags_take_values_inline_or_after() {
        let s = parse(
            &[
                "--addr=127.0.0.1:0",
                "--database",
                "postgres://u@h/db",
                "--lease-ms",
                "2000",
            ],
            &[],
        )
        .expect("settings");
        assert_eq!(s.addr.port(), 0);
        assert_eq!(s.database, Database::Postgres("postgres://u@h/db".into()));
        assert_eq!(s.lease, Duration::from_secs(2));
        assert_eq!(
            Database::parse("sqlite://charges.db"),
            Database::Sqlite("charges.db".into())
        );
        assert!(parse(&["--nope"], &[]).is_err());
        assert!(parse(&["--addr"], &[]).is_err());
    }

    #[test]
    fn limits_have_defaults_flags_and_env() {
        let s = parse(&[], &[]).expect("settings");
        assert_eq!(s.limits, Limits::default());
        assert_eq!(s.limits.header_timeout, Duration::from_secs(10));
        assert_eq!(s.limits.body_timeout, Duration::from_secs(30));
        let s = parse(
            &["--header-timeout-ms", "500", "--max-connections=8"],
            &[
                ("IDEM_HEADER_TIMEOUT_MS", "9"),
                ("IDEM_BODY_TIMEOUT_MS", "700"),
                ("IDEM_MAX_BUFFERED_BODY_BYTES", "4096"),
            ],
        )
        .expect("settings");
        assert_eq!(s.limits.header_timeout, Duration::from_millis(500));
        assert_eq!(s.limits.body_timeout, Duration::from_millis(700));
        assert_eq!(s.limits.max_connections, 8);
        assert_eq!(s.limits.max_buffered_body_bytes, 4096);
        for bad in [
            ["--body-timeout-ms", "0"],
            ["--max-connections", "x"],
            ["--header-timeout-ms", "-1"],
        ] {
            assert!(parse(&bad, &[]).is_err(), "{bad:?}");
        }
    }
}
