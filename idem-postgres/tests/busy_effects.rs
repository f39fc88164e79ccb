//! A one-commit reservation that found every effect connection taken, and looks for a
//! duplicate's answer beside them (C5, C15): what its look costs everyone else.

mod common;
mod support;

use common::{business_table, charges, insert_charge, pg_url, SCHEMA};
use idem_core::store::Transactional;
use idem_core::{FencingToken, Idempotency, Outcome, Request, RunError, StoredResponse};
use idem_postgres::sqlx;
use idem_postgres::{PgIdempotency, PgStore};
use std::time::{Duration, Instant};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

type Held = JoinHandle<Result<Outcome, RunError<sqlx::Error>>>;

fn request(idem: &Idempotency<PgStore>, key: &str) -> Request {
    idem.request("acct_busy", "POST", "/charges")
        .key(Some(key))
        .body(b"{}")
        .build()
        .expect("request")
        .with_one_commit(true)
}

/// A one-commit execution of `key` whose effect holds its transaction until `go` is sent.
async fn hold(idem: &Idempotency<PgStore>, key: &str) -> (Held, oneshot::Sender<()>) {
    common::hold(idem, request(idem, key), key.to_owned()).await
}

/// A store on `table` with `connections` of its own (and as many for effects), the table
/// migrated and the business table made.
async fn on_table(table: &str, connections: u32) -> PgStore {
    let store = PgStore::builder()
        .schema(SCHEMA)
        .table(table)
        .max_connections(connections)
        .connect(&pg_url())
        .await
        .expect("connect");
    store.migrate().await.expect("migrate");
    business_table(store.pool()).await;
    store
}

/// A reader on `here` of `key`, held by a long execution elsewhere: it holds one of the
/// store's own connections until that execution ends.
fn reading(
    here: &PgStore,
    idem: &Idempotency<PgStore>,
    key: &str,
) -> JoinHandle<Result<Option<idem_core::store::Record>, idem_core::Error>> {
    let id = request(idem, key).id().clone();
    let here = here.clone();
    tokio::spawn(async move { here.settled(&id, Duration::from_secs(10)).await })
}

/// C5, C15: a reservation looking beside busy effects holds no turn for a connection while
/// its look waits (here for the store's one connection of its own, which a reader of another
/// key holds): once the effect gives its connection back, a fresh key gets it at once, not
/// when a look it never asked for ends, on the store's own transaction connections and on
/// the application's pool alike, where the application's own queries get it at once too.
/// (The look ran with the connection's turn kept queued: the connection was handed to that
/// turn, which nobody polled until the look ended.)
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn c05_a_look_beside_busy_effects_holds_no_turn_for_a_connection() {
    for on_pool in [false, true] {
        let table = format!("busy_{}", FencingToken::generate());
        let builder = PgStore::builder()
            .schema(SCHEMA)
            .table(&table)
            .max_connections(1);
        let here = if on_pool {
            let pool = sqlx::postgres::PgPoolOptions::new()
                .max_connections(1)
                .test_before_acquire(false)
                .connect(&pg_url())
                .await
                .expect("pool");
            builder.pool(pool).expect("a store on the pool")
        } else {
            builder.connect(&pg_url()).await.expect("connect")
        };
        here.migrate().await.expect("migrate");
        business_table(here.pool()).await;
        let policy = idem_core::Policy::default().store_timeout(Duration::from_secs(5));
        let idem = Idempotency::with_policy(here.clone(), policy).expect("policy");
        // Another process on the same table.
        let there = on_table(&table, 2).await;
        let other = Idempotency::new(there);

        // There, a long execution of a key; here, a reader of it holds the store's one
        // connection of its own until it ends.
        let (far, far_go) = hold(&other, &format!("far-{table}")).await;
        let reader = reading(&here, &idem, &format!("far-{table}"));
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert!(!reader.is_finished(), "the reader waits for the far key");

        // Here, a long execution holds the one connection for effects; a fresh key waits for
        // it, and looks meanwhile (on the store's connection the reader holds).
        let (near, near_go) = hold(&idem, &format!("near-{table}")).await;
        let looking = tokio::spawn({
            let (idem, key) = (idem.clone(), format!("looking-{table}"));
            async move { insert_charge_once(&idem, &key).await }
        });
        tokio::time::sleep(Duration::from_millis(200)).await;

        near_go.send(()).expect("the effect waits");
        let near = near.await.expect("near");
        assert!(matches!(near, Ok(Outcome::Executed(_))), "{near:?}");
        // Its connection given back.
        tokio::time::sleep(Duration::from_millis(100)).await;
        let asked = Instant::now();
        let own = if on_pool {
            let own = tokio::time::timeout(
                Duration::from_secs(2),
                sqlx::query("SELECT 1").execute(here.pool()),
            )
            .await;
            let own = Some((own.map(|done| done.is_ok()), asked.elapsed()));
            // Its connection back in the pool.
            tokio::time::sleep(Duration::from_millis(100)).await;
            own
        } else {
            None
        };
        let asked = Instant::now();
        let fresh = tokio::time::timeout(
            Duration::from_secs(2),
            insert_charge_once(&idem, &format!("fresh-{table}")),
        )
        .await;
        let waited = asked.elapsed();

        far_go.send(()).expect("the effect waits");
        let far = far.await.expect("far");
        assert!(matches!(far, Ok(Outcome::Executed(_))), "{far:?}");
        let _ = reader.await.expect("the reader");
        let looking = looking.await.expect("the looking key");
        assert!(matches!(looking, Ok(Outcome::Executed(_))), "{looking:?}");
        if let Some((own, waited)) = own {
            assert!(
                matches!(own, Ok(true)) && waited < Duration::from_millis(500),
                "on the pool: the application's query waited {waited:?}: {own:?}"
            );
        }
        assert!(
            matches!(fresh, Ok(Ok(Outcome::Executed(_)))) && waited < Duration::from_millis(500),
            "on the pool: {on_pool}: a fresh key waited {waited:?}: {fresh:?}"
        );
        assert_eq!(charges(here.pool(), &format!("fresh-{table}")).await, 1);
    }
}

async fn insert_charge_once(
    idem: &Idempotency<PgStore>,
    key: &str,
) -> Result<Outcome, RunError<sqlx::Error>> {
    let intent = key.to_owned();
    idem.run_in_transaction(&request(idem, key), move |tx, _| insert_charge(tx, intent))
        .await
}

/// C5, C13: under a store budget of a few milliseconds, a duplicate of a key another process
/// executes, arriving while every effect connection of its store is held, is still answered
/// in flight: its look gets the budget, not what a wait for a connection left of it. (It
/// waited half the budget first, and the look, cut off at the rest, turned about half of
/// the duplicates into store-down errors at 3 ms, none before.)
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn c05_a_duplicate_beside_busy_effects_is_in_flight_under_a_short_budget() {
    let table = format!("busy_{}", FencingToken::generate());
    let here = on_table(&table, 2).await;
    let there = on_table(&table, 2).await;
    let other = Idempotency::new(there);
    // The key, executed there; here, long effects hold both connections for effects.
    let idem = Idempotency::new(here.clone());
    let mut held = vec![hold(&other, &format!("held-{table}")).await];
    for n in 0..2 {
        held.push(hold(&idem, &format!("busy-{n}-{table}")).await);
    }
    let policy = idem_core::Policy::default().store_timeout(Duration::from_millis(3));
    let short = Idempotency::with_policy(here.clone(), policy).expect("policy");
    let duplicate = request(&short, &format!("held-{table}"));
    let mut answers = Vec::new();
    for _ in 0..200 {
        let answer = short
            .run_in_transaction(&duplicate, move |_, _| {
                Box::pin(async move { Ok::<_, sqlx::Error>(StoredResponse::new(201, "never")) })
            })
            .await;
        if !matches!(
            answer,
            Ok(Outcome::Answered(idem_core::Answer::InFlight { .. }))
        ) {
            answers.push(format!("{answer:?}"));
        }
    }
    for (holder, go) in held {
        go.send(()).expect("the effect waits");
        let end = holder.await.expect("a holder");
        assert!(matches!(end, Ok(Outcome::Executed(_))), "{end:?}");
    }
    // A loaded machine may miss 3 ms now and then; a wait that halves the budget misses often.
    assert!(
        answers.len() <= 20,
        "{} of 200 duplicates not in flight: {:?}",
        answers.len(),
        answers.first()
    );
}

/// C13, C15: a look dropped because a connection for its transaction came first (the race
/// it runs by design, under load every few milliseconds) is no fault of its host: it never
/// has the host checked (a new connection each time, and, if that one is slow or refused
/// while the server is loaded, a move to the next host). 64 fresh keys at a time on two
/// connections, eight times, on a store given two hosts (the server, through two proxies).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn c13_a_look_dropped_for_a_connection_never_checks_its_host() {
    use idem_core::Store;
    let url = pg_url();
    let (first, _) = support::proxied(&url).await;
    let (second, _) = support::proxied(&url).await;
    let both = format!("{},{}", first.addr(), second.addr());
    let through = support::pg_url::with_authority(&url, &both);
    let table = format!("busy_{}", FencingToken::generate());
    let store = PgStore::builder()
        .schema(SCHEMA)
        .table(&table)
        .max_connections(2)
        .acquire_timeout(Duration::from_secs(2))
        .connect(&through)
        .await
        .expect("connect");
    store.migrate().await.expect("migrate");
    business_table(store.pool()).await;
    let policy = idem_core::Policy::default().store_timeout(Duration::from_secs(10));
    let idem = Idempotency::with_policy(store.clone(), policy).expect("policy");
    for n in 0..4 {
        let warm = insert_charge_once(&idem, &format!("warm-{n}-{table}")).await;
        assert!(matches!(warm, Ok(Outcome::Executed(_))), "{warm:?}");
    }
    tokio::time::sleep(Duration::from_millis(1_200)).await;
    let accepted = || first.connections() + second.connections();
    let (accepted_before, opened_before) = (accepted(), store.generation().unwrap_or(0));

    for round in 0..8 {
        let calls: Vec<_> = (0..64)
            .map(|n| {
                let idem = idem.clone();
                let intent = format!("load-{round}-{n}-{table}");
                tokio::spawn(async move {
                    let request = request(&idem, &intent);
                    idem.run_in_transaction(&request, move |tx, _| {
                        Box::pin(async move {
                            sqlx::query(
                                "INSERT INTO idem_test.charges (intent) \
                                 SELECT $1 FROM pg_sleep(0.005)",
                            )
                            .bind(intent)
                            .execute(&mut *tx)
                            .await?;
                            Ok::<_, sqlx::Error>(StoredResponse::new(201, "charged"))
                        })
                    })
                    .await
                })
            })
            .collect();
        for call in calls {
            let end = call.await.expect("a call");
            assert!(matches!(end, Ok(Outcome::Executed(_))), "{end:?}");
        }
    }
    // A check runs in a task of its own.
    tokio::time::sleep(Duration::from_millis(1_200)).await;
    let accepted = (accepted() - accepted_before) as u64;
    let opened = store.generation().unwrap_or(0) - opened_before;
    assert_eq!(
        accepted.saturating_sub(opened),
        0,
        "{accepted} connections reached the hosts, {opened} of them the store's own: \
         the rest checked a host no statement was cut off on"
    );
}

/// The operations of the `BudgetSpent` events a request's engine emits.
#[derive(Default)]
struct Spent(std::sync::Mutex<Vec<String>>);

impl idem_core::Observer for Spent {
    fn observe(&self, event: &idem_core::Event<'_>) {
        if event.kind() == idem_core::EventKind::BudgetSpent {
            let operation = event.operation().map_or("unknown", |o| o.name());
            self.0
                .lock()
                .expect("not poisoned")
                .push(operation.to_owned());
        }
    }
}

/// C13: a look beside busy effects that spends the rest of the budget (here waiting for the
/// store's one connection of its own, which a reader of another key holds) ends the request:
/// one `BudgetSpent`, for the look, never a second one for a wait for a connection started
/// with nothing left (`idem_store_budget_spent_total` counts requests).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn c13_a_look_that_spends_the_budget_is_reported_once() {
    let table = format!("busy_{}", FencingToken::generate());
    let here = on_table(&table, 1).await;
    let idem = Idempotency::new(here.clone());
    let there = on_table(&table, 2).await;
    let other = Idempotency::new(there);
    let (far, far_go) = hold(&other, &format!("far-{table}")).await;
    let reader = reading(&here, &idem, &format!("far-{table}"));
    tokio::time::sleep(Duration::from_millis(200)).await;
    let (near, near_go) = hold(&idem, &format!("near-{table}")).await;

    let spent = std::sync::Arc::new(Spent::default());
    let short = Idempotency::builder(here.clone())
        .policy(idem_core::Policy::default().store_timeout(Duration::from_millis(300)))
        .observer(std::sync::Arc::clone(&spent))
        .build()
        .expect("policy");
    let answer = insert_charge_once(&short, &format!("fresh-{table}")).await;
    let spent = spent.0.lock().expect("not poisoned").clone();

    near_go.send(()).expect("the effect waits");
    far_go.send(()).expect("the effect waits");
    let near = near.await.expect("near");
    assert!(matches!(near, Ok(Outcome::Executed(_))), "{near:?}");
    let far = far.await.expect("far");
    assert!(matches!(far, Ok(Outcome::Executed(_))), "{far:?}");
    let _ = reader.await.expect("the reader");
    assert!(answer.is_err(), "{answer:?}");
    assert_eq!(
        spent.len(),
        1,
        "budget spent reported {spent:?}: {answer:?}"
    );
}
