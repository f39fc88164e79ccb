//! Which addresses a dispatcher may connect to: by default, public ones only.

use std::future::Future;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;

use reqwest::dns::{Addrs, Name, Resolve, Resolving};
use url::{Host, Url};

/// The addresses a dispatcher refuses unless told otherwise: loopback, private (RFC 1918,
/// unique local, shared address space) and link-local (cloud metadata services live there).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct AddressPolicy {
    pub(crate) allow_loopback: bool,
    pub(crate) allow_private: bool,
}

impl AddressPolicy {
    /// Addresses no receiver has.
    pub(crate) fn never_allowed(ip: IpAddr) -> bool {
        match ip {
            IpAddr::V4(v4) => v4.is_unspecified() || v4.is_broadcast() || v4.is_multicast(),
            IpAddr::V6(v6) => v6.is_unspecified() || v6.is_multicast(),
        }
    }

    /// Whether a connection to `ip` is allowed.
    pub(crate) fn allows(&self, ip: IpAddr) -> bool {
        let ip = match ip {
            IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(IpAddr::V6(v6), IpAddr::V4),
            v4 => v4,
        };
        if Self::never_allowed(ip) {
            return false;
        }
        if ip.is_loopback() {
            return self.allow_loopback;
        }
        if is_private(ip) || is_link_local(ip) {
            return self.allow_private;
        }
        true
    }
}

fn is_private(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => {
            let [a, b, ..] = v4.octets();
            v4.is_private() || (a == 100 && (64..128).contains(&b)) || a == 0
        }
        IpAddr::V6(v6) => (v6.segments()[0] & 0xfe00) == 0xfc00,
    }
}

fn is_link_local(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => v4.is_link_local(),
        IpAddr::V6(v6) => (v6.segments()[0] & 0xffc0) == 0xfe80,
    }
}

/// The address a URL names literally, if it does.
pub(crate) fn literal_ip(url: &Url) -> Option<IpAddr> {
    match url.host()? {
        Host::Ipv4(v4) => Some(IpAddr::V4(v4)),
        Host::Ipv6(v6) => Some(IpAddr::V6(v6)),
        Host::Domain(_) => None,
    }
}

/// reqwest's resolver for the dispatcher: the system's, less the addresses the policy
/// refuses, so a name that resolves (or rebinds) to a private address is never connected to.
#[derive(Debug)]
pub(crate) struct GuardedResolver {
    pub(crate) policy: AddressPolicy,
}

impl Resolve for GuardedResolver {
    fn resolve(&self, name: Name) -> Resolving {
        let policy = self.policy;
        let host = name.as_str().to_owned();
        let work: Pin<Box<dyn Future<Output = _> + Send>> = Box::pin(async move {
            let found: Vec<SocketAddr> = tokio::net::lookup_host((host.as_str(), 0))
                .await?
                .filter(|addr| policy.allows(addr.ip()))
                .collect();
            if found.is_empty() {
                return Err(
                    format!("{host} resolves to no address the outbox may deliver to").into(),
                );
            }
            Ok(Box::new(found.into_iter()) as Addrs)
        });
        work
    }
}

/// Loopback addresses, for tests of the policy.
#[cfg(test)]
const LOOPBACK: [IpAddr; 2] = [
    IpAddr::V4(std::net::Ipv4Addr::LOCALHOST),
    IpAddr::V6(std::net::Ipv6Addr::LOCALHOST),
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn c17_private_loopback_and_link_local_are_refused_unless_allowed() {
        let strict = AddressPolicy::default();
        let refused = [
            "127.0.0.1",
            "::1",
            "10.1.2.3",
            "172.16.0.1",
            "192.168.1.1",
            "169.254.169.254",
            "fe80::1",
            "fd00::1",
            "100.64.0.1",
            "::ffff:127.0.0.1",
            "::ffff:10.0.0.1",
            "0.0.0.0",
        ];
        for ip in refused {
            let ip: IpAddr = ip.parse().expect("an address");
            assert!(!strict.allows(ip), "{ip}");
        }
        for ip in [
            "93.184.216.34",
            "2606:2800:220:1:248:1893:25c8:1946",
            "8.8.8.8",
        ] {
            let ip: IpAddr = ip.parse().expect("an address");
            assert!(strict.allows(ip), "{ip}");
        }
        let loopback = AddressPolicy {
            allow_loopback: true,
            allow_private: false,
        };
        assert!(LOOPBACK.iter().all(|ip| loopback.allows(*ip)));
        assert!(!loopback.allows("10.0.0.1".parse().expect("an address")));
    }
}
