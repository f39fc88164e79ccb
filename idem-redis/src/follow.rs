//! Following the master the sentinels name (C13), before the old one fails a call.
//!
//! A master that dies fails the store's calls, which rebuilds its connection where the
//! sentinels say the master now is (`crate::supervised`). A master that is still running
//! when the sentinels promote another (a manual failover, a partition that heals, a master
//! that comes back) takes writes until the sentinels demote it, which can take them seconds;
//! the replica it then becomes drops them (C14). So a task of the store asks a sentinel every
//! [`FOLLOW_EVERY`] which master it names, and when a connection of the store is on another
//! one, replaces it: writes go to the old master for at most about that long after the
//! promotion is known to the sentinel asked.

use crate::connections::Connections;
use crate::sentinel::Sentinels;
use std::sync::Weak;
use std::time::Duration;

/// How often the sentinels are asked.
pub(crate) const FOLLOW_EVERY: Duration = Duration::from_secs(1);

/// Starts the task on the current runtime (none: no task, failures alone rebuild); it ends
/// once the store and its clones are gone. Each question is cut off after `within`.
pub(crate) fn spawn(conns: Weak<Connections>, sentinels: Sentinels, within: Duration) {
    let Ok(runtime) = tokio::runtime::Handle::try_current() else {
        return;
    };
    drop(runtime.spawn(async move {
        let mut asking = None;
        loop {
            tokio::time::sleep(FOLLOW_EVERY).await;
            if conns.strong_count() == 0 {
                return;
            }
            let named = tokio::time::timeout(within, sentinels.named_master(&mut asking)).await;
            let Some(conns) = conns.upgrade() else {
                return;
            };
            match named {
                Ok(Ok(Some((host, port)))) => conns.follow(&host, port),
                // No sentinel answered, or none knows the name: the connections' own failures
                // rebuild them.
                Ok(Ok(None) | Err(_)) | Err(_) => asking = None,
            }
        }
    }));
}
