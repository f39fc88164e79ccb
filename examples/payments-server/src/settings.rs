//! The server's settings: command-line flags first, then environment variables, then defaults.

use serving::{Flag, Flags, Limits};
use std::net::SocketAddr;
use std::time::Duration;

/// What the server runs with.
#[derive(Debug, Clone)]
pub(crate) struct Settings {
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
    /// How often the reconciler asks the card network about the charges in doubt
    /// (`--reconcile-every`, `IDEM_RECONCILE_EVERY`, in seconds; default 30); `None` (0) runs
    /// no reconciler.
    pub reconcile_every: Option<Duration>,
    /// Where each succeeded charge's `charge.succeeded` event is delivered through the
    /// outbox (`--webhook-url`, `IDEM_WEBHOOK_URL`), signed with `--webhook-secret`
    /// (`IDEM_WEBHOOK_SECRET`, `whsec_...`; several, comma separated, during a rotation); both
    /// or neither.
    pub webhook: Option<Webhook>,
    /// Test hooks (`IDEM_TEST_HOOKS=1` only).
    pub test_hooks: bool,
}

/// The merchant's webhook endpoint.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Webhook {
    /// Its absolute http(s) URL.
    pub url: String,
    /// Its `whsec_` secrets, the first signing first.
    pub secrets: Vec<String>,
    /// How long a dispatcher's claim on a delivery lasts: the server's lease (`--lease-ms`),
    /// after which a delivery whose server died is attempted again.
    pub lease: Duration,
    /// For tests only: the delays between attempts instead of the outbox's default schedule
    /// (`--test-webhook-schedule-ms`, `IDEM_TEST_WEBHOOK_SCHEDULE_MS`, milliseconds, comma
    /// separated, unjittered; refused without `IDEM_TEST_HOOKS=1`).
    pub test_schedule: Option<Vec<Duration>>,
}

/// Where charges and idempotency records live.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Database {
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
    pub(crate) fn describe(&self) -> String {
        match self {
            Database::Sqlite(path) => format!("SQLite file {path}"),
            Database::Postgres(url) => {
                let host = url.rsplit('@').next().unwrap_or("?");
                format!("PostgreSQL at {host}")
            }
        }
    }
}

/// The server's own flags (the limits' are [`Limits::FLAGS`]).
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
        name: "--lease-ms",
        env: "IDEM_LEASE_MS",
    },
    Flag {
        name: "--reconcile-every",
        env: "IDEM_RECONCILE_EVERY",
    },
    Flag {
        name: "--webhook-url",
        env: "IDEM_WEBHOOK_URL",
    },
    Flag {
        name: "--webhook-secret",
        env: "IDEM_WEBHOOK_SECRET",
    },
    Flag {
        name: "--test-webhook-schedule-ms",
        env: "IDEM_TEST_WEBHOOK_SCHEDULE_MS",
    },
];

/// The reconciler's default period, in seconds.
const RECONCILE_EVERY_S: u64 = 30;

/// The help text.
fn usage() -> String {
    format!(
        "usage: payments-server [--addr ADDR] [--database PATH|URL] [--lease-ms N] [--reconcile-every S]
                       [--webhook-url URL --webhook-secret whsec_...] {}
  --addr                     where to listen (env IDEM_ADDR; default 127.0.0.1:8080)
  --database                 a SQLite file (default payments.db) or a postgres:// URL (env DATABASE_URL)
  --lease-ms                 the idempotency lease in milliseconds, also the claim on a webhook's
                             delivery (env IDEM_LEASE_MS; default 60000)
  --reconcile-every          how often, in seconds, to ask the card network about the charges in
                             doubt and settle them (env IDEM_RECONCILE_EVERY; default {RECONCILE_EVERY_S};
                             0: never)
  --webhook-url              where each succeeded charge's charge.succeeded event is delivered, through
                             the outbox, at least once (env IDEM_WEBHOOK_URL; default: none)
  --webhook-secret           its Standard Webhooks secret(s), whsec_..., comma separated during a
                             rotation (env IDEM_WEBHOOK_SECRET; required with --webhook-url)
  --test-webhook-schedule-ms FOR TESTS ONLY (needs IDEM_TEST_HOOKS=1): the delays between a
                             webhook's attempts in milliseconds, comma separated, unjittered,
                             instead of the default schedule (5 s, 5 min, 30 min, 2 h, 5 h, 10 h,
                             10 h), e.g. 200,200,200 (env IDEM_TEST_WEBHOOK_SCHEDULE_MS)
{}
  IDEM_TEST_HOOKS=1 enables the test hooks (X-Test-Delay-Ms, X-Test-Network:
  timeout-after-charging|timeout-before-charging, GET /test/charges/count,
  GET /test/network/authorizations/count, POST /test/reconcile)",
        Limits::SYNOPSIS,
        Limits::usage("client", 27)
    )
}

impl Settings {
    /// From `args` (without the program name) and the environment.
    pub(crate) fn from_args(args: impl IntoIterator<Item = String>) -> Result<Self, String> {
        Self::from_args_and_env(args, |name| std::env::var(name).ok())
    }

    /// From `args` and the variables `env` gives (tests pass their own).
    pub(crate) fn from_args_and_env(
        args: impl IntoIterator<Item = String>,
        env: impl Fn(&str) -> Option<String>,
    ) -> Result<Self, String> {
        let env = |name: &str| env(name).filter(|v| !v.is_empty());
        let flags =
            Flags::read(args, &[FLAGS, Limits::FLAGS], env).map_err(|e| e.with_usage(&usage()))?;
        let addr = flags.get("--addr").unwrap_or("127.0.0.1:8080");
        let addr = addr
            .parse()
            .map_err(|e| format!("--addr {addr}: {e}\n{}", usage()))?;
        let lease_ms: u64 = match flags.get("--lease-ms") {
            Some(ms) => ms
                .parse()
                .map_err(|e| format!("--lease-ms {ms}: {e}\n{}", usage()))?,
            None => 60_000,
        };
        let reconcile_s: u64 = match flags.get("--reconcile-every") {
            Some(s) => s
                .parse()
                .map_err(|e| format!("--reconcile-every {s}: {e}\n{}", usage()))?,
            None => RECONCILE_EVERY_S,
        };
        let limits = Limits::from_flags(&flags).map_err(|e| format!("{e}\n{}", usage()))?;
        let test_hooks = env("IDEM_TEST_HOOKS").as_deref() == Some("1");
        let test_schedule = match flags.get("--test-webhook-schedule-ms") {
            None => None,
            Some(_) if !test_hooks => {
                return Err(format!(
                    "--test-webhook-schedule-ms is for tests only: it needs IDEM_TEST_HOOKS=1\n{}",
                    usage()
                ))
            }
            Some(list) => Some(
                list.split(',')
                    .map(|ms| ms.trim().parse::<u64>().map(Duration::from_millis))
                    .collect::<Result<Vec<_>, _>>()
                    .map_err(|e| format!("--test-webhook-schedule-ms {list}: {e}\n{}", usage()))?,
            ),
        };
        let webhook = match (flags.get("--webhook-url"), flags.get("--webhook-secret")) {
            (None, None) => None,
            (Some(url), Some(secrets)) => Some(Webhook {
                url: url.to_owned(),
                secrets: secrets
                    .split(',')
                    .map(str::trim)
                    .filter(|s| !s.is_empty())
                    .map(str::to_owned)
                    .collect(),
                lease: Duration::from_millis(lease_ms),
                test_schedule,
            }),
            _ => {
                return Err(format!(
                    "--webhook-url and --webhook-secret go together\n{}",
                    usage()
                ))
            }
        };
        Ok(Self {
            addr,
            database: Database::parse(flags.get("--database").unwrap_or("payments.db")),
            lease: Duration::from_millis(lease_ms),
            limits,
            reconcile_every: (reconcile_s > 0).then(|| Duration::from_secs(reconcile_s)),
            webhook,
            test_hooks,
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
        assert_eq!(s.reconcile_every, Some(Duration::from_secs(30)));
        assert!(parse(&["--addr"], &[]).is_err());
    }

    #[test]
    fn the_reconciler_period_is_seconds_and_zero_turns_it_off() {
        let every =
            |args: &[&str], env: &[(&str, &str)]| parse(args, env).map(|s| s.reconcile_every);
        assert_eq!(
            every(&["--reconcile-every", "5"], &[]),
            Ok(Some(Duration::from_secs(5)))
        );
        assert_eq!(
            every(&[], &[("IDEM_RECONCILE_EVERY", "7")]),
            Ok(Some(Duration::from_secs(7)))
        );
        assert_eq!(every(&["--reconcile-every=0"], &[]), Ok(None));
        let err = every(&["--reconcile-every", "soon"], &[]).expect_err("not seconds");
        assert!(err.contains("--reconcile-every soon"), "{err}");
    }

    #[test]
    fn webhook_flags_or_env_go_together() -> Result<(), String> {
        assert_eq!(parse(&[], &[])?.webhook, None);
        let both = parse(
            &["--webhook-url", "http://127.0.0.1:8081/webhooks/standard"],
            &[("IDEM_WEBHOOK_SECRET", "whsec_a, whsec_b")],
        )?;
        assert_eq!(
            both.webhook,
            Some(Webhook {
                url: "http://127.0.0.1:8081/webhooks/standard".into(),
                secrets: vec!["whsec_a".into(), "whsec_b".into()],
                lease: Duration::from_secs(60),
                test_schedule: None,
            })
        );
        assert!(parse(&["--webhook-url", "http://x/"], &[]).is_err());
        assert!(parse(&[], &[("IDEM_WEBHOOK_SECRET", "whsec_a")]).is_err());
        Ok(())
    }

    #[test]
    fn a_test_schedule_needs_the_test_hooks() -> Result<(), String> {
        let webhook = [
            "--webhook-url",
            "http://127.0.0.1:8081/webhooks/standard",
            "--webhook-secret",
            "whsec_a",
        ];
        let with = |extra: &[&str], env: &[(&str, &str)]| {
            let args: Vec<&str> = webhook.iter().chain(extra).copied().collect();
            parse(&args, env)
        };
        let hooks = [("IDEM_TEST_HOOKS", "1")];
        let short = with(&["--test-webhook-schedule-ms", "200, 300"], &hooks)?;
        assert_eq!(
            short.webhook.and_then(|w| w.test_schedule),
            Some(vec![Duration::from_millis(200), Duration::from_millis(300)])
        );
        let err = with(&["--test-webhook-schedule-ms", "200"], &[]).expect_err("tests only");
        assert!(err.contains("IDEM_TEST_HOOKS=1"), "{err}");
        assert!(with(&["--test-webhook-schedule-ms", "soon"], &hooks).is_err());
        assert!(
            with(&[], &[("IDEM_TEST_WEBHOOK_SCHEDULE_MS", "100"), hooks[0]])?
                .webhook
                .and_then(|w| w.test_schedule)
                .is_some()
        );
        Ok(())
    }

    #[test]
    fn limits_have_defaults_flags_and_env() {
        assert_eq!(parse(&[], &[]).expect("settings").limits, Limits::default());
        let s =
            parse(&["--max-connections=8"], &[("IDEM_BODY_TIMEOUT_MS", "700")]).expect("settings");
        assert_eq!(s.limits.max_connections, 8);
        assert_eq!(s.limits.body_timeout, Duration::from_millis(700));
        let err = parse(&["--header-timeout-ms", "-1"], &[]).expect_err("a bad limit");
        assert!(
            err.contains("--header-timeout-ms -1") && err.contains("usage:"),
            "{err}"
        );
        let help = parse(&["--help"], &[]).expect_err("help");
        assert!(
            help.starts_with("usage: payments-server")
                && help.contains("--max-buffered-body-bytes  request-body"),
            "{help}"
        );
    }
}
