//! Following the master the sentinels name (C13), before the old one fails a call.
//!
//! A master that dies fails the store's calls, which rebuilds its connection where the
//! sentinels say the master now is (`crate::supervised`). A master that is still running
//! when the sentinels promote another (a manual failover, a partition that heals, a master
//! that comes back) takes writes until the sentinels demote it, which can take them seconds;
//! the replica it then becomes drops them (C14). So a task of the store asks a sentinel every
//! [`FOLLOW_EVERY`] which master it names, and when a connection of the store is on another
//! one, replaces it: writes go to the old master for at most about that long after the
//! promotion is known to the sentinel asked. A replacement opened where the sentinels' full
//! lookup says (the first sentinel, in order, naming a master that confirms its role), which
//! may not be where the sentinel asked says: if the sentinel asked still names another master
//! after its replacement, it is out of step, and the next sentinel is asked from then on, so a
//! sentinel left behind by the others never makes the store rebuild every second.

use crate::connections::Connections;
use crate::sentinel::{Asking, Sentinels};
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
        let mut asking = Asking::default();
        // The master named when the store's connection was last replaced for being elsewhere.
        let mut replaced_for: Option<(String, u16)> = None;
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
                Ok(Ok(Some(named))) => {
                    if !conns.elsewhere(&named.0, named.1) {
                        replaced_for = None;
                    } else if replaced_for.as_ref() == Some(&named) {
                        asking.next();
                        replaced_for = None;
                    } else {
                        conns.follow(&named.0, named.1);
                        replaced_for = Some(named);
                    }
                }
                // No sentinel answered, or the one asked does not know the name: the
                // connections' own failures rebuild them.
                Ok(Ok(None) | Err(_)) | Err(_) => asking.next(),
            }
        }
    }));
}
