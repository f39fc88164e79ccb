//! Commands per path, counted by a Redis of the test's own (`INFO commandstats`, which counts
//! the commands a script runs too): a fresh key is the reservation script and the completion
//! script, without reading the record (no HMGET in the reservation, no HDEL in the completion);
//! an answer one script, or with `read_first(true)` (the default, while answers
//! dominate) `HMGET` of the record's read header and its response, and `TIME` (one round trip,
//! no script), and a fresh key that read before its two scripts.

mod common;

use common::{start_on_free_port, temp_dir, Server};
use idem_core::{Answer, Begin, Idempotency, StoredResponse};
use idem_redis::redis;
use idem_redis::RedisStore;
use std::collections::BTreeMap;

/// Calls per command since the last reset, without the counting's own `INFO` and `CONFIG`.
async fn calls(conn: &mut redis::aio::MultiplexedConnection) -> BTreeMap<String, u64> {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(conn)
        .await
        .expect("INFO");
    let _: () = redis::cmd("CONFIG")
        .arg("RESETSTAT")
        .query_async(conn)
        .await
        .expect("CONFIG RESETSTAT");
    info.lines()
        .filter_map(|line| {
            let (name, stats) = line.strip_prefix("cmdstat_")?.split_once(':')?;
            let count = stats
                .strip_prefix("calls=")?
                .split(',')
                .next()?
                .parse()
                .ok()?;
            (!name.starts_with("info") && !name.starts_with("config"))
                .then(|| (name.to_owned(), count))
        })
        .collect()
}

fn counted(pairs: &[(&str, u64)]) -> BTreeMap<String, u64> {
    pairs.iter().map(|(n, c)| ((*n).to_owned(), *c)).collect()
}

async fn count(read_first: bool) {
    let dir = temp_dir();
    let (child, port) = start_on_free_port(&dir, &[]);
    let _server = Server(child, dir);
    let url = format!("redis://127.0.0.1:{port}");
    let store = RedisStore::builder()
        .change_feed(false)
        .read_first(read_first)
        .connect(&url)
        .await
        .expect("connect");
    let idem = Idempotency::new(store);
    let client = redis::Client::open(url.as_str()).expect("client");
    let mut conn = client
        .get_multiplexed_async_connection()
        .await
        .expect("connect");
    let req = |body: &[u8]| {
        idem.request("acct", "POST", "/charges")
            .key(Some("k"))
            .body(body)
            .build()
            .expect("request")
    };
    // Warm: the scripts loaded once (a first use costs a SCRIPT LOAD more).
    let warm = idem
        .request("acct", "POST", "/charges")
        .key(Some("warm"))
        .body(b"{}")
        .build()
        .expect("request");
    let Ok(Begin::Acquired(lease)) = idem.begin(&warm).await else {
        panic!("warm")
    };
    idem.complete(lease, StoredResponse::new(201, "ok"))
        .await
        .expect("complete");
    assert!(matches!(idem.begin(&warm).await, Ok(Begin::Answered(_))));
    calls(&mut conn).await;

    let Ok(Begin::Acquired(lease)) = idem.begin(&req(b"{}")).await else {
        panic!("fresh")
    };
    let fresh = calls(&mut conn).await;
    assert!(matches!(
        idem.begin(&req(b"{}")).await,
        Ok(Begin::Answered(Answer::InFlight { .. }))
    ));
    let in_flight = calls(&mut conn).await;
    idem.complete(lease, StoredResponse::new(201, "charged"))
        .await
        .expect("complete");
    let complete = calls(&mut conn).await;
    assert!(matches!(
        idem.begin(&req(b"{}")).await,
        Ok(Begin::Answered(Answer::Replay(_)))
    ));
    let replay = calls(&mut conn).await;
    assert!(matches!(
        idem.begin(&req(b"other")).await,
        Ok(Begin::Answered(Answer::Mismatch))
    ));
    let mismatch = calls(&mut conn).await;

    let read = [("hmget", 1), ("time", 1)];
    // The reservation script when it finds a record: TIME, EXISTS and HMGET.
    let script = [("evalsha", 1), ("exists", 1), ("hmget", 1), ("time", 1)];
    let answer = counted(if read_first { &read } else { &script });
    // The reservation script on a fresh key: TIME, EXISTS, HSET and PEXPIREAT, no HMGET; with
    // read_first, after the read.
    let mut fresh_expected = counted(&[
        ("evalsha", 1),
        ("exists", 1),
        ("hset", 1),
        ("pexpireat", 1),
        ("time", 1),
    ]);
    if read_first {
        for (command, calls) in read {
            *fresh_expected.entry(command.to_owned()).or_default() += calls;
        }
    }
    // No HDEL: the record has no mark of doubt to delete.
    let complete_expected = counted(&[
        ("evalsha", 1),
        ("hmget", 1),
        ("hset", 1),
        ("pexpireat", 1),
        ("time", 1),
    ]);
    println!("read_first {read_first}: fresh {fresh:?}, in flight {in_flight:?}, complete {complete:?}, replay {replay:?}, mismatch {mismatch:?}");
    assert_eq!(fresh, fresh_expected, "a fresh key");
    assert_eq!(complete, complete_expected, "a completion");
    assert_eq!(in_flight, answer, "an in-flight duplicate");
    assert_eq!(replay, answer, "a replay");
    assert_eq!(mismatch, answer, "a mismatch");
}

#[tokio::test]
async fn an_answer_is_one_script_and_a_fresh_key_two() {
    count(false).await;
}

#[tokio::test]
async fn with_read_first_an_answer_is_one_read_without_a_script() {
    count(true).await;
}
