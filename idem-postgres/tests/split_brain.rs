//! A primary that comes back after its standby was promoted (split brain, C13, C4, C7): the
//! store given both hosts (`target_session_attrs=read-write`) follows the promotion, then a
//! single lost connection on the new primary (an administrator's `pg_terminate_backend`, an
//! idle-session timeout, a network blip) moves it to the next host in its list: the old
//! primary, which accepts writes again and has none of the records written since the
//! promotion. The store never asks which of two writable servers is the newer one (their
//! timelines), so a key charged on the new primary is charged again on the old one.

mod common;
mod support;

use idem_core::{Answer, FencingToken, Idempotency, Outcome, Policy};
use idem_postgres::sqlx::{self, AssertSqlSafe, Connection, PgConnection};
use idem_postgres::PgStore;
use std::time::{Duration, Instant};
use support::bench::{answered, charge_reporting_port, Charged};
use support::pg_pair::PgPair;

const STORE_TIMEOUT: Duration = Duration::from_secs(2);

async fn engine(url: &str) -> (Idempotency<PgStore>, String) {
    let store = PgStore::builder()
        .table(&format!("sb_{}", FencingToken::generate()))
        .max_connections(4)
        .acquire_timeout(STORE_TIMEOUT)
        .statement_timeout(Duration::from_millis(1500))
        .lock_timeout(Duration::from_millis(1000))
        .connect(url)
        .await
        .expect("connect to the pair");
    store.migrate().await.expect("migrate");
    let charges = format!("charges_{}", FencingToken::generate());
    sqlx::raw_sql(AssertSqlSafe(format!(
        "CREATE TABLE {charges} (id bigserial PRIMARY KEY, intent text NOT NULL)"
    )))
    .execute(store.pool())
    .await
    .expect("the charges table");
    let policy = Policy::default()
        .store_timeout(STORE_TIMEOUT)
        .lease(Duration::from_secs(5));
    (
        Idempotency::with_policy(store, policy).expect("policy"),
        charges,
    )
}

/// Charges `key` until answered (within 20 s).
async fn until_answered(idem: &Idempotency<PgStore>, charges: &str, key: &str) -> Charged {
    let until = Instant::now() + Duration::from_secs(20);
    loop {
        let charged = charge_reporting_port(idem, charges, key).await;
        if answered(&charged) || Instant::now() >= until {
            return charged;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn body(charged: &Charged) -> String {
    match charged {
        Ok(Outcome::Executed(r)) | Ok(Outcome::Answered(Answer::Replay(r))) => {
            String::from_utf8_lossy(&r.body).into_owned()
        }
        other => format!("{other:?}"),
    }
}

/// Ends the store's sessions on the server at `port` (what an administrator, an idle-session
/// timeout or a network blip does to a connection).
async fn terminate_sessions(port: u16) {
    let mut conn = PgConnection::connect(&PgPair::url(port))
        .await
        .expect("connect");
    sqlx::raw_sql(
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
         WHERE pid <> pg_backend_pid() AND backend_type = 'client backend'",
    )
    .execute(&mut conn)
    .await
    .expect("terminate");
    let _ = conn.close().await;
}

/// C4, C7, C13: after a promotion, the store never goes back to the old primary that returned
/// beside the new one: a key charged on the new primary is replayed, not charged again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn c07_c13_a_key_charged_after_a_promotion_is_never_charged_again_on_the_old_primary() {
    let pair = PgPair::start_async().await;
    let url = PgPair::hosts_url(pair.primary_port, pair.standby_port);
    let (idem, charges) = engine(&url).await;
    let before = until_answered(&idem, &charges, "before").await;
    assert!(
        body(&before).ends_with(&pair.primary_port.to_string()),
        "on the primary first: {before:?}"
    );

    // The primary goes silent; the standby is promoted; the store follows it.
    let frozen = Thaw(pair.freeze_primary());
    tokio::time::sleep(Duration::from_millis(300)).await;
    pair.promote_standby().await;
    let key = format!("after-the-promotion-{}", FencingToken::generate());
    let first = until_answered(&idem, &charges, &key).await;
    assert!(
        body(&first).ends_with(&pair.standby_port.to_string()),
        "charged on the new primary: {first:?}"
    );

    // The old primary runs again (nobody fenced it), and one of the store's sessions on the
    // new primary is lost.
    drop(frozen);
    tokio::time::sleep(Duration::from_millis(300)).await;
    terminate_sessions(pair.standby_port).await;

    let retry = until_answered(&idem, &charges, &key).await;
    eprintln!("first {first:?}\nretry {retry:?}");
    assert!(
        matches!(retry, Ok(Outcome::Answered(Answer::Replay(_)))),
        "the retry of a key charged on the new primary ({}) is its replay, got {} ({retry:?})",
        body(&first),
        body(&retry)
    );
}

/// Thaws the frozen primary when dropped (the pair then stops it as usual).
struct Thaw(Vec<i32>);

impl Drop for Thaw {
    fn drop(&mut self) {
        PgPair::thaw_all(&self.0);
    }
}

/// C13: the same with a synchronous standby: the old primary that came back takes the store's
/// connections and leaves every write waiting for a standby it no longer has. The store must
/// serve again from the new primary, which is up and healthy, within a few budgets; it never
/// does (every statement cut off there is checked by a round trip that the old primary
/// answers, so the store stays).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn c13_a_store_never_stays_on_an_old_primary_that_cannot_commit() {
    let pair = PgPair::start().await;
    let url = PgPair::hosts_url(pair.primary_port, pair.standby_port);
    let (idem, charges) = engine(&url).await;
    let before = until_answered(&idem, &charges, "before").await;
    assert!(answered(&before), "charged on the primary: {before:?}");
    let frozen = Thaw(pair.freeze_primary());
    tokio::time::sleep(Duration::from_millis(300)).await;
    pair.promote_standby().await;
    let after = until_answered(&idem, &charges, "after-the-promotion").await;
    assert!(
        body(&after).ends_with(&pair.standby_port.to_string()),
        "charged on the new primary: {after:?}"
    );
    drop(frozen);
    tokio::time::sleep(Duration::from_millis(300)).await;
    terminate_sessions(pair.standby_port).await;

    let started = Instant::now();
    let mut answers = Vec::new();
    let served = loop {
        let key = format!("later-{}", answers.len());
        let charged = charge_reporting_port(&idem, &charges, &key).await;
        let done = answered(&charged);
        answers.push((body(&charged), started.elapsed()));
        if done || started.elapsed() > 8 * STORE_TIMEOUT {
            break done;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    eprintln!(
        "{} calls: first {:?}, last {:?}",
        answers.len(),
        answers.first(),
        answers.last()
    );
    assert!(
        served,
        "the store never served again from the healthy new primary within {:?}: {answers:?}",
        8 * STORE_TIMEOUT
    );
}
