//! Redis under Sentinel, on a setup of the test's own (a master, one replica, three
//! sentinels): the store connected through the sentinels follows a failover (C13), and
//! C14's failover loss is bounded; a completion can wait for a replica's acknowledgement.

mod support;

use idem_core::{Failure, Idempotency, Outcome, Policy, StoredResponse};
use idem_redis::redis;
use idem_redis::RedisStore;
use std::time::{Duration, Instant};
use support::keepalive::every_connection_probed;
use support::load::{Load, Seen};
use support::private_sentinel::{PrivateSentinel, MASTER_NAME};
use support::under_load::{
    engine, one_at_a_time, runtime, store_settings, CLIENTS, DEADLINE, LEASE, MARGIN,
    STORE_TIMEOUTS,
};

/// How long before the kill a record may have been written and still be lost with the
/// master: what the replica had not received (on loopback, milliseconds; far less than this).
const UNREPLICATED: Duration = Duration::from_secs(1);

/// How long the clients go on once the sentinels promoted the replica.
const AFTER: Duration = Duration::from_secs(4);

/// What a failover under load saw.
struct Failover {
    seen: Seen,
    /// When records the failover may lose were written: from [`UNREPLICATED`] before the
    /// fault began until the old master stopped taking writes (killed, or demoted).
    lossy: (Instant, Instant),
    /// When a sentinel first named the replica as the master.
    promoted: Instant,
}

/// When a fault began, when the old master stopped taking writes, when the replica was
/// promoted.
struct Fault {
    began: Instant,
    last_write: Instant,
    promoted: Instant,
}

impl Failover {
    /// When the store answered again: the first answer after the promotion.
    fn answered_again(&self) -> Option<Instant> {
        self.seen
            .answers
            .iter()
            .filter(|at| **at > self.promoted)
            .min()
            .copied()
    }

    /// Keys whose handler ran more than once that C14 does not explain: one first run outside
    /// the lossy window (a record written on the promoted master is never lost: there is no
    /// second failover), or run three times.
    fn unexplained(&self) -> Vec<String> {
        let (from, until) = self.lossy;
        self.seen
            .duplicates()
            .into_iter()
            .filter(|(key, runs)| {
                let first = self.seen.first_run.get(*key).copied();
                **runs > 2 || first.is_none_or(|at| at < from || at > until)
            })
            .map(|(key, runs)| format!("{key} ran {runs} times"))
            .collect()
    }

    fn summary(&self) -> String {
        let last_lost = self
            .seen
            .duplicates()
            .iter()
            .filter_map(|(key, _)| self.seen.first_run.get(*key))
            .max()
            .map(|at| at.saturating_duration_since(self.lossy.0 + UNREPLICATED));
        format!(
            "{}; promoted {:?} after the fault began, answered again {:?} after the promotion; \
             the last key run twice first ran {last_lost:?} after the fault began",
            self.seen.summary(self.promoted),
            self.promoted.duration_since(self.lossy.0 + UNREPLICATED),
            self.answered_again()
                .map(|at| at.duration_since(self.promoted)),
        )
    }

    /// Checks what C13 and C14 promise; see the tests.
    fn check(&self, name: &str) {
        let summary = self.summary();
        println!("{name}: {summary}");
        let seen = &self.seen;
        assert_eq!(seen.hangs, 0, "{name}: calls hung: {summary}");
        assert!(
            seen.slowest_refusal <= DEADLINE + MARGIN,
            "{name}: a 503 took {:?}, past its deadline {DEADLINE:?}: {summary}",
            seen.slowest_refusal
        );
        // An execution whose completion cannot be written keeps its caller for the lease (C8).
        assert!(
            seen.slowest <= DEADLINE + LEASE + MARGIN,
            "{name}: a call took {:?}, past its reservation's deadline and its lease: {summary}",
            seen.slowest
        );
        assert!(
            !seen.errors.is_empty(),
            "{name}: the failover was never seen by a call: {summary}"
        );
        assert!(
            seen.unanswered.is_empty(),
            "{name}: keys never answered: {:?}",
            seen.unanswered
        );
        let recovery = seen.recovery_after(self.promoted);
        assert!(
            recovery <= 2 * DEADLINE,
            "{name}: the store went on failing {recovery:?} after the promotion: {summary}"
        );
        assert!(
            self.answered_again()
                .is_some_and(|at| at.duration_since(self.promoted) <= 2 * DEADLINE),
            "{name}: the store did not answer within {:?} of the promotion: {summary}",
            2 * DEADLINE
        );
        let unexplained = self.unexplained();
        assert!(
            unexplained.is_empty(),
            "{name}: effects ran again beyond C14's failover loss: {unexplained:?}: {summary}"
        );
        assert!(
            seen.duplicates().len() <= CLIENTS.tasks,
            "{name}: more keys ran twice than there were clients: {summary}"
        );
    }
}

/// Runs 64 retrying clients through the engine on a store connected through the sentinels
/// of a setup of the test's own, injects `fault` on a blocking thread once they are going,
/// lets them go on for [`AFTER`] and returns what they saw.
fn under_failover(fault: impl FnOnce(&mut PrivateSentinel) -> Fault + Send + 'static) -> Failover {
    let _one = one_at_a_time();
    let setup = PrivateSentinel::start();
    runtime().block_on(async move {
        let urls = setup.urls();
        let sentinels: Vec<&str> = urls.iter().map(String::as_str).collect();
        let store = store_settings()
            .connect_sentinel(&sentinels, MASTER_NAME)
            .await
            .expect("connect through the sentinels");
        let idem = engine(store);
        let load = Load::start(&idem, "sentinel", CLIENTS);
        tokio::time::sleep(Duration::from_secs(1)).await;
        let (setup, fault) = tokio::task::spawn_blocking(move || {
            let mut setup = setup;
            let fault = fault(&mut setup);
            (setup, fault)
        })
        .await
        .expect("the failover");
        tokio::time::sleep(AFTER).await;
        let seen = load.stop(&idem).await;
        drop(setup);
        Failover {
            seen,
            lossy: (fault.began - UNREPLICATED, fault.last_write),
            promoted: fault.promoted,
        }
    })
}

/// C13 and C14: 64 retrying clients through the engine on a store connected through three
/// sentinels; the master is killed (`kill -9`) and never comes back. Every call is answered
/// or is a 503 within its deadline (one whose effect ran: within the lease, C8); once the
/// sentinels have promoted the replica the same store answers again within two deadlines,
/// by itself; a key's effect runs twice only where C14 allows it, a record the old master
/// had not yet sent to the replica (written within [`UNREPLICATED`] before the kill), at
/// most once more, and at most one key per client.
#[test]
fn c13_c14_a_master_killed_under_sentinel_and_the_store_follows_the_promotion() {
    under_failover(|setup| {
        let killed = setup.kill_master();
        Fault {
            began: killed,
            last_write: killed,
            promoted: setup.wait_promoted(Duration::from_secs(30)),
        }
    })
    .check("killed master");
}

/// C13 and C14: the same load through a `SENTINEL FAILOVER`: the master, still running,
/// takes writes until the sentinels demote it to a replica of the promoted one (seconds
/// later), which drops them. The store must not wait for that: it asks the sentinels every
/// second and moves to the new master once they name it, so only a record written before two
/// deadlines after the promotion (or the demotion, if sooner) can be lost and its effect run
/// again (C14).
#[test]
fn c13_c14_a_master_demoted_by_sentinel_and_the_store_follows_the_promotion() {
    under_failover(|setup| {
        let asked = setup.fail_over();
        let promoted = setup.wait_promoted(Duration::from_secs(30));
        let demoted = setup.wait_demoted(Duration::from_secs(30));
        Fault {
            began: asked,
            last_write: demoted.min(promoted + 2 * DEADLINE),
            promoted,
        }
    })
    .check("demoted master");
}

/// The completion's `WAIT`: with the replica up, a completion is answered at once, and the
/// replica holds it when the caller hears of it; with the replica stopped (`SIGSTOP`), the
/// completion waits the whole `WAIT` for its acknowledgement, then counts anyway (logged).
/// And a store under Sentinel has TCP keepalive on its connections.
#[test]
fn c14_a_completion_waits_for_a_replica_when_asked() {
    const WITHIN: Duration = Duration::from_millis(400);
    let _one = one_at_a_time();
    let setup = PrivateSentinel::start();
    runtime().block_on(async {
        let urls = setup.urls();
        let sentinels: Vec<&str> = urls.iter().map(String::as_str).collect();
        let store = RedisStore::builder()
            .prefix(&format!("t{}", idem_core::FencingToken::generate()))
            .response_timeout(Duration::from_secs(1))
            .connection_timeout(STORE_TIMEOUTS)
            .wait_for_replica(Some(WITHIN))
            .connect_sentinel(&sentinels, MASTER_NAME)
            .await
            .expect("connect through the sentinels");
        let policy = Policy::default().store_timeout(Duration::from_secs(3));
        let idem = Idempotency::with_policy(store.clone(), policy).expect("a valid policy");
        let replica = redis::Client::open(format!("redis://127.0.0.1:{}", setup.replica_port()))
            .expect("a client");
        let mut replica = replica
            .get_multiplexed_async_connection()
            .await
            .expect("the replica");
        let run = |key: &'static str| {
            let idem = idem.clone();
            async move {
                let request = idem
                    .request("wait", "POST", "/v1/notifications")
                    .key(Some(key))
                    .body(b"{}")
                    .build()
                    .expect("a valid request");
                let asked = Instant::now();
                let outcome = idem
                    .run(&request, |_| async {
                        Ok::<_, Failure<std::io::Error>>(StoredResponse::new(201, "sent"))
                    })
                    .await
                    .expect("executed");
                assert!(matches!(outcome, Outcome::Executed(_)), "{outcome:?}");
                (store_key(&idem, &request), asked.elapsed())
            }
        };

        let (key, took) = run("acknowledged").await;
        let state: Option<String> = redis::cmd("HGET")
            .arg(&key)
            .arg("st")
            .query_async(&mut replica)
            .await
            .expect("HGET on the replica");
        assert_eq!(
            state.as_deref(),
            Some("1"),
            "the replica holds the completion"
        );
        assert!(took < WITHIN, "a replica acknowledged: no wait, {took:?}");

        let stopped = setup.stop_replica_for(2.0);
        let (_, took) = run("unacknowledged").await;
        assert!(
            took >= WITHIN,
            "no replica acknowledged: the completion waited {WITHIN:?}, took {took:?}"
        );
        assert!(took < WITHIN + Duration::from_secs(1) + MARGIN, "{took:?}");
        tokio::task::spawn_blocking(move || stopped.join())
            .await
            .expect("joined")
            .expect("the replica continued");

        // C13: the store's connections, to the master and to the sentinel it asks every
        // second, have TCP keepalive (the test's own to the replica has none).
        let mut ports = vec![setup.master_port()];
        ports.extend_from_slice(setup.sentinel_ports());
        let found = tokio::task::spawn_blocking(move || every_connection_probed(&ports))
            .await
            .expect("the socket table");
        assert!(found >= 2, "the master's and a sentinel's: {found}");
        drop(store);
    });
}

/// The Redis key of `request`'s record.
fn store_key(idem: &Idempotency<RedisStore>, request: &idem_core::Request) -> String {
    idem.store().key_of(request.id())
}
