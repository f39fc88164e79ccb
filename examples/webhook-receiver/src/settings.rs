//! The receiver's settings: command-line flags first, then environment variables, then
//! defaults. The signing secrets come from the environment only, one variable per sender
//! (`WEBHOOK_SECRET` for Stripe, `STANDARD_WEBHOOK_SECRET`, `GITHUB_WEBHOOK_SECRET`,
//! `SHOPIFY_WEBHOOK_SECRET`): a flag would show them to anyone who can list the processes. A
//! sender whose secret is not set has no route (its path answers 404); at least one must be set.

use idem::inbox::{GitHubScheme, ShopifyScheme, SignatureScheme, StandardWebhooks};
use serving::{Flag, Flags, Limits};
use std::fmt;
use std::net::SocketAddr;
use std::time::Duration;

/// What the receiver runs with.
#[derive(Clone)]
pub(crate) struct Settings {
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
    /// Stripe's signing secrets (`WEBHOOK_SECRET`, comma-separated during a rotation): the
    /// route `POST /webhooks/stripe` when set.
    pub scheme: Option<SignatureScheme>,
    /// How many secrets `WEBHOOK_SECRET` holds (logged; never the secrets).
    pub secrets: usize,
    /// The Standard Webhooks (Svix) secrets, `whsec_<base64>`, each decoding to at least 16
    /// bytes (`STANDARD_WEBHOOK_SECRET`): the route `POST /webhooks/standard` when set.
    pub standard: Option<StandardWebhooks>,
    /// GitHub's webhook secrets (`GITHUB_WEBHOOK_SECRET`): `POST /webhooks/github` when set.
    /// Comma-separated during a rotation, spaces around each trimmed: a GitHub secret is free
    /// text, and one holding a comma or starting or ending with a space cannot be given here
    /// (choose secrets without them).
    pub github: Option<GitHubScheme>,
    /// Shopify's app client secrets (`SHOPIFY_WEBHOOK_SECRET`): `POST /webhooks/shopify` when
    /// set; comma-separated and trimmed like GitHub's.
    pub shopify: Option<ShopifyScheme>,
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
            .field("standard", &self.standard)
            .field("github", &self.github)
            .field("shopify", &self.shopify)
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
  Each sender's signing secret, from the environment only (never a flag), several separated by
  commas during a rotation (`new,old`; spaces around each are trimmed, so a secret cannot hold
  a comma or start or end with a space). At least one must be set; a sender whose secret is not
  set has no route: its path answers 404.
  WEBHOOK_SECRET          Stripe's (`whsec_...`): POST /webhooks/stripe
  STANDARD_WEBHOOK_SECRET Standard Webhooks / Svix (`whsec_<base64>`, at least 16 bytes once
                          decoded): POST /webhooks/standard
  GITHUB_WEBHOOK_SECRET   GitHub's webhook secret (free text in GitHub's settings: choose one
                          without commas or surrounding spaces): POST /webhooks/github
  SHOPIFY_WEBHOOK_SECRET  Shopify's app client secret: POST /webhooks/shopify
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
    pub(crate) fn from_args(args: impl IntoIterator<Item = String>) -> Result<Self, String> {
        Self::from_args_and_env(args, |name| std::env::var(name).ok())
    }

    /// From `args` and the variables `env` gives (tests pass their own).
    pub(crate) fn from_args_and_env(
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

        let stripe = env("WEBHOOK_SECRET");
        let standard = env("STANDARD_WEBHOOK_SECRET");
        let github = env("GITHUB_WEBHOOK_SECRET");
        let shopify = env("SHOPIFY_WEBHOOK_SECRET");
        if stripe.is_none() && standard.is_none() && github.is_none() && shopify.is_none() {
            return Err(format!(
                "WEBHOOK_SECRET is not set (nor STANDARD_WEBHOOK_SECRET, GITHUB_WEBHOOK_SECRET or \
                 SHOPIFY_WEBHOOK_SECRET): the receiver refuses to start without a signing secret, \
                 since it could not tell a sender's deliveries from forged ones. For Stripe, set \
                 WEBHOOK_SECRET to the secret Stripe shows for the endpoint (Dashboard > \
                 Developers > Webhooks, or the `whsec_...` that `stripe listen` prints); during a \
                 rotation, both secrets separated by a comma.\n{}",
                usage()
            ));
        }
        let config = |name: &str, e: idem::Error| format!("{name}: {e}\n{}", usage());
        let count = stripe
            .as_deref()
            .map_or(0, |s| s.split(',').filter(|s| !s.trim().is_empty()).count());
        let scheme = stripe
            .map(|s| SignatureScheme::from_comma_separated(&s))
            .transpose()
            .map_err(|e| config("WEBHOOK_SECRET", e))?;
        let standard = standard
            .map(|s| StandardWebhooks::from_comma_separated(&s))
            .transpose()
            .map_err(|e| config("STANDARD_WEBHOOK_SECRET", e))?;
        let github = github
            .map(|s| GitHubScheme::from_comma_separated(&s))
            .transpose()
            .map_err(|e| config("GITHUB_WEBHOOK_SECRET", e))?;
        let shopify = shopify
            .map(|s| ShopifyScheme::from_comma_separated(&s))
            .transpose()
            .map_err(|e| config("SHOPIFY_WEBHOOK_SECRET", e))?;

        Ok(Self {
            addr,
            database,
            audit_retention: Duration::from_secs(days * 24 * 3600),
            lease: Duration::from_millis(lease_ms),
            scheme,
            secrets: count,
            standard,
            github,
            shopify,
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
    fn each_sender_has_its_own_secret_and_any_one_is_enough() {
        let only_github =
            parse(&[], &[("GITHUB_WEBHOOK_SECRET", "gh_new, gh_old")]).expect("settings");
        assert!(only_github.scheme.is_none());
        assert_eq!(only_github.secrets, 0);
        assert!(only_github.github.is_some());
        assert!(only_github.standard.is_none() && only_github.shopify.is_none());
        let all = parse(
            &[],
            &[
                ("WEBHOOK_SECRET", "whsec_stripe"),
                (
                    "STANDARD_WEBHOOK_SECRET",
                    "whsec_bmV3LXNlY3JldC1mb3Itcm90YXRpb24h",
                ),
                ("GITHUB_WEBHOOK_SECRET", "gh_secret"),
                ("SHOPIFY_WEBHOOK_SECRET", "shpss_secret"),
            ],
        )
        .expect("settings");
        assert!(all.scheme.is_some() && all.standard.is_some());
        assert!(all.github.is_some() && all.shopify.is_some());
        let shown = format!("{all:?}");
        for secret in ["whsec_stripe", "bmV3LXNl", "gh_secret", "shpss_secret"] {
            assert!(
                !shown.contains(secret),
                "Debug never shows a secret: {shown}"
            );
        }
        // A Standard Webhooks secret must be base64 after its prefix.
        let err = parse(&[], &[("STANDARD_WEBHOOK_SECRET", "whsec_not base64!")])
            .expect_err("not base64");
        assert!(err.starts_with("STANDARD_WEBHOOK_SECRET:"), "{err}");
        // ... and decode to at least 16 bytes (`c2VjcmV0` is `secret`, 6).
        let err =
            parse(&[], &[("STANDARD_WEBHOOK_SECRET", "whsec_c2VjcmV0")]).expect_err("too short");
        assert!(err.starts_with("STANDARD_WEBHOOK_SECRET:"), "{err}");
        assert!(err.contains("fewer than 16"), "{err}");
        assert!(parse(&[], &[("SHOPIFY_WEBHOOK_SECRET", " , ")]).is_err());
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
