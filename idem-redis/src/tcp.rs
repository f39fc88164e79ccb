//! The TCP settings of every connection the store opens (C13): keepalive probes on an idle
//! connection, and a user timeout on one with data unacknowledged, so a peer that went silent
//! (a host gone, a partition, a half-open link) closes the socket within seconds instead of
//! the kernel's two hours, whatever the connection is doing.

use redis::io::tcp::socket2::TcpKeepalive;
use redis::io::tcp::TcpSettings;
use redis::{ConnectionInfo, IntoConnectionInfo, ProtocolVersion, RedisResult};
use std::time::Duration;

/// Idle this long, a connection sends its first keepalive probe.
const KEEPALIVE_IDLE: Duration = Duration::from_secs(5);
/// Then a probe this often.
#[cfg(any(target_os = "android", target_os = "fuchsia", target_os = "linux"))]
const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(1);
/// Unanswered probes before the connection is closed (when the user timeout does not close
/// it first).
#[cfg(any(target_os = "android", target_os = "fuchsia", target_os = "linux"))]
const KEEPALIVE_PROBES: u32 = 3;
/// The shortest user timeout: below it, one lost segment retransmitted would close a healthy
/// connection.
const MIN_USER_TIMEOUT: Duration = Duration::from_secs(1);

/// The settings for a store whose calls may take `call_deadline` (one connection timeout plus
/// one response timeout): keepalive after 5 s idle, probes every second; unacknowledged data
/// (a request, a probe) closes the connection after `call_deadline`, at least 1 s (Linux's
/// `TCP_USER_TIMEOUT`; elsewhere three probes).
pub(crate) fn settings(call_deadline: Duration) -> TcpSettings {
    let keepalive = TcpKeepalive::new().with_time(KEEPALIVE_IDLE);
    #[cfg(any(target_os = "android", target_os = "fuchsia", target_os = "linux"))]
    let keepalive = keepalive
        .with_interval(KEEPALIVE_INTERVAL)
        .with_retries(KEEPALIVE_PROBES);
    let settings = TcpSettings::default().set_keepalive(keepalive);
    #[cfg(any(target_os = "android", target_os = "fuchsia", target_os = "linux"))]
    let settings = settings.set_user_timeout(call_deadline.max(MIN_USER_TIMEOUT));
    #[cfg(not(any(target_os = "android", target_os = "fuchsia", target_os = "linux")))]
    let _ = (call_deadline, MIN_USER_TIMEOUT);
    settings
}

/// `url`'s connection information with `tcp`, speaking RESP2 whatever the URL asks
/// (`?protocol=resp3`): the store reads RESP2 replies, and over RESP3 redis-rs's connection
/// manager reconnects on a server's disconnection push without failing a call, so the store
/// could not count it, and a restarted server's lost records could be answered from the
/// replay cache (C10, C13).
pub(crate) fn info(url: &str, tcp: &TcpSettings) -> RedisResult<ConnectionInfo> {
    let info = url.into_connection_info()?;
    let resp2 = info
        .redis_settings()
        .clone()
        .set_protocol(ProtocolVersion::RESP2);
    Ok(info.set_redis_settings(resp2).set_tcp_settings(tcp.clone()))
}

/// A client for `url` whose connections have `tcp`.
pub(crate) fn client(url: &str, tcp: &TcpSettings) -> RedisResult<redis::Client> {
    redis::Client::open(info(url, tcp)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// C13: every connection probes an idle peer and gives up on unacknowledged data within
    /// the call deadline (never below a second).
    #[test]
    fn c13_keepalive_and_a_user_timeout_on_every_connection() {
        let tcp = settings(Duration::from_millis(600));
        assert!(tcp.keepalive().is_some());
        #[cfg(target_os = "linux")]
        assert_eq!(tcp.user_timeout(), Some(MIN_USER_TIMEOUT));
        let tcp = settings(Duration::from_secs(4));
        #[cfg(target_os = "linux")]
        assert_eq!(tcp.user_timeout(), Some(Duration::from_secs(4)));
        let client = client("redis://127.0.0.1:6379/2", &tcp).expect("a client");
        let info = client.get_connection_info();
        assert!(info.tcp_settings().keepalive().is_some());
        assert_eq!(info.redis_settings().db(), 2, "the URL's own settings kept");
    }

    /// C10: a URL asking for RESP3 gets RESP2, under which a server's restart fails a call
    /// and moves the store's generation (the replay cache is emptied).
    #[test]
    fn c10_every_connection_speaks_resp2() {
        let tcp = settings(Duration::from_secs(1));
        let client = client("redis://127.0.0.1:6379/0?protocol=resp3", &tcp).expect("a client");
        let info = client.get_connection_info();
        assert_eq!(info.redis_settings().protocol(), ProtocolVersion::RESP2);
        assert_eq!(info.redis_settings().db(), 0);
    }
}
