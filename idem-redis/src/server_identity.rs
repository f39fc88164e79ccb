//! Which data set the store's server holds, asked once a second while the engine's replay cache
//! is in use: its role and replication ID (`INFO replication`). A master demoted by hand
//! (`REPLICAOF`, no Sentinel to end its clients' connections) keeps the store's connection and
//! goes on serving reads, after a resync that may have dropped the last records; no call
//! fails, so the connections' generation would not move, and a cache confirmed by those reads
//! would go on answering records the server lost. A promotion, a demotion or a resync changes
//! the replication ID: the store's generation moves with it, and the cache is emptied.

use crate::connections::Connections;
use idem_core::{Error, StoreErrorKind};
use redis::Value;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

/// How often the server's identity is asked while the cache is in use: the replay cache's own
/// confirmation window.
const EVERY: Duration = Duration::from_secs(1);

/// A question unanswered this long is taken as lost (its task stuck or dropped): another may
/// be asked. Longer than a response timeout plus a connection timeout (2 s each by default).
const LOST_AFTER: Duration = Duration::from_secs(10);

/// The server's identity as last seen, and how many times it changed.
#[derive(Debug, Default)]
pub(crate) struct ServerIdentity {
    changes: AtomicU64,
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    /// `role` and `master_replid`, as the server last answered.
    seen: Option<String>,
    /// When the last question was sent.
    asked_at: Option<Instant>,
    /// Whether a question is on its way.
    asking: bool,
    /// Whether the server refused the question (`INFO` renamed, or denied by an ACL): never
    /// asked again, so that its log is not filled with denials.
    refused: bool,
}

impl ServerIdentity {
    /// How many times the identity changed.
    pub(crate) fn changes(&self) -> u64 {
        self.changes.load(Ordering::Acquire)
    }

    /// Asks the server on a task of its own if the last question is a second old or more (and
    /// none is on its way); never waits for it. Without a runtime, nothing is asked.
    pub(crate) fn ask_if_due(self: &Arc<Self>, conns: &Arc<Connections>) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        {
            // Never waits on the answers' path: a caller that finds the state busy leaves the
            // question to the one that holds it.
            let Ok(mut state) = self.state.try_lock() else {
                return;
            };
            let since = state.asked_at.map(|at| at.elapsed());
            let due = since.is_none_or(|since| since >= EVERY);
            let lost = since.is_some_and(|since| since >= LOST_AFTER);
            if state.refused || !due || (state.asking && !lost) {
                return;
            }
            state.asking = true;
            state.asked_at = Some(Instant::now());
        }
        let (identity, conns) = (Arc::clone(self), Arc::clone(conns));
        runtime.spawn(async move {
            let mut info = redis::Pipeline::with_capacity(1);
            info.cmd("INFO").arg("replication");
            // Bounded by the connection's response timeout. A failure of the link moves the
            // connections' generation by itself; the server's refusal leaves the identity
            // unknown, as without this check, and is not asked again.
            match conns.pipeline(&info).await {
                Ok(replies) => identity.seen(of_reply(&replies)),
                Err(Error::Store(error)) if error.kind() == StoreErrorKind::Other => {
                    tracing::warn!(
                        target: "idem_redis",
                        %error,
                        "INFO replication is refused: the replay cache will not see a master \
                         demoted by hand (REPLICAOF without Sentinel)"
                    );
                    identity.refused();
                }
                Err(_) => identity.seen(None),
            }
        });
    }

    /// The server refused the question: never asked again.
    fn refused(&self) {
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        state.asking = false;
        state.refused = true;
    }

    /// The answer to a question: a new identity counts a change.
    fn seen(&self, identity: Option<String>) {
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        state.asking = false;
        let Some(identity) = identity else {
            return;
        };
        if state.seen.as_ref().is_some_and(|seen| *seen != identity) {
            self.changes.fetch_add(1, Ordering::AcqRel);
        }
        state.seen = Some(identity);
    }
}

/// The role and replication ID in an `INFO replication` reply; `None` for another reply.
fn of_reply(replies: &[Value]) -> Option<String> {
    let [Value::BulkString(text)] = replies else {
        return None;
    };
    let text = std::str::from_utf8(text).ok()?;
    let field = |name: &str| {
        text.lines()
            .find_map(|line| line.strip_prefix(name)?.strip_prefix(':'))
            .map(str::trim)
    };
    Some(format!("{} {}", field("role")?, field("master_replid")?))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reply(role: &str, replid: &str) -> Vec<Value> {
        let text = format!(
            "# Replication\r\nrole:{role}\r\nconnected_slaves:0\r\nmaster_replid:{replid}\r\n\
             master_replid2:0000\r\n"
        );
        vec![Value::BulkString(text.into_bytes())]
    }

    #[test]
    fn c10_a_new_role_or_replication_id_is_a_change() {
        let identity = ServerIdentity::default();
        identity.seen(of_reply(&reply("master", "aaa")));
        identity.seen(of_reply(&reply("master", "aaa")));
        assert_eq!(identity.changes(), 0, "the first answer is no change");
        identity.seen(of_reply(&reply("slave", "bbb")));
        assert_eq!(identity.changes(), 1, "a demotion and resync");
        identity.seen(None);
        identity.seen(of_reply(&[Value::Nil]));
        assert_eq!(identity.changes(), 1, "no answer is no change");
        identity.seen(of_reply(&reply("master", "bbb")));
        assert_eq!(identity.changes(), 2, "a promotion");
    }
}
