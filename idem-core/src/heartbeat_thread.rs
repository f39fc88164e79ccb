//! Which thread the engine's heartbeat runs on: a network store that keeps connections per
//! runtime asks it, to renew through connections of its own there.

use std::cell::Cell;

thread_local! {
    static ON_HEARTBEAT: Cell<bool> = const { Cell::new(false) };
}

/// Whether the current thread is the engine's heartbeat thread: a network store that keeps
/// connections per runtime uses connections of its own for the renewals made there (the
/// application's runtime may be blocked, and its sockets with it).
///
/// ```
/// assert!(!idem_core::store::on_heartbeat_thread());
/// ```
pub fn on_heartbeat_thread() -> bool {
    ON_HEARTBEAT.with(Cell::get)
}

/// Marks the current thread as the heartbeat's (the engine does, once, on the thread it starts).
pub(crate) fn mark_this_thread() {
    ON_HEARTBEAT.with(|on| on.set(true));
}
