//! The receiver's settings: command-line flags first, then environment variables, then
//! defaults. The signing secrets come from the environment only (`WEBHOOK_SECRET`): a flag
//! would show them to anyone who can list the processes.

use idem::inbox::SignatureScheme;
use serving::{Flag, Flags, Limits};
use std::fmt;
use std::net::SocketAddr;
use std::time::Duration;

/// What the receiver runs with.
#[derive(Clone)]
pub struct Settings {
    /// Where it listens (`--addr`, `IDEM_ADDR`; default 127.0.0.1:8081).
    pub addr: SocketAddr,
    /// The SQLite file (`--database`, `DATABASE_URL`; default `webhooks.db`): the inbox's
    /// records, its audit trail, the shop's orders, products and invoices.
    pub database: String,
    /// How long audit entries are kept (`--audit-retention-days`,
    /// `IDEM_AUDIT_RETENTION_DAYS`; default 30).
    pub audit_retention: Duration,
    /// The inbox's lease (`--lease-ms`, `IDEM_LEASE_MS`; default 30 s): how long a delivery
    /// whose process died mid-handler blocks its event before a redelivery may run it.
    pub lease: Duration,
    /// The endpoint's signing secrets (`WEBHOOK_SECRET`, comma-separated during a rotation).
    pub scheme: SignatureScheme,
    /// How many secrets `WEBHOOK_SECRET` holds (logged; never the secrets).
    pub secrets: usize,
    /// What a connection and a request may cost (`--header-timeout-ms`,
    /// `--body-timeout-ms`, `--max-connections`, `--max-buffered-body-bytes`).
    pub limits: Limits,
    /// Test hooks (`IDEM_TEST_HOOKS=1` only).
    pub test_hooks: bool,
}

impl fmt::Debug for Settings {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Settings")
            .field("addr", &self.addr)
            .field("database", &self.database)
            .field("audit_retention", &self.audit_retention)
            .field("lease", &self.lease)
            .field("secrets", &self.secrets)
            .field("limits", &self.limits)
            .field("test_hooks", &self.test_hooks)
            .finish_non_exhaustive()
    }
}

/// The receiver's own flags (the limits' are [`Limits::FLAGS`]).
const FLAGS: &[Flag] = &[
    Flag {
        name: "--addr",
        env: "IDEM_ADDR",
    },
    Flag {
        name: "--database",
        env: "DATABASE_URL",
    },
    Flag {
        name: "--audit-retention-days",
        env: "IDEM_AUDIT_RETENTION_DAYS",
    },
    Flag {
        name: "--lease-ms",
        env: "IDEM_LEASE_MS",
    },
];

/// The help text.
fn usage() -> String {
    format!(
        "usage: WEBHOOK_SECRET=whsec_... webhook-receiver [--addr ADDR] [--database PATH] [--audit-retention-days N] [--lease-ms N]
                          {}
  WEBHOOK_SECRET          the endpoint's signing secret (required), or several separated by commas
                          during a rotation (`whsec_new,whsec_old`); environment only, never a flag
  --addr                  where to listen (env IDEM_ADDR; default 127.0.0.1:8081)
  --database              the SQLite file (env DATABASE_URL; default webhooks.db)
  --audit-retention-days  how long the audit trail is kept (env IDEM_AUDIT_RETENTION_DAYS; default 30)
  --lease-ms              the inbox's lease in milliseconds (env IDEM_LEASE_MS; default 30000)
{}
  IDEM_TEST_HOOKS=1 enables the test hooks (GET /test/invoices/count, GET /test/audit,
  X-Test-Crash-After-Commit); never in production",
        Limits::SYNOPSIS,
        Limits::usage("sender", 24)
    )
}

impl Settings {
    /// From `args` (without the program name) and the process environment.
    pub fn from_args(args: impl IntoIterator<Item = String>) -> Result<Self, String> {
        Self::from_args_and_env(args, |name| std::env::var(name).ok())
    }

    /// From `args` and the variables `env` gives (tests pass their own).
    pub fn from_args_and_env(
        args: impl IntoIterator<Item = String>,
        env: impl Fn(&str) -> Option<String>,
    ) -> Result<Self, String> {
        let env = |name: &str| env(name).filter(|v| !v.trim().is_empty());
        let flags =
            Flags::read(args, &[FLAGS, Limits::FLAGS], env).map_err(|e| e.with_usage(&usage()))?;

        let addr = flags.get("--addr").unwrap_or("127.0.0.1:8081");
        let addr = addr
            .parse()
            .map_err(|e| format!("--addr {addr}: {e}\n{}", usage()))?;

        let database = flags.get("--database").unwrap_or("webhooks.db");
        if database.starts_with("postgres://") || database.starts_with("postgresql://") {
            return Err(format!(
                "--database: this example runs on SQLite only; give a file path, not a PostgreSQL URL\n{}", usage()
            ));
        }
        let database = database
            .strip_prefix("sqlite://")
            .unwrap_or(database)
            .to_owned();

        let days: u64 = match flags.get("--audit-retention-days") {
            Some(days) => days
                .trim()
                .parse()
                .ok()
                .filter(|d| (1..=3650).contains(d))
                .ok_or_else(|| {
                    format!(
                        "--audit-retention-days {days}: a number of days, 1 to 3650\n{}",
                        usage()
                    )
                })?,
            None => 30,
        };

        let lease_ms: u64 = match flags.get("--lease-ms") {
            Some(ms) => ms
                .trim()
                .parse()
                .ok()
                .filter(|ms| (1..=86_400_000).contains(ms))
                .ok_or_else(|| {
                    format!("--lease-ms {ms}: milliseconds, 1 to 86400000\n{}", usage())
                })?,
            None => 30_000,
        };

        let limits = Limits::from_flags(&flags).map_err(|e| format!("{e}\n{}", usage()))?;

        let Some(secrets) = env("WEBHOOK_SECRET") else {
            return Err(format!(
                "WEBHOOK_SECRET is not set: the receiver refuses to start without the endpoint's \
                 signing secret, since it could not tell Stripe's deliveries from forged ones. \
                 Set it to the secret Stripe shows for the endpoint (Dashboard > Developers > \
                 Webhooks, or the `whsec_...` that `stripe listen` prints); during a rotation, \
                 both secrets separated by a comma.\n{}",
                usage()
            ));
        };
        let count = secrets.split(',').filter(|s| !s.trim().is_empty()).count();
        let scheme = SignatureScheme::from_comma_separated(&secrets)
            .map_err(|e| format!("WEBHOOK_SECRET: {e}\n{}", usage()))?;

        Ok(Self {
            addr,
            database,
            audit_retention: Duration::from_secs(days * 24 * 3600),
            lease: Duration::from_millis(lease_ms),
            scheme,
            secrets: count,
            limits,
            test_hooks: env("IDEM_TEST_HOOKS").as_deref() == Some("1"),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn parse(args: &[&str], env: &[(&str, &str)]) -> Result<Settings, String> {
        let env: HashMap<String, String> = env
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        Settings::from_args_and_env(args.iter().map(|s| (*s).to_owned()), |name| {
            env.get(name).cloned()
        })
    }

    #[test]
    fn defaults_flags_and_env() {
        let s = parse(&[], &[("WEBHOOK_SECRET", "whsec_a")]).expect("settings");
        assert_eq!(s.addr.to_string(), "127.0.0.1:8081");
        assert_eq!(s.database, "webhooks.db");
        assert_eq!(s.audit_retention, Duration::from_secs(30 * 24 * 3600));
        assert_eq!(s.lease, Duration::from_secs(30));
        assert_eq!(s.secrets, 1);
        assert!(!s.test_hooks);
        assert_eq!(s.limits, Limits::default());
        assert_eq!(s.limits.header_timeout, Duration::from_secs(10));
        assert_eq!(s.limits.body_timeout, Duration::from_secs(30));

        let s = parse(
            &[
                "--addr=127.0.0.1:0",
                "--database",
                "sqlite://w.db",
                "--audit-retention-days",
                "7",
                "--body-timeout-ms=700",
                "--max-connections",
                "8",
            ],
            &[
                ("WEBHOOK_SECRET", "whsec_old, whsec_new"),
                ("IDEM_ADDR", "0.0.0.0:1"),
                ("IDEM_TEST_HOOKS", "1"),
                ("IDEM_LEASE_MS", "2000"),
                ("IDEM_HEADER_TIMEOUT_MS", "500"),
                ("IDEM_BODY_TIMEOUT_MS", "9"),
                ("IDEM_MAX_BUFFERED_BODY_BYTES", "4096"),
            ],
        )
        .expect("settings");
        assert_eq!(s.addr.port(), 0, "a flag beats the environment");
        assert_eq!(s.database, "w.db");
        assert_eq!(s.audit_retention, Duration::from_secs(7 * 24 * 3600));
        assert_eq!(s.lease, Duration::from_secs(2));
        assert_eq!(s.secrets, 2);
        assert!(s.test_hooks);
        assert_eq!(s.limits.header_timeout, Duration::from_millis(500));
        assert_eq!(s.limits.body_timeout, Duration::from_millis(700));
        assert_eq!(s.limits.max_connections, 8);
        assert_eq!(s.limits.max_buffered_body_bytes, 4096);
        assert!(
            !format!("{s:?}").contains("whsec"),
            "Debug never shows a secret"
        );
    }

    #[test]
    fn refuses_without_a_secret_or_with_bad_values() {
        let err = parse(&[], &[]).expect_err("no secret");
        assert!(err.contains("WEBHOOK_SECRET is not set"), "{err}");
        assert!(parse(&[], &[("WEBHOOK_SECRET", " , ")]).is_err());
        let ok = [("WEBHOOK_SECRET", "whsec_a")];
        assert!(parse(&["--nope"], &ok).is_err());
        assert!(parse(&["--addr"], &ok).is_err());
        assert!(parse(&["--audit-retention-days", "0"], &ok).is_err());
        assert!(parse(&["--lease-ms", "x"], &ok).is_err());
        assert!(parse(&["--body-timeout-ms", "0"], &ok).is_err());
        assert!(parse(&["--max-connections", "-1"], &ok).is_err());
        assert!(parse(&["--database", "postgres://u@h/db"], &ok).is_err());
    }
}
