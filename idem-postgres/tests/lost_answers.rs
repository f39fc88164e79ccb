//! Answers lost on the wire: the store's connection drops after PostgreSQL committed a write and
//! before its answer reached the store. A fault proxy between the store and the server loses the
//! answer for real; the store's retry on a fresh connection must recognise what it wrote.

mod common;
mod support;

use common::{pg_url, SCHEMA};
use fault_proxy::{FaultProxy, LoseAnswer};
use idem_core::store::Deadline;
use idem_core::store::{Acquire, StoreExt};
use idem_core::{Answer, Begin, Error, FencingToken, Idempotency, Request, Store, StoredResponse};
use idem_postgres::sqlx::{self, AssertSqlSafe, Connection, PgConnection, Row};
use idem_postgres::{PgStore, StatementMode};
use std::time::Duration;

const LEASE: Duration = Duration::from_secs(30);

/// A store on a new table, through a new fault proxy, with one connection: after `connect`
/// it waits in the store's stack, so the next call runs on a reused connection (the one whose
/// failure the store retries on a fresh connection).
async fn store_through_proxy(mode: StatementMode) -> (FaultProxy, PgStore) {
    let (proxy, url) = support::proxied(&pg_url()).await;
    let store = PgStore::builder()
        .schema(SCHEMA)
        .table(&format!("t_{}", FencingToken::generate()))
        .statements(mode)
        .max_connections(1)
        .connect(&url)
        .await
        .expect("connect through the proxy");
    store.migrate().await.expect("migrate");
    (proxy, store)
}

fn request(idem: &Idempotency<PgStore>, key: &str) -> Request {
    idem.request("acct", "POST", "/charges")
        .key(Some(key))
        .body(b"{\"cents\":2500}")
        .build()
        .expect("request")
}

/// Every row of the store's table as (token, state, deadline in ms), read on a connection of
/// its own straight to the server.
async fn rows(store: &PgStore) -> Vec<(FencingToken, i16, i64)> {
    let mut conn = PgConnection::connect(&pg_url()).await.expect("connect");
    let query = format!(
        "SELECT token, state, floor(extract(epoch FROM deadline) * 1000)::bigint FROM {}",
        store.table()
    );
    let rows = sqlx::raw_sql(AssertSqlSafe(query))
        .fetch_all(&mut conn)
        .await
        .expect("select");
    rows.iter()
        .map(|row| {
            let token: Vec<u8> = row.try_get(0).expect("token");
            (
                FencingToken::from_slice(&token).expect("a token"),
                row.try_get(1).expect("state"),
                row.try_get(2).expect("deadline"),
            )
        })
        .collect()
}

/// How `bytes`, a parameter of one of the store's statements, travel in `mode`: raw in a
/// prepared statement's Bind message, as hex in the text of a simple query.
fn on_the_wire(mode: StatementMode, bytes: &[u8]) -> Vec<u8> {
    match mode {
        StatementMode::Simple => bytes
            .iter()
            .flat_map(|b| format!("{b:02x}").into_bytes())
            .collect(),
        _ => bytes.to_vec(),
    }
}

/// What a lost answer must leave: the call acquired, exactly one record, carrying the lease's
/// token, in progress until the lease's deadline; a duplicate is in flight; the lease completes
/// and is replayed.
async fn assert_recognised(
    idem: &Idempotency<PgStore>,
    req: &Request,
    begun: Result<Begin, Error>,
    acquired: Acquire,
    mode: StatementMode,
) {
    let store = idem.store();
    let lease = match begun {
        Ok(Begin::Acquired(lease)) => lease,
        other => panic!("{mode:?}: the reservation whose answer was lost got {other:?}"),
    };
    assert_eq!(lease.acquired(), acquired, "{mode:?}: how it was acquired");
    let found = rows(store).await;
    assert_eq!(
        found,
        vec![(
            lease.token(),
            0,
            i64::try_from(lease.lease_until().as_millis()).expect("a deadline")
        )],
        "{mode:?}: one record, in progress, carrying the lease"
    );
    let duplicate = store
        .reservation(req, LEASE, Deadline::default())
        .await
        .expect("duplicate");
    assert!(
        matches!(duplicate, Begin::Answered(Answer::InFlight { .. })),
        "{mode:?}: another caller is answered in flight, got {duplicate:?}"
    );
    store
        .complete(
            &idem.completion(&lease, StoredResponse::new(201, "charged")),
            Deadline::default(),
        )
        .await
        .expect("the recognised lease completes");
    let replay = store
        .reservation(req, LEASE, Deadline::default())
        .await
        .expect("replay");
    assert!(
        matches!(&replay, Begin::Answered(Answer::Replay(r)) if r.body == b"charged"),
        "{mode:?}: replayed, got {replay:?}"
    );
}

/// C4: the INSERT of a fresh reservation commits and its answer is lost; the retry on a fresh
/// connection finds the record it wrote and acquires it, instead of answering in flight for a
/// whole lease while nothing runs.
#[tokio::test]
async fn c04_a_reservation_whose_answer_was_lost_is_recognised() {
    for mode in [StatementMode::Prepared, StatementMode::Simple] {
        let (proxy, store) = store_through_proxy(mode).await;
        let idem = Idempotency::new(store.clone());
        let key = format!("lost-{}", FencingToken::generate());
        let req = request(&idem, &key);
        // The key is a parameter of the reservation: in its Bind message, or its query text.
        proxy.set(LoseAnswer::to(key.as_bytes()));
        let connections = proxy.connections();
        let begun = store.reservation(&req, LEASE, Deadline::default()).await;
        assert_eq!(proxy.answers_lost(), 1, "{mode:?}: the answer was lost");
        assert_eq!(
            proxy.connections(),
            connections + 1,
            "{mode:?}: the store retried on one fresh connection"
        );
        assert_recognised(&idem, &req, begun, Acquire::FRESH, mode).await;
    }
}

/// C9: the compare-and-set of a takeover commits and its answer is lost; the retry finds the
/// record it took over and holds it, with the takeover's kind; the orphan's holder stays fenced
/// out.
#[tokio::test]
async fn c09_a_takeover_whose_answer_was_lost_is_recognised() {
    for mode in [StatementMode::Prepared, StatementMode::Simple] {
        let (proxy, store) = store_through_proxy(mode).await;
        let idem = Idempotency::new(store.clone());
        let req = request(&idem, &format!("orphan-{}", FencingToken::generate()));
        let Begin::Acquired(orphan) = store
            .reservation(&req, Duration::from_millis(50), Deadline::default())
            .await
            .expect("reserve")
        else {
            panic!("{mode:?}: fresh");
        };
        tokio::time::sleep(Duration::from_millis(200)).await;
        // Only the takeover's compare-and-set carries the orphan's token.
        proxy.set(LoseAnswer::to(on_the_wire(mode, orphan.token().as_bytes())));
        let begun = store.reservation(&req, LEASE, Deadline::default()).await;
        assert_eq!(proxy.answers_lost(), 1, "{mode:?}: the answer was lost");
        let late = store
            .complete(
                &idem.completion(&orphan, StoredResponse::new(201, "late")),
                Deadline::default(),
            )
            .await;
        assert!(
            matches!(late, Err(Error::LeaseLost)),
            "{mode:?}: the orphan's holder is fenced out, got {late:?}"
        );
        assert_recognised(&idem, &req, begun, Acquire::take_over(orphan.token()), mode).await;
    }
}
