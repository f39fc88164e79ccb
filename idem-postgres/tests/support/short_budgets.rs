//! Callers whose store budgets are shorter than a statement under load (C13): what they were
//! served, and how many connections the proxy in front of the server saw opened meanwhile.

use fault_proxy::FaultProxy;
use idem_core::Idempotency;
use idem_postgres::PgStore;
use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How many callers call at once.
pub(crate) const CALLERS: u64 = 32;
/// For how long.
const FOR: Duration = Duration::from_secs(3);

/// What the callers got, and the connections opened.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Tally {
    pub(crate) served: usize,
    pub(crate) cut_off: usize,
    pub(crate) opened: usize,
}

impl Tally {
    /// Printed, then asserted: at least `served` calls served (the callers did run), at most
    /// `opened` connections opened (no reconnection storm).
    pub(crate) fn assert_at_least_served_at_most_opened(self, served: usize, opened: usize) {
        let Self {
            served: got,
            cut_off,
            opened: seen,
        } = self;
        println!("served {got}, cut off {cut_off}, connections opened {seen}");
        assert!(
            got >= served,
            "served {got}, cut off {cut_off}, opened {seen}"
        );
        assert!(
            seen <= opened,
            "a reconnection storm: {seen} connections opened (served {got})"
        );
    }
}

/// [`CALLERS`] tasks, each calling `call(idem, key, budget)` with a fresh key after another for
/// three seconds, budgets of `shortest` to `shortest + 30` ms; `call` says whether it was
/// served. `proxy` counts the connections opened.
pub(crate) async fn hammer<F, Fut>(
    idem: &Idempotency<PgStore>,
    proxy: &FaultProxy,
    shortest: u64,
    call: F,
) -> Tally
where
    F: Fn(Idempotency<PgStore>, String, Duration) -> Fut + Clone + Send + 'static,
    Fut: Future<Output = bool> + Send,
{
    let opened_before = proxy.connections();
    let until = Instant::now() + FOR;
    let (served, cut_off) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let mut callers = Vec::new();
    for caller in 0..CALLERS {
        let (idem, call) = (idem.clone(), call.clone());
        let (served, cut_off) = (Arc::clone(&served), Arc::clone(&cut_off));
        callers.push(tokio::spawn(async move {
            let mut n = 0u64;
            while Instant::now() < until {
                let budget = Duration::from_millis(shortest + (caller * 7 + n * 13) % 31);
                let key = format!("short-{caller}-{n}");
                n += 1;
                let tally = if call(idem.clone(), key, budget).await {
                    &served
                } else {
                    &cut_off
                };
                tally.fetch_add(1, Ordering::Relaxed);
            }
        }));
    }
    for caller in callers {
        caller.await.expect("a caller");
    }
    Tally {
        served: served.load(Ordering::Relaxed),
        cut_off: cut_off.load(Ordering::Relaxed),
        opened: proxy.connections() - opened_before,
    }
}
