//! Waiting for what a server does after it answered (or after its client hung up): a probe
//! asked again until its answer will do.

use std::future::Future;
use std::time::Duration;

/// Asks `probe` up to `tries` times, `every` apart, until `done` accepts its answer; returns
/// the last answer (accepted or not: the caller's assertion says what was expected).
pub async fn poll<T, F, Fut>(
    tries: u32,
    every: Duration,
    mut probe: F,
    done: impl Fn(&T) -> bool,
) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = T>,
{
    let mut answer = probe().await;
    for _ in 1..tries {
        if done(&answer) {
            break;
        }
        tokio::time::sleep(every).await;
        answer = probe().await;
    }
    answer
}
