//! Round trips per path, counted on the wire: a loopback proxy between the store and the server
//! counts the messages that end a client's turn (`Sync` of the extended protocol, `Query` of the
//! simple one). Each is one round trip. The counts are what docs/stores.md states: one per
//! answer (the reservation statement; with `read_first(true)` a plain read), and a fresh key on
//! the money path (`run_in_transaction`) five: the reservation, then BEGIN, the effect's
//! statement, the completion and COMMIT on the store's own connection, with no ping of a pool
//! around them, and with `read_first(true)` the read before them. In one commit (one-commit `run_in_transaction`, C15) a fresh
//! key is five as well (BEGIN, the reservation, the effect's statement, the completion, COMMIT)
//! and an answer three (BEGIN, the reservation, ROLLBACK). An engine expecting fresh keys
//! (nearly all its recent reservations were) reserves a fresh key with the insert alone, one
//! round trip, and answers in two (four in one commit).

mod common;

use common::{pg_url, select_one, SCHEMA};
use idem_core::{Answer, Begin, Idempotency, Outcome, Policy, RunError, StoredResponse};
use idem_postgres::PgIdempotency;
use idem_postgres::{Isolation, PgStore, StatementMode};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// A proxy to `upstream` that counts the client's round trips.
async fn counting_proxy(upstream: String) -> (u16, Arc<AtomicUsize>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let port = listener.local_addr().expect("addr").port();
    let turns = Arc::new(AtomicUsize::new(0));
    let counter = Arc::clone(&turns);
    tokio::spawn(async move {
        while let Ok((client, _)) = listener.accept().await {
            let server = TcpStream::connect(&upstream).await.expect("upstream");
            let (mut client_read, mut client_write) = client.into_split();
            let (mut server_read, mut server_write) = server.into_split();
            tokio::spawn(async move {
                let _ = tokio::io::copy(&mut server_read, &mut client_write).await;
            });
            let counter = Arc::clone(&counter);
            tokio::spawn(async move {
                // Untyped messages first (SSLRequest, then the startup message), typed after.
                let mut typed = false;
                loop {
                    let mut tag = [0u8; 1];
                    if typed && client_read.read_exact(&mut tag).await.is_err() {
                        return;
                    }
                    let mut len = [0u8; 4];
                    if client_read.read_exact(&mut len).await.is_err() {
                        return;
                    }
                    let body_len = (u32::from_be_bytes(len) as usize).saturating_sub(4);
                    let mut body = vec![0u8; body_len];
                    if client_read.read_exact(&mut body).await.is_err() {
                        return;
                    }
                    let mut frame = Vec::with_capacity(5 + body_len);
                    if typed {
                        frame.push(tag[0]);
                        if matches!(tag[0], b'S' | b'Q') {
                            counter.fetch_add(1, Ordering::SeqCst);
                        }
                    } else if body.get(..4) != Some(&80_877_103u32.to_be_bytes()[..]) {
                        typed = true; // the startup message; an SSLRequest stays untyped
                    }
                    frame.extend_from_slice(&len);
                    frame.extend_from_slice(&body);
                    if server_write.write_all(&frame).await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    (port, turns)
}

async fn measured<T>(turns: &AtomicUsize, op: impl std::future::Future<Output = T>) -> (T, usize) {
    let before = turns.load(Ordering::SeqCst);
    let value = op.await;
    (value, turns.load(Ordering::SeqCst) - before)
}

/// A store on a new table, its one connection through a counting proxy: the store and the
/// proxy's count of round trips.
async fn proxied_store(
    mode: StatementMode,
    builder: impl FnOnce(idem_postgres::PgStoreBuilder) -> idem_postgres::PgStoreBuilder,
) -> (PgStore, Arc<AtomicUsize>) {
    let upstream = pg_url()
        .rsplit('@')
        .next()
        .and_then(|rest| rest.split('/').next())
        .expect("host:port in IDEM_PG_URL")
        .to_owned();
    let (port, turns) = counting_proxy(upstream).await;
    let store = builder(
        PgStore::builder()
            .schema(SCHEMA)
            .table(&format!("rt_{}", idem_core::FencingToken::generate()))
            .statements(mode)
            .max_connections(1),
    )
    .connect(&format!(
        "postgres://idem@127.0.0.1:{port}/postgres?sslmode=disable"
    ))
    .await
    .expect("connect through the proxy");
    store.migrate().await.expect("migrate");
    (store, turns)
}

async fn count_paths(mode: StatementMode, read_first: bool) {
    let (store, turns) = proxied_store(mode, |b| b.read_first(read_first)).await;
    let idem = Idempotency::with_policy(
        store.clone(),
        Policy::default().lease(Duration::from_millis(300)),
    )
    .expect("policy");
    let req = |key: &str, body: &[u8]| {
        idem.request("acct", "POST", "/charges")
            .key(Some(key))
            .body(body)
            .build()
            .expect("request")
    };
    // Warm the connection: every statement prepared once (a first use costs one more turn).
    for round in 0..2 {
        let warm = req(&format!("warm-{round}"), b"{}");
        if let Ok(Begin::Acquired(mut lease)) = idem.begin(&warm).await {
            idem.renew(&mut lease).await.expect("renew");
            let again = req(&format!("warm-{round}"), b"{}");
            let _ = idem.begin(&again).await;
            let mut tx = store.pool().begin().await.expect("tx");
            store
                .complete_in(
                    &mut tx,
                    &idem.completion(&lease, StoredResponse::new(201, "ok")),
                )
                .await
                .expect("complete");
            tx.commit().await.expect("commit");
            let _ = idem.begin(&again).await;
            let _ = idem.begin(&req(&format!("warm-{round}"), b"other")).await;
        }
        let orphan = req(&format!("warm-orphan-{round}"), b"{}");
        if let Ok(Begin::Acquired(lease)) = idem.begin(&orphan).await {
            idem.release(lease).await.expect("release");
        }
        let taken = req(&format!("warm-taken-{round}"), b"{}");
        let _ = idem.begin(&taken).await;
        tokio::time::sleep(Duration::from_millis(350)).await;
        let _ = idem.begin(&taken).await;
    }

    let fresh = req("fresh", b"{}");
    let (begun, fresh_turns) = measured(&turns, idem.begin(&fresh)).await;
    let Ok(Begin::Acquired(lease)) = begun else {
        panic!("fresh: {begun:?}")
    };
    let (answer, in_flight_turns) = measured(&turns, idem.begin(&fresh)).await;
    assert!(matches!(
        answer,
        Ok(Begin::Answered(Answer::InFlight { .. }))
    ));

    let mut tx = store.pool().begin().await.expect("tx");
    let completion = idem.completion(&lease, StoredResponse::new(201, "charged"));
    let (done, complete_turns) = measured(&turns, store.complete_in(&mut tx, &completion)).await;
    done.expect("complete_in");
    tx.commit().await.expect("commit");
    // sqlx's pool (your transactions' pool, not the store's) pings the connection it gets back,
    // in the background: let that turn pass before the next measurement.
    tokio::time::sleep(Duration::from_millis(100)).await;

    let (answer, replay_turns) = measured(&turns, idem.begin(&fresh)).await;
    assert!(matches!(answer, Ok(Begin::Answered(Answer::Replay(_)))));
    let (answer, mismatch_turns) = measured(&turns, idem.begin(&req("fresh", b"other"))).await;
    assert!(matches!(answer, Ok(Begin::Answered(Answer::Mismatch))));

    let orphan = req("orphan", b"{}");
    let Ok(Begin::Acquired(_)) = idem.begin(&orphan).await else {
        panic!("orphan")
    };
    tokio::time::sleep(Duration::from_millis(350)).await;
    let (taken, takeover_turns) = measured(&turns, idem.begin(&orphan)).await;
    let Ok(Begin::Acquired(mut lease)) = taken else {
        panic!("takeover: {taken:?}")
    };
    let (renewed, renew_turns) = measured(&turns, idem.renew(&mut lease)).await;
    renewed.expect("renew");
    let (released, release_turns) = measured(&turns, idem.release(lease)).await;
    released.expect("release");

    println!(
        "{mode:?}: fresh {fresh_turns}, in flight {in_flight_turns}, replay {replay_turns}, mismatch {mismatch_turns}, complete_in {complete_turns}, takeover {takeover_turns}, renew {renew_turns}, release {release_turns}"
    );
    let read = usize::from(read_first);
    assert_eq!(
        fresh_turns,
        1 + read,
        "{mode:?}: a fresh key (a read first: {read_first})"
    );
    assert_eq!(in_flight_turns, 1, "{mode:?}: an in-flight duplicate");
    assert_eq!(replay_turns, 1, "{mode:?}: a replay");
    assert_eq!(mismatch_turns, 1, "{mode:?}: a mismatch");
    assert_eq!(
        complete_turns, 1,
        "{mode:?}: the completion in the caller's transaction"
    );
    assert_eq!(
        takeover_turns, 2,
        "{mode:?}: a takeover (read, then compare-and-set)"
    );
    assert_eq!(renew_turns, 1, "{mode:?}: a renewal");
    assert_eq!(release_turns, 1, "{mode:?}: a release");

    count_money_path(mode, &store, &turns, read).await;
}

/// The effect of the money path: one statement of its own in the transaction.
async fn charge(money: &Idempotency<PgStore>, key: &str, body: &[u8]) -> Result<Outcome, String> {
    charge_in(money, key, body, false).await
}

/// [`charge`] in one commit if `one_commit`, else two.
async fn charge_in(
    money: &Idempotency<PgStore>,
    key: &str,
    body: &[u8],
    one_commit: bool,
) -> Result<Outcome, String> {
    let request = money
        .request("acct", "POST", "/charges")
        .key(Some(key))
        .body(body)
        .build()
        .expect("request");
    match one_commit {
        true => {
            money
                .run_in_transaction(&request.clone().with_one_commit(true), select_one)
                .await
        }
        false => money.run_in_transaction(&request, select_one).await,
    }
    .map_err(|error: RunError<sqlx::Error>| error.to_string())
}

/// `run_in_transaction`: 5 round trips for a fresh key (and `read` first), 1 for each answer.
async fn count_money_path(mode: StatementMode, store: &PgStore, turns: &AtomicUsize, read: usize) {
    // The default lease: no renewal falls inside a measurement.
    let money = Idempotency::new(store.clone());
    // Warm the transaction's connection: its statements prepared once.
    for round in 0..2 {
        let warm = format!("money-warm-{round}");
        let first = charge(&money, &warm, b"{}").await;
        assert!(matches!(first, Ok(Outcome::Executed(_))), "{first:?}");
        let again = charge(&money, &warm, b"{}").await;
        assert!(matches!(again, Ok(Outcome::Answered(_))), "{again:?}");
    }
    let (fresh, fresh_turns) = measured(turns, charge(&money, "money", b"{}")).await;
    assert!(matches!(fresh, Ok(Outcome::Executed(_))), "{fresh:?}");
    let (replay, replay_turns) = measured(turns, charge(&money, "money", b"{}")).await;
    assert!(
        matches!(replay, Ok(Outcome::Answered(Answer::Replay(_)))),
        "{replay:?}"
    );
    let (mismatch, mismatch_turns) = measured(turns, charge(&money, "money", b"other")).await;
    assert!(
        matches!(mismatch, Ok(Outcome::Answered(Answer::Mismatch))),
        "{mismatch:?}"
    );
    let held = money
        .request("acct", "POST", "/charges")
        .key(Some("money-held"))
        .body(b"{}")
        .build()
        .expect("request");
    let Ok(Begin::Acquired(lease)) = money.begin(&held).await else {
        panic!("money-held is reserved")
    };
    let (in_flight, in_flight_turns) = measured(turns, charge(&money, "money-held", b"{}")).await;
    assert!(
        matches!(in_flight, Ok(Outcome::Answered(Answer::InFlight { .. }))),
        "{in_flight:?}"
    );
    money.release(lease).await.expect("release");
    println!(
        "{mode:?} run_in_transaction: fresh {fresh_turns}, replay {replay_turns}, mismatch {mismatch_turns}, in flight {in_flight_turns}"
    );
    assert_eq!(
        fresh_turns,
        5 + read,
        "{mode:?}: a fresh key ({read} read; reserve; BEGIN, effect, completion, COMMIT)"
    );
    assert_eq!(replay_turns, 1, "{mode:?}: a replay");
    assert_eq!(mismatch_turns, 1, "{mode:?}: a mismatch");
    assert_eq!(in_flight_turns, 1, "{mode:?}: an in-flight duplicate");

    count_one_commit(mode, &money, turns).await;
}

/// one-commit `run_in_transaction` (C15): a fresh key in 5 round trips (BEGIN, the reservation, the
/// effect, the completion, COMMIT: sqlx's transaction sends its BEGIN alone), an answer in 3
/// (BEGIN, the reservation, ROLLBACK); a two-commit duplicate of the key is still answered
/// in 1.
async fn count_one_commit(mode: StatementMode, money: &Idempotency<PgStore>, turns: &AtomicUsize) {
    for round in 0..2 {
        let warm = format!("once-warm-{round}");
        let first = charge_in(money, &warm, b"{}", true).await;
        assert!(matches!(first, Ok(Outcome::Executed(_))), "{first:?}");
    }
    let (fresh, fresh_turns) = measured(turns, charge_in(money, "once", b"{}", true)).await;
    assert!(matches!(fresh, Ok(Outcome::Executed(_))), "{fresh:?}");
    let (replay, replay_turns) = measured(turns, charge_in(money, "once", b"{}", true)).await;
    assert!(
        matches!(replay, Ok(Outcome::Answered(Answer::Replay(_)))),
        "{replay:?}"
    );
    let (mismatch, mismatch_turns) =
        measured(turns, charge_in(money, "once", b"other", true)).await;
    assert!(
        matches!(mismatch, Ok(Outcome::Answered(Answer::Mismatch))),
        "{mismatch:?}"
    );
    let (duplicate, duplicate_turns) = measured(turns, charge(money, "once", b"{}")).await;
    assert!(
        matches!(duplicate, Ok(Outcome::Answered(Answer::Replay(_)))),
        "{duplicate:?}"
    );
    println!(
        "{mode:?} one-commit run_in_transaction: fresh {fresh_turns}, replay {replay_turns}, mismatch {mismatch_turns}; two-commit duplicate {duplicate_turns}"
    );
    assert_eq!(
        fresh_turns, 5,
        "{mode:?}: a one-commit fresh key (BEGIN, reserve, effect, completion, COMMIT)"
    );
    assert_eq!(
        replay_turns, 3,
        "{mode:?}: a one-commit replay (BEGIN, reserve, ROLLBACK)"
    );
    assert_eq!(mismatch_turns, 3, "{mode:?}: a one-commit mismatch");
    assert_eq!(
        duplicate_turns, 1,
        "{mode:?}: a two-commit duplicate of a one-commit key"
    );
}

/// C4: an engine whose reservations were nearly all fresh keys expects one: a fresh key's
/// reservation is `insert.sql` alone, one round trip; an answer is that insert, which writes
/// nothing, then the reservation that reports the record: two, and the right answer.
async fn count_fresh_first(mode: StatementMode, isolation: Isolation) {
    let (store, turns) = proxied_store(mode, |b| b.isolation(isolation)).await;
    let idem = Idempotency::new(store.clone());
    let req = |key: &str, body: &[u8]| {
        idem.request("acct", "POST", "/charges")
            .key(Some(key))
            .body(body)
            .build()
            .expect("request")
    };
    // Statements prepared once: the completion's, and the reservation's with a record there.
    let warm = req("warm", b"{}");
    let Ok(Begin::Acquired(lease)) = idem.begin(&warm).await else {
        panic!("warm")
    };
    let _ = idem.begin(&warm).await;
    let mut tx = store.pool().begin().await.expect("tx");
    let completion = idem.completion(&lease, StoredResponse::new(201, "ok"));
    store
        .complete_in(&mut tx, &completion)
        .await
        .expect("complete");
    tx.commit().await.expect("commit");
    common::expecting_fresh_keys(&idem).await;
    tokio::time::sleep(Duration::from_millis(100)).await;

    let fresh = req("fresh", b"{}");
    let (begun, fresh_turns) = measured(&turns, idem.begin(&fresh)).await;
    let Ok(Begin::Acquired(lease)) = begun else {
        panic!("fresh: {begun:?}")
    };
    let (answer, in_flight_turns) = measured(&turns, idem.begin(&fresh)).await;
    assert!(
        matches!(answer, Ok(Begin::Answered(Answer::InFlight { .. }))),
        "{answer:?}"
    );
    let mut tx = store.pool().begin().await.expect("tx");
    let completion = idem.completion(&lease, StoredResponse::new(201, "charged"));
    store
        .complete_in(&mut tx, &completion)
        .await
        .expect("complete");
    tx.commit().await.expect("commit");
    tokio::time::sleep(Duration::from_millis(100)).await;
    let (answer, replay_turns) = measured(&turns, idem.begin(&fresh)).await;
    assert!(
        matches!(&answer, Ok(Begin::Answered(Answer::Replay(r))) if r.body == b"charged"[..]),
        "{answer:?}"
    );
    let (answer, mismatch_turns) = measured(&turns, idem.begin(&req("fresh", b"other"))).await;
    assert!(
        matches!(answer, Ok(Begin::Answered(Answer::Mismatch))),
        "{answer:?}"
    );
    println!(
        "{mode:?} expecting fresh keys: fresh {fresh_turns}, in flight {in_flight_turns}, replay {replay_turns}, mismatch {mismatch_turns}"
    );
    assert_eq!(fresh_turns, 1, "{mode:?}: a fresh key, the insert alone");
    assert_eq!(in_flight_turns, 2, "{mode:?}: an in-flight duplicate");
    assert_eq!(replay_turns, 2, "{mode:?}: a replay");
    assert_eq!(mismatch_turns, 2, "{mode:?}: a mismatch");

    // The money path, in two commits and in one (C15): the effect's statements prepared first.
    for one_commit in [false, true] {
        let warm = format!("money-warm-{one_commit}");
        let first = charge_in(&idem, &warm, b"{}", one_commit).await;
        assert!(matches!(first, Ok(Outcome::Executed(_))), "{first:?}");
        let again = charge_in(&idem, &warm, b"{}", one_commit).await;
        assert!(matches!(again, Ok(Outcome::Answered(_))), "{again:?}");
    }
    // In one commit at REPEATABLE READ the whole reservation comes first (the transaction's
    // snapshot is its first statement's): BEGIN, the reservation, ROLLBACK.
    let one_commit_replay = if isolation == Isolation::ReadCommitted {
        4
    } else {
        3
    };
    for (one_commit, fresh_expected, replay_expected) in
        [(false, 5, 2), (true, 5, one_commit_replay)]
    {
        common::expecting_fresh_keys(&idem).await;
        let key = format!("money-{one_commit}");
        let (fresh, fresh_turns) =
            measured(&turns, charge_in(&idem, &key, b"{}", one_commit)).await;
        assert!(matches!(fresh, Ok(Outcome::Executed(_))), "{fresh:?}");
        let (replay, replay_turns) =
            measured(&turns, charge_in(&idem, &key, b"{}", one_commit)).await;
        assert!(
            matches!(replay, Ok(Outcome::Answered(Answer::Replay(_)))),
            "{replay:?}"
        );
        println!(
            "{mode:?} {isolation:?} expecting fresh keys, run_in_transaction (one commit: {one_commit}): fresh {fresh_turns}, replay {replay_turns}"
        );
        assert_eq!(
            (fresh_turns, replay_turns),
            (fresh_expected, replay_expected),
            "{mode:?} {isolation:?}, one commit {one_commit}: a fresh key (the insert, BEGIN, the effect, the completion, COMMIT) and a replay (two commits: the insert, the reservation; one: BEGIN, both, ROLLBACK)"
        );
    }
}

#[tokio::test]
async fn c04_expecting_fresh_keys_a_fresh_key_is_one_insert() {
    count_fresh_first(StatementMode::Prepared, Isolation::ReadCommitted).await;
}

#[tokio::test]
async fn c04_expecting_fresh_keys_a_fresh_key_is_one_insert_with_the_simple_protocol() {
    count_fresh_first(StatementMode::Simple, Isolation::ReadCommitted).await;
}

/// C15: at REPEATABLE READ a one-commit reservation never sends the insert alone first: it
/// would take the transaction's snapshot, and the whole reservation after it would decide on
/// that stale one.
#[tokio::test]
async fn c15_expecting_fresh_keys_at_repeatable_read_one_commit_reserves_in_full() {
    count_fresh_first(StatementMode::Prepared, Isolation::RepeatableRead).await;
}

#[tokio::test]
async fn one_round_trip_per_answer_with_prepared_statements() {
    count_paths(StatementMode::Prepared, false).await;
}

#[tokio::test]
async fn one_plain_read_per_answer_with_the_read_first() {
    count_paths(StatementMode::Prepared, true).await;
}

#[tokio::test]
async fn one_round_trip_per_answer_with_the_simple_protocol() {
    count_paths(StatementMode::Simple, false).await;
}
