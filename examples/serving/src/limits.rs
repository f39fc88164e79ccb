//! What a connection and a request may cost the server, and how an operator sets it: four
//! flags, each with its environment variable, the same in every server.

use crate::flags::{Flag, Flags};
use std::ops::RangeInclusive;
use std::time::Duration;

/// The longest deadline the flags accept, in milliseconds (a day).
const MAX_DEADLINE_MS: u64 = 86_400_000;

/// What a connection and a request may cost the server.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// How long a client may take to send a request's head (request line and headers), and
    /// how long an idle keep-alive connection stays open. Past it the connection is closed.
    pub header_timeout: Duration,
    /// How long a client may take to send a request's body, from the end of its head. Past
    /// it the request is answered 408 and the connection closed.
    pub body_timeout: Duration,
    /// The most connections open at once; more wait in the listen queue until one closes.
    pub max_connections: usize,
    /// The most request-body bytes held in memory at once, all requests together. A request
    /// whose body finds no room is refused at once (503 with `Retry-After`).
    pub max_buffered_body_bytes: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            header_timeout: Duration::from_secs(10),
            body_timeout: Duration::from_secs(30),
            max_connections: 1024,
            max_buffered_body_bytes: 16 * 1024 * 1024,
        }
    }
}

impl Limits {
    /// The flags that set the limits, and their environment variables.
    pub const FLAGS: &'static [Flag] = &[
        Flag {
            name: "--header-timeout-ms",
            env: "IDEM_HEADER_TIMEOUT_MS",
        },
        Flag {
            name: "--body-timeout-ms",
            env: "IDEM_BODY_TIMEOUT_MS",
        },
        Flag {
            name: "--max-connections",
            env: "IDEM_MAX_CONNECTIONS",
        },
        Flag {
            name: "--max-buffered-body-bytes",
            env: "IDEM_MAX_BUFFERED_BODY_BYTES",
        },
    ];

    /// The flags of [`Limits::FLAGS`], for a usage line.
    pub const SYNOPSIS: &'static str = "[--header-timeout-ms N] [--body-timeout-ms N] \
                                        [--max-connections N] [--max-buffered-body-bytes N]";

    /// The limits `flags` set (read with [`Limits::FLAGS`] among their flags), the defaults
    /// for those not given; an error names the flag and the values it takes.
    pub fn from_flags(flags: &Flags) -> Result<Self, String> {
        let defaults = Self::default();
        Ok(Self {
            header_timeout: deadline(flags, "--header-timeout-ms", defaults.header_timeout)?,
            body_timeout: deadline(flags, "--body-timeout-ms", defaults.body_timeout)?,
            max_connections: count(
                flags,
                "--max-connections",
                defaults.max_connections,
                1_000_000,
            )?,
            max_buffered_body_bytes: count(
                flags,
                "--max-buffered-body-bytes",
                defaults.max_buffered_body_bytes,
                1 << 40,
            )?,
        })
    }

    /// The usage lines of the flags, their descriptions in a column `width` characters past
    /// the indent; `who` names the server's clients (`client`, `sender`).
    pub fn usage(who: &str, width: usize) -> String {
        let defaults = Self::default();
        let entries = [
            (
                "--header-timeout-ms",
                format!("how long a {who} may take to send a request's head, and how long an"),
                format!(
                    "idle connection stays open (env IDEM_HEADER_TIMEOUT_MS; default {})",
                    defaults.header_timeout.as_millis()
                ),
            ),
            (
                "--body-timeout-ms",
                format!("how long a {who} may take to send a request's body; past it: 408"),
                format!(
                    "(env IDEM_BODY_TIMEOUT_MS; default {})",
                    defaults.body_timeout.as_millis()
                ),
            ),
            (
                "--max-connections",
                "connections open at once; more wait to be accepted".to_owned(),
                format!(
                    "(env IDEM_MAX_CONNECTIONS; default {})",
                    defaults.max_connections
                ),
            ),
            (
                "--max-buffered-body-bytes",
                "request-body bytes held at once, all requests together".to_owned(),
                format!(
                    "(env IDEM_MAX_BUFFERED_BODY_BYTES; default {})",
                    defaults.max_buffered_body_bytes
                ),
            ),
        ];
        let indent = " ".repeat(2 + width);
        entries
            .iter()
            .map(|(flag, first, second)| {
                let pad = width.saturating_sub(flag.len()).max(2);
                format!("  {flag}{}{first}\n{indent}{second}", " ".repeat(pad))
            })
            .collect::<Vec<_>>()
            .join("\n")
    }
}

/// The deadline `flag` gives in milliseconds (1 ms to a day), else `default`.
fn deadline(flags: &Flags, flag: &str, default: Duration) -> Result<Duration, String> {
    let default = u64::try_from(default.as_millis()).unwrap_or(u64::MAX);
    number(flags, flag, default, 1..=MAX_DEADLINE_MS).map(Duration::from_millis)
}

/// The count `flag` gives (1 to `max`), else `default`.
fn count(flags: &Flags, flag: &str, default: usize, max: u64) -> Result<usize, String> {
    let default = u64::try_from(default).unwrap_or(u64::MAX);
    number(flags, flag, default, 1..=max).map(|n| usize::try_from(n).unwrap_or(usize::MAX))
}

/// The value of `flag` in `flags` as a whole number within `range`, else `default`.
fn number(
    flags: &Flags,
    flag: &str,
    default: u64,
    range: RangeInclusive<u64>,
) -> Result<u64, String> {
    let Some(text) = flags.get(flag) else {
        return Ok(default);
    };
    text.trim()
        .parse::<u64>()
        .ok()
        .filter(|n| range.contains(n))
        .ok_or_else(|| {
            format!(
                "{flag} {text}: a whole number from {} to {}",
                range.start(),
                range.end()
            )
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits(args: &[&str], env: &[(&str, &str)]) -> Result<Limits, String> {
        let flags = Flags::read(
            args.iter().map(|s| (*s).to_owned()),
            &[Limits::FLAGS],
            |name| {
                env.iter()
                    .find(|(k, _)| *k == name)
                    .map(|(_, v)| (*v).to_owned())
            },
        )
        .map_err(|e| e.to_string())?;
        Limits::from_flags(&flags)
    }

    #[test]
    fn limits_have_defaults_flags_and_env() {
        let l = limits(&[], &[]).expect("limits");
        assert_eq!(l, Limits::default());
        assert_eq!(l.header_timeout, Duration::from_secs(10));
        assert_eq!(l.body_timeout, Duration::from_secs(30));
        let l = limits(
            &["--header-timeout-ms", "500", "--max-connections=8"],
            &[
                ("IDEM_HEADER_TIMEOUT_MS", "9"),
                ("IDEM_BODY_TIMEOUT_MS", "700"),
                ("IDEM_MAX_BUFFERED_BODY_BYTES", "4096"),
            ],
        )
        .expect("limits");
        assert_eq!(l.header_timeout, Duration::from_millis(500));
        assert_eq!(l.body_timeout, Duration::from_millis(700));
        assert_eq!(l.max_connections, 8);
        assert_eq!(l.max_buffered_body_bytes, 4096);
        for bad in [
            ["--body-timeout-ms", "0"],
            ["--max-connections", "x"],
            ["--header-timeout-ms", "-1"],
        ] {
            assert!(limits(&bad, &[]).is_err(), "{bad:?}");
        }
        let err = limits(&["--max-connections", "0"], &[]).expect_err("0 connections");
        assert_eq!(err, "--max-connections 0: a whole number from 1 to 1000000");
    }

    #[test]
    fn usage_names_every_flag_its_variable_and_its_default() {
        let usage = Limits::usage("client", 27);
        for flag in Limits::FLAGS {
            assert!(
                usage.contains(flag.name) && usage.contains(flag.env),
                "{usage}"
            );
            assert!(Limits::SYNOPSIS.contains(flag.name));
        }
        assert!(usage.contains("default 16777216"), "{usage}");
        assert!(usage.starts_with(
            "  --header-timeout-ms        how long a client may take to send a request's head"
        ));
    }
}
