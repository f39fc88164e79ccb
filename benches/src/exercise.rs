//! The check every baseline's own test runs before it is trusted as a baseline: each path a few
//! hundred times alone and from concurrent callers, with the operation's own assertions (a
//! replay is a replay, a fresh key is reserved once).

use crate::harness::{Path, Side};
use std::sync::Arc;

/// Runs every path of `side` 200 times from one caller, then 25 times from each of 8 callers,
/// with a stored body of 64 KiB.
pub async fn every_path(side: &dyn Side) {
    for path in Path::ALL {
        let op = side.op(path, 64 * 1024).await;
        for _ in 0..200 {
            op().await;
        }
        let callers: Vec<_> = (0..8)
            .map(|_| {
                let op = Arc::clone(&op);
                tokio::spawn(async move {
                    for _ in 0..25 {
                        op().await;
                    }
                })
            })
            .collect();
        for caller in callers {
            caller.await.expect("a caller panicked");
        }
    }
}
