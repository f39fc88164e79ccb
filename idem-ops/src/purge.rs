//! Purging expired records periodically (C10).

use crate::periodic::Periodic;
use idem_core::{Idempotency, Store};
use std::time::Duration;

/// Purges `idem`'s expired records every `period`, on a task of its own, in batches of the
/// policy's `purge_batch` until a batch comes back short (so a backlog drains at once). A
/// store whose records expire by themselves ([`Capabilities::server_ttl`](idem_core::store::Capabilities::server_ttl), Redis) needs nothing: the
/// task idles until stopped. A failed purge is logged and tried again at the next period.
///
/// ```
/// use idem_core::{Idempotency, MemoryStore};
/// use std::time::Duration;
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// let idem = Idempotency::new(MemoryStore::new());
/// let purge = idem_ops::purge_every(&idem, Duration::from_secs(60));
/// // ... serve ...
/// purge.stop().await;
/// # }
/// ```
pub fn purge_every<S: Store + 'static>(idem: &Idempotency<S>, period: Duration) -> Periodic {
    let idem = idem.clone();
    let ttl = idem.store().capabilities().server_ttl;
    Periodic::spawn(period, move |stopped| {
        let idem = idem.clone();
        async move {
            if ttl {
                return std::future::pending().await;
            }
            loop {
                match idem.purge_expired().await {
                    Ok(n) if n >= idem.policy().purge_batch && !*stopped.borrow() => continue,
                    Ok(_) => break,
                    Err(error) => {
                        tracing::warn!(target: "idem", %error, "idem.purge failed");
                        break;
                    }
                }
            }
        }
    })
}
