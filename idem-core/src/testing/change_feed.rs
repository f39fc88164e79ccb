//! The change-feed scenarios (C5, C13), for every store with a feed
//! ([`Store::watch`](crate::Store::watch)): a duplicate that waits for its original in another
//! process (two stores, two engines: nothing shared in memory) is woken by the original's
//! announcement through the waiter's feed, within a few milliseconds of the completion, far
//! below the one-second polling fallback of a waiter whose store has a feed; and again after
//! the feed's listener was ended by the server or vanished silently (its server side gone, the
//! client hearing nothing), once the feed noticed and connected again; an announcement sent
//! while the listener was gone still wakes its waiter.
//!
//! Each round completes the original 1.35 s after the duplicates started waiting, away from
//! every poll of the engine's waiters: one whose store has a feed polls every second (its next
//! read would come 650 ms after the completion), one whose store has none polls at 20 ms
//! doubling up to 500 ms (its next read, at about 1.62 s, would come 270 ms after it). Both are
//! past the bound of every round, 150 ms: only a wake-up by the feed is that quick.
//!
//! A store's test implements [`ChangeFeedHarness`] and stamps the scenarios with
//! [`change_feed_tests!`](crate::change_feed_tests); its own cases (a pooler, a cluster's
//! nodes) use [`Rounds`].

use crate::{Answer, Failure, FencingToken, Idempotency, Outcome, Policy, Store, StoredResponse};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::oneshot;

/// How long after the original's completion each waiter must have its replay.
pub const PROMPT: Duration = Duration::from_millis(150);

/// How long the waiters wait before the original completes: away from the polls of either kind
/// of waiter (see the top of this module).
pub const BEFORE_COMPLETING: Duration = Duration::from_millis(1350);

/// What a scenario does to the waiting process's feed, so that the harness prepares a
/// [`Site`](ChangeFeedHarness::Site) it can be done on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum FeedFault {
    /// Nothing: both stores on the shared server.
    None,
    /// The server ends the feed's connection
    /// ([`kill_listener`](ChangeFeedHarness::kill_listener)); its connections can be listed
    /// ([`listener_connections`](ChangeFeedHarness::listener_connections)).
    Killed,
    /// The server side of the feed's connection vanishes, the client hearing nothing
    /// ([`cut`](ChangeFeedHarness::cut), [`mend`](ChangeFeedHarness::mend)); the feed pings
    /// every `every`, due within `within`.
    Silenced {
        /// The feed's ping interval.
        every: Duration,
        /// The feed's ping deadline.
        within: Duration,
    },
    /// The feed's listener goes away while an announcement is sent
    /// ([`lose_listener`](ChangeFeedHarness::lose_listener), then
    /// [`mend`](ChangeFeedHarness::mend)); the feed must be back well within a second.
    Lost,
}

/// How the change-feed scenarios get two processes' stores of one backend, and act on the
/// waiting process's feed.
#[crate::store::async_trait]
pub trait ChangeFeedHarness: Send + Sync + 'static {
    /// The store under test.
    type Store: Store + 'static;

    /// What the stores of one scenario share: their records and channel (no other scenario's),
    /// their server (one of the scenario's own where the fault needs it), and what the fault
    /// acts through.
    type Site: Send + Sync;

    /// A site for a scenario that does `fault`.
    async fn site(&self, fault: FeedFault) -> Self::Site;

    /// A store on `site`, as the process that runs the originals has it.
    async fn original(&self, site: &Self::Site) -> Self::Store;

    /// A store on `site`, as the waiting process has it: its feed is the one the faults hit.
    async fn waiter(&self, site: &Self::Site) -> Self::Store;

    /// How many listeners of the waiting process's feed the server has.
    async fn listeners(&self, site: &Self::Site) -> usize;

    /// The server's ids of the waiting process's feed connections ([`FeedFault::Killed`]).
    async fn listener_connections(&self, site: &Self::Site) -> Vec<String>;

    /// The server ends the waiting process's feed connection ([`FeedFault::Killed`]).
    async fn kill_listener(&self, site: &Self::Site);

    /// The server side of the feed's connection goes away and the client hears nothing
    /// ([`FeedFault::Silenced`]).
    async fn cut(&self, site: &Self::Site);

    /// The network carries the feed's connections again (after [`cut`](Self::cut) or
    /// [`lose_listener`](Self::lose_listener)).
    async fn mend(&self, site: &Self::Site);

    /// How soon after the network is mended a silenced listener must be replaced.
    const REPLACED_WITHIN: Duration;

    /// Ends the waiting process's listener so that announcements reach nobody until the feed
    /// replaces it; returns once it is gone ([`FeedFault::Lost`]).
    async fn lose_listener(&self, site: &Self::Site);

    /// Waits until the server has `count` [`listeners`](Self::listeners), at most `limit`.
    async fn until_listeners(&self, site: &Self::Site, count: usize, limit: Duration) {
        let started = Instant::now();
        loop {
            let now = self.listeners(site).await;
            if now == count {
                return;
            }
            assert!(
                started.elapsed() < limit,
                "{now} listeners after {limit:?}, not {count}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

/// An engine whose duplicates wait up to 5 s for their original.
pub fn waiting_engine<S: Store + 'static>(store: S) -> Idempotency<S> {
    let policy = Policy::default().wait_in_flight(Duration::from_secs(5));
    Idempotency::with_policy(store, policy).expect("a valid policy")
}

fn charge(body: &str) -> StoredResponse {
    StoredResponse::new(201, body.to_owned())
}

/// Rounds of one original and its waiting duplicates, each in a process of its own (engines
/// from [`waiting_engine`] over stores that share records but nothing in memory).
#[derive(Debug)]
pub struct Rounds<'a, S: Store + 'static> {
    original: &'a Idempotency<S>,
    waiters: &'a [&'a Idempotency<S>],
}

impl<'a, S: Store + 'static> Rounds<'a, S> {
    /// Rounds of `original` and `waiters`.
    pub fn new(original: &'a Idempotency<S>, waiters: &'a [&'a Idempotency<S>]) -> Self {
        Self { original, waiters }
    }

    /// One round: the original runs a request whose handler waits; each waiter sends a
    /// duplicate, which waits; the original completes. Returns how long after the completion
    /// the slowest duplicate had its replay (no duplicate's handler ever run).
    pub async fn once(&self) -> Duration {
        let key = format!("k_{}", FencingToken::generate());
        let req = self
            .original
            .request("acct_feed", "POST", "/charges")
            .key(Some(key.as_str()))
            .body(b"{\"cents\":100}")
            .build()
            .expect("a request");
        let runs = Arc::new(AtomicUsize::new(0));
        let (started_tx, started_rx) = oneshot::channel();
        let (finish_tx, finish_rx) = oneshot::channel::<()>();
        let first = {
            let (idem, req, runs) = (self.original.clone(), req.clone(), Arc::clone(&runs));
            tokio::spawn(async move {
                let outcome = idem
                    .run(&req, move |_ctx| async move {
                        runs.fetch_add(1, Ordering::SeqCst);
                        let _ = started_tx.send(());
                        let _ = finish_rx.await;
                        Ok::<_, Failure<std::io::Error>>(charge("ch_1"))
                    })
                    .await;
                (outcome, Instant::now())
            })
        };
        started_rx.await.expect("the original started");
        let duplicates: Vec<_> = self
            .waiters
            .iter()
            .map(|waiter| {
                let (idem, req, runs) = ((*waiter).clone(), req.clone(), Arc::clone(&runs));
                tokio::spawn(async move {
                    let outcome = idem
                        .run(&req, move |_ctx| async move {
                            runs.fetch_add(1, Ordering::SeqCst);
                            Ok::<_, Failure<std::io::Error>>(charge("the duplicate ran"))
                        })
                        .await;
                    (outcome, Instant::now())
                })
            })
            .collect();
        tokio::time::sleep(BEFORE_COMPLETING).await;
        assert!(
            duplicates.iter().all(|d| !d.is_finished()),
            "a duplicate did not wait"
        );
        finish_tx.send(()).expect("the original waits to finish");
        let (outcome, ended) = first.await.expect("the original ran");
        assert!(
            matches!(outcome, Ok(Outcome::Executed(_))),
            "the original: {outcome:?}"
        );
        let mut slowest = Duration::ZERO;
        for duplicate in duplicates {
            let (outcome, answered) = duplicate.await.expect("a duplicate ran");
            assert_eq!(
                outcome.expect("the duplicate is answered"),
                Outcome::Answered(Answer::Replay(charge("ch_1")))
            );
            slowest = slowest.max(answered.saturating_duration_since(ended));
        }
        assert_eq!(runs.load(Ordering::SeqCst), 1, "one execution");
        slowest
    }

    /// Runs `rounds` rounds and asserts each was prompt (within [`PROMPT`]).
    pub async fn prompt(&self, rounds: usize, case: &str) {
        for i in 0..rounds {
            let after = self.once().await;
            eprintln!("{case}, round {i}: answered {after:?} after the completion");
            assert!(
                after < PROMPT,
                "{case}, round {i}: a waiter was answered {after:?} after the completion"
            );
        }
    }
}

/// The engines of the original's process and the waiter's, on a site for `fault`.
async fn processes<H: ChangeFeedHarness>(
    harness: &H,
    fault: FeedFault,
) -> (H::Site, Idempotency<H::Store>, Idempotency<H::Store>) {
    let site = harness.site(fault).await;
    let there = waiting_engine(harness.original(&site).await);
    let here = waiting_engine(harness.waiter(&site).await);
    (site, there, here)
}

/// C5: a duplicate waiting in another process is answered within [`PROMPT`] of the original's
/// completion, woken by the announcement through its feed; and the other way round (each
/// process's feed serves its own waiters).
pub async fn c05_a_duplicate_waiting_in_another_process_is_woken_by_the_announcement<
    H: ChangeFeedHarness,
>(
    harness: &H,
) {
    let (_site, there, here) = processes(harness, FeedFault::None).await;
    Rounds::new(&there, &[&here]).prompt(3, "direct").await;
    Rounds::new(&here, &[&there])
        .prompt(1, "direct, the other way")
        .await;
}

/// C13: a listener whose connection the server ended is replaced by the feed (another
/// connection within 5 s), and its waiters are woken by announcements again.
pub async fn c13_a_listener_terminated_by_the_server_is_replaced_and_wakes_waiters_again<
    H: ChangeFeedHarness,
>(
    harness: &H,
) {
    let (site, there, here) = processes(harness, FeedFault::Killed).await;
    Rounds::new(&there, &[&here])
        .prompt(1, "before the fault")
        .await;
    harness
        .until_listeners(&site, 1, Duration::from_secs(5))
        .await;
    let before = harness.listener_connections(&site).await;
    assert_eq!(before.len(), 1, "the waiter's feed: {before:?}");
    harness.kill_listener(&site).await;
    // The feed connects again by itself (another connection)...
    let started = Instant::now();
    loop {
        let now = harness.listener_connections(&site).await;
        if now.len() == 1 && now != before {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "no new listener 5 s after the termination: {now:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    harness
        .until_listeners(&site, 1, Duration::from_secs(5))
        .await;
    // ...and its waiters are woken by announcements again.
    Rounds::new(&there, &[&here])
        .prompt(2, "after the termination")
        .await;
}

/// C13: a listener whose server side vanished, the client hearing nothing, is found by its
/// ping (every 200 ms, due within 300 ms) and replaced within the harness's
/// [`REPLACED_WITHIN`](ChangeFeedHarness::REPLACED_WITHIN) once the network flows again.
pub async fn c13_a_listener_whose_server_side_vanished_is_replaced_within_its_ping_deadline<
    H: ChangeFeedHarness,
>(
    harness: &H,
) {
    let fault = FeedFault::Silenced {
        every: Duration::from_millis(200),
        within: Duration::from_millis(300),
    };
    let (site, there, here) = processes(harness, fault).await;
    Rounds::new(&there, &[&here])
        .prompt(1, "before the fault")
        .await;
    // The server's side of the listener's connection closes; the client hears nothing.
    harness.cut(&site).await;
    harness
        .until_listeners(&site, 0, Duration::from_secs(5))
        .await;
    harness.mend(&site).await;
    let noticed = Instant::now();
    // Nothing tells the listener: only its ping does.
    harness.until_listeners(&site, 1, H::REPLACED_WITHIN).await;
    let replaced = noticed.elapsed();
    eprintln!("the silent listener was replaced after {replaced:?}");
    Rounds::new(&there, &[&here])
        .prompt(2, "after the silent loss")
        .await;
}

/// C13: an announcement sent while the waiter's listener was gone reaches nobody, yet the
/// waiter is answered long before its first poll (1 s): the feed connected again and woke every
/// waiter.
pub async fn c13_an_announcement_lost_while_the_listener_was_gone_still_wakes_its_waiter<
    H: ChangeFeedHarness,
>(
    harness: &H,
) {
    let (site, there, here) = processes(harness, FeedFault::Lost).await;
    // The feed runs (it starts with the first wait).
    Rounds::new(&there, &[&here])
        .prompt(1, "before the fault")
        .await;

    let req = there
        .request("acct_feed", "POST", "/charges")
        .key(Some(format!("k_{}", FencingToken::generate()).as_str()))
        .body(b"{\"cents\":100}")
        .build()
        .expect("a request");
    let (started_tx, started_rx) = oneshot::channel();
    let (finish_tx, finish_rx) = oneshot::channel::<()>();
    let first = {
        let (idem, req) = (there.clone(), req.clone());
        tokio::spawn(async move {
            idem.run(&req, move |_ctx| async move {
                let _ = started_tx.send(());
                let _ = finish_rx.await;
                Ok::<_, Failure<std::io::Error>>(charge("ch_1"))
            })
            .await
        })
    };
    started_rx.await.expect("the original started");
    let waiting_since = Instant::now();
    let second = {
        let (idem, req) = (here.clone(), req.clone());
        tokio::spawn(async move {
            let outcome = idem
                .run(&req, |_ctx| async {
                    Ok::<_, Failure<std::io::Error>>(charge("the duplicate ran"))
                })
                .await;
            (outcome, Instant::now())
        })
    };
    tokio::time::sleep(Duration::from_millis(50)).await;
    // The listener is gone...
    harness.lose_listener(&site).await;
    // ...so the announcement of this completion reaches nobody.
    finish_tx.send(()).expect("the original waits to finish");
    let outcome = first.await.expect("the original ran");
    assert!(matches!(outcome, Ok(Outcome::Executed(_))), "{outcome:?}");
    harness.mend(&site).await;
    let (outcome, answered) = second.await.expect("the duplicate ran");
    assert_eq!(
        outcome.expect("the duplicate is answered"),
        Outcome::Answered(Answer::Replay(charge("ch_1")))
    );
    // The feed noticed, connected again and woke every waiter: the duplicate read its record
    // long before its first poll (1 s).
    let after = answered.saturating_duration_since(waiting_since);
    eprintln!("answered {after:?} after it began to wait");
    assert!(
        after < Duration::from_millis(850),
        "answered {after:?} after it began to wait: by polling, not by the feed"
    );
}
