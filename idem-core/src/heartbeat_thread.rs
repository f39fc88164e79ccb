//! Which thread the engine's heartbeat runs on.

use std::cell::Cell;

thread_local! {
    static ON_HEARTBEAT: Cell<bool> = const { Cell::new(false) };
}

/// Whether this is the heartbeat thread (a store with per-runtime connections uses its own).
///
/// ```
/// assert!(!idem_core::store::on_heartbeat_thread());
/// ```
pub fn on_heartbeat_thread() -> bool {
    ON_HEARTBEAT.with(Cell::get)
}

/// Marks the current thread as the heartbeat's.
pub(crate) fn mark_this_thread() {
    ON_HEARTBEAT.with(|on| on.set(true));
}
