//! libpq's multi-host connection URL, which sqlx does not read: `postgres://app@h1:5432,h2/db?
//! target_session_attrs=read-write`. The hosts are split off (a host without a port is on
//! 5432), `target_session_attrs` is taken out, and sqlx parses the rest with the first host. A
//! URL of one host and no `target_session_attrs` goes to sqlx untouched.

use crate::error::store_error;
use idem_core::{Error, Field};
use sqlx::postgres::PgConnectOptions;

/// The port of a host given without one.
const DEFAULT_PORT: u16 = 5432;

/// Which servers a connection may stay on (libpq's `target_session_attrs`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum SessionAttrs {
    /// Any server that takes the connection (`any`, the default for one host).
    Any,
    /// Only a server that accepts writes (`read-write`, or its synonym `primary`): a new
    /// connection whose `transaction_read_only` is on is closed and the next host tried.
    ReadWrite,
}

impl SessionAttrs {
    fn parse(value: &str) -> Result<Self, Error> {
        match value {
            "any" => Ok(SessionAttrs::Any),
            "read-write" | "primary" => Ok(SessionAttrs::ReadWrite),
            other => Err(Error::invalid(
                Field::Config,
                format!(
                    "target_session_attrs={other:?} is not supported: use any, read-write or \
                     primary (the store writes)"
                ),
            )),
        }
    }
}

/// One host of the list.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct HostPort {
    pub(crate) host: String,
    pub(crate) port: u16,
}

/// A parsed connection URL.
#[derive(Debug, Clone)]
pub(crate) struct Target {
    /// Everything but the host list: the user, the database, TLS and the other parameters, on
    /// the first host.
    pub(crate) options: PgConnectOptions,
    /// The hosts, in order; empty when the URL names at most one (then `options` says where).
    pub(crate) hosts: Vec<HostPort>,
    pub(crate) attrs: SessionAttrs,
}

/// Parses `url`, libpq's multi-host form included.
pub(crate) fn parse(url: &str) -> Result<Target, Error> {
    let as_sqlx = |url: &str| url.parse::<PgConnectOptions>().map_err(store_error);
    let single = |options| Target {
        options,
        hosts: Vec::new(),
        attrs: SessionAttrs::Any,
    };
    let Some((scheme, rest)) = url.split_once("://") else {
        return as_sqlx(url).map(single);
    };
    if !matches!(scheme, "postgres" | "postgresql") {
        return as_sqlx(url).map(single);
    }
    let authority_end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(authority_end);
    let (userinfo, host_list) = match authority.rfind('@') {
        Some(at) => authority.split_at(at + 1),
        None => ("", authority),
    };
    let (path, query) = tail.split_once('?').unwrap_or((tail, ""));
    let mut attrs = None;
    let mut kept = Vec::new();
    for pair in query.split('&').filter(|pair| !pair.is_empty()) {
        match pair.split_once('=') {
            Some(("target_session_attrs", value)) => attrs = Some(SessionAttrs::parse(value)?),
            _ => kept.push(pair),
        }
    }
    let entries: Vec<&str> = host_list.split(',').collect();
    if entries.len() == 1 && attrs.is_none() {
        return as_sqlx(url).map(single);
    }
    let query = if kept.is_empty() {
        String::new()
    } else {
        format!("?{}", kept.join("&"))
    };
    let first = entries.first().copied().unwrap_or_default();
    let options = as_sqlx(&format!("{scheme}://{userinfo}{first}{path}{query}"))?;
    let hosts = if entries.len() == 1 {
        Vec::new()
    } else {
        entries
            .iter()
            .map(|entry| host_port(entry))
            .collect::<Result<_, _>>()?
    };
    // Several hosts are a primary and its standbys: the store writes, so unless told
    // otherwise it stays only on the one that takes writes (a standby would refuse every
    // reservation and answer reads from behind).
    let default = if hosts.is_empty() {
        SessionAttrs::Any
    } else {
        SessionAttrs::ReadWrite
    };
    Ok(Target {
        options,
        hosts,
        attrs: attrs.unwrap_or(default),
    })
}

/// `host`, `host:port`, `[v6]` or `[v6]:port`.
fn host_port(entry: &str) -> Result<HostPort, Error> {
    let invalid = |why: &str| Error::invalid(Field::Config, format!("host {entry:?}: {why}"));
    let (host, port) = match entry.strip_prefix('[') {
        Some(v6) => {
            let (host, after) = v6
                .split_once(']')
                .ok_or_else(|| invalid("an IPv6 address without its closing bracket"))?;
            (host, after.strip_prefix(':'))
        }
        None => match entry.split_once(':') {
            Some((host, port)) => (host, Some(port)),
            None => (entry, None),
        },
    };
    if host.is_empty() {
        return Err(invalid("an empty host in a list of hosts"));
    }
    let port = match port {
        Some(port) => port
            .parse::<u16>()
            .ok()
            .filter(|port| *port > 0)
            .ok_or_else(|| invalid("an invalid port number"))?,
        None => DEFAULT_PORT,
    };
    Ok(HostPort {
        host: host.to_owned(),
        port,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hosts(target: &Target) -> Vec<(&str, u16)> {
        target
            .hosts
            .iter()
            .map(|h| (h.host.as_str(), h.port))
            .collect()
    }

    #[test]
    fn c13_a_multi_host_url_gives_every_host_in_order() {
        let target = parse(
            "postgres://app:secret@db1:5433,db2,[::1]:6543/payments?sslmode=disable&target_session_attrs=read-write&application_name=web",
        )
        .expect("a multi-host URL");
        assert_eq!(
            hosts(&target),
            [("db1", 5433), ("db2", 5432), ("::1", 6543)]
        );
        assert_eq!(target.attrs, SessionAttrs::ReadWrite);
        let options = &target.options;
        assert_eq!((options.get_host(), options.get_port()), ("db1", 5433));
        assert_eq!(options.get_username(), "app");
        assert_eq!(options.get_database(), Some("payments"));
        assert_eq!(options.get_application_name(), Some("web"));
        let primary = parse("postgresql://app@a,b/db?target_session_attrs=primary").expect("a URL");
        assert_eq!(primary.attrs, SessionAttrs::ReadWrite);
        let any = parse("postgres://app@a:1,b:2/db?target_session_attrs=any").expect("a URL");
        assert_eq!(any.attrs, SessionAttrs::Any);
        assert_eq!(hosts(&any), [("a", 1), ("b", 2)]);
    }

    /// C13: several hosts without `target_session_attrs` keep only the writable one.
    #[test]
    fn c13_several_hosts_are_read_write_unless_told_otherwise() {
        let target = parse("postgres://app@a,b/db").expect("a URL");
        assert_eq!(target.attrs, SessionAttrs::ReadWrite);
    }

    #[test]
    fn c13_a_single_host_url_is_sqlx_s_own() {
        let target = parse("postgres://app@db:5433/payments").expect("a URL");
        assert!(target.hosts.is_empty());
        assert_eq!(target.attrs, SessionAttrs::Any);
        assert_eq!(target.options.get_port(), 5433);
        let checked = parse("postgres://app@db/payments?target_session_attrs=read-write")
            .expect("one host, checked for writes");
        assert!(checked.hosts.is_empty());
        assert_eq!(checked.attrs, SessionAttrs::ReadWrite);
        assert_eq!(checked.options.get_host(), "db");
    }

    #[test]
    fn c13_what_the_store_cannot_follow_is_a_configuration_error() {
        for url in [
            "postgres://app@a,b/db?target_session_attrs=read-only",
            "postgres://app@a,b/db?target_session_attrs=standby",
            "postgres://app@a:5432,b:x/db",
            "postgres://app@a,,b/db",
            "postgres://app@a,[::1/db",
        ] {
            let error = parse(url).expect_err(url);
            assert!(
                matches!(
                    error,
                    Error::InvalidInput {
                        field: Field::Config,
                        ..
                    }
                ),
                "{url}: {error:?}"
            );
        }
        assert!(parse("postgres://app@db:notaport/payments").is_err());
    }
}
