//! Network faults between the store and one Redis of the test's own, through the fault proxy:
//! a script that ran on the server whose answer was lost (the connection reset after the
//! request was sent, before the reply), and answers delayed past the response timeout then
//! delivered late. Each test checks one path of the contract: a lost answer is recognised by
//! its token (C4, C6, C8), no call reads another call's late answer (C7), every call is bounded
//! (C13).

mod common;

use fault_proxy::{Fault, FaultProxy, LoseAnswer};
use idem_core::{Answer, Begin, Failure, Idempotency, Outcome, Policy, StoredResponse};
use idem_redis::RedisStore;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

const TIMEOUTS: Duration = Duration::from_millis(300);
const BUDGET: Duration = Duration::from_secs(1);

/// A private Redis, a proxy in front of it, a store through the proxy, and its engine.
struct Setup {
    _server: common::Server,
    proxy: FaultProxy,
    idem: Idempotency<RedisStore>,
}

async fn setup(lease: Duration) -> Setup {
    let dir = common::temp_dir();
    let (child, port) = common::start_on_free_port(&dir, &[]);
    let server = common::Server(child, dir);
    let proxy = FaultProxy::start(&format!("127.0.0.1:{port}"))
        .await
        .expect("a proxy");
    let store = RedisStore::builder()
        .prefix(&format!("t{}", idem_core::FencingToken::generate()))
        .response_timeout(TIMEOUTS)
        .connection_timeout(TIMEOUTS)
        .change_feed(false)
        .connect(&format!("redis://{}", proxy.addr()))
        .await
        .expect("connect through the proxy");
    let policy = Policy::default().lease(lease).store_timeout(BUDGET);
    let idem = Idempotency::with_policy(store, policy).expect("a policy");
    Setup {
        _server: server,
        proxy,
        idem,
    }
}

fn request(idem: &Idempotency<RedisStore>, key: &str) -> idem_core::Request {
    idem.request("acct", "POST", "/v1/notify")
        .key(Some(key))
        .body(b"{}")
        .build()
        .expect("a request")
}

/// C4: the reservation script ran and wrote the record, its answer lost to a reset: the
/// engine's retry (same token) recognises its own record and acquires, and the key is not
/// held by nobody until the lease passes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn c04_a_reservation_whose_answer_was_lost_is_recognised_by_its_token() {
    let s = setup(Duration::from_secs(30)).await;
    let req = request(&s.idem, "lost-reserve");
    let key = s.idem.store().key_of(req.id());
    s.proxy
        .set(LoseAnswer::to(key.as_bytes()).reply_end(&b"$-1\r\n"[..]));
    let asked = Instant::now();
    let begun = s.idem.begin(&req).await;
    assert_eq!(s.proxy.answers_lost(), 1, "the answer was lost");
    assert!(asked.elapsed() < BUDGET * 2, "{:?}", asked.elapsed());
    match begun {
        Ok(Begin::Acquired(lease)) => {
            s.idem
                .complete(lease, StoredResponse::new(201, "done"))
                .await
                .expect("completed");
        }
        other => panic!("expected the reservation recognised and acquired, got {other:?}"),
    }
}

/// C6, C8: the completion script ran, its answer lost: the retry finds it landed under the
/// token, the caller gets its response, a retry replays it; the effect ran once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn c08_a_completion_whose_answer_was_lost_is_found_landed() {
    let s = setup(Duration::from_secs(30)).await;
    let req = request(&s.idem, "lost-complete");
    let key = s.idem.store().key_of(req.id());
    let runs = Arc::new(AtomicUsize::new(0));
    let proxy = &s.proxy;
    let ran = Arc::clone(&runs);
    proxy.set(Fault::PassThrough);
    let lose = LoseAnswer::to(key.as_bytes()).reply_end(&b":1\r\n"[..]);
    let armed = lose.clone();
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let outcome = {
        let run = s.idem.run(&req, move |_ctx| async move {
            ran.fetch_add(1, Ordering::SeqCst);
            let _ = tx.send(());
            tokio::time::sleep(Duration::from_millis(50)).await;
            Ok::<_, Failure<std::io::Error>>(StoredResponse::new(201, "sent once"))
        });
        tokio::pin!(run);
        tokio::select! {
            _ = rx => {}
            _ = &mut run => panic!("ended before the effect"),
        }
        proxy.set(armed);
        run.await
    };
    assert_eq!(
        s.proxy.answers_lost(),
        1,
        "the completion's answer was lost"
    );
    match outcome {
        Ok(Outcome::Executed(r)) => assert_eq!(r.body, b"sent once"),
        other => panic!("expected the executed answer, got {other:?}"),
    }
    let again = s
        .idem
        .run(&req, |_ctx| async {
            Ok::<_, Failure<std::io::Error>>(StoredResponse::new(201, "twice"))
        })
        .await;
    assert!(
        matches!(&again, Ok(Outcome::Answered(Answer::Replay(r))) if r.body == b"sent once"),
        "{again:?}"
    );
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    let _ = lose;
}

/// C9: a takeover (replace) whose answer was lost: the retry recognises its own record.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn c09_a_takeover_whose_answer_was_lost_is_recognised_by_its_token() {
    let s = setup(Duration::from_millis(500)).await;
    let req = request(&s.idem, "lost-replace");
    let Begin::Acquired(orphan) = s.idem.begin(&req).await.expect("begin") else {
        panic!("not acquired")
    };
    tokio::time::sleep(Duration::from_millis(700)).await;
    // The replace carries the previous token's bytes; the reserve before it does not.
    s.proxy
        .set(LoseAnswer::to(orphan.token().as_bytes().to_vec()).reply_end(&b"\r\n"[..]));
    let begun = s.idem.begin(&req).await;
    assert_eq!(s.proxy.answers_lost(), 1, "the takeover's answer was lost");
    assert!(
        matches!(begun, Ok(Begin::Acquired(_))),
        "expected the takeover recognised, got {begun:?}"
    );
}

/// C7, C13: answers delayed past the response timeout, then delivered late, on connections
/// that stay open: each call that answers reads its own answer, never another key's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn c07_late_answers_are_never_read_by_another_call() {
    let s = setup(Duration::from_secs(30)).await;
    let keys: Vec<String> = (0..16).map(|i| format!("late-{i}")).collect();
    for key in &keys {
        let req = request(&s.idem, key);
        let body = key.clone();
        let out = s
            .idem
            .run(&req, move |_ctx| async move {
                Ok::<_, Failure<std::io::Error>>(StoredResponse::new(201, body))
            })
            .await
            .expect("ran");
        assert!(matches!(out, Outcome::Executed(_)));
    }
    for round in 0..4 {
        s.proxy
            .set(Fault::Delay(TIMEOUTS + Duration::from_millis(100 * round)));
        let mut tasks = Vec::new();
        for key in keys.clone() {
            let idem = s.idem.clone();
            tasks.push(tokio::spawn(async move {
                let req = request(&idem, &key);
                let out = idem
                    .run(&req, |_ctx| async {
                        Ok::<_, Failure<std::io::Error>>(StoredResponse::new(500, "ran again"))
                    })
                    .await;
                (key, out)
            }));
            tokio::time::sleep(Duration::from_millis(20)).await;
            if tasks.len() == 8 {
                s.proxy.set(Fault::PassThrough);
            }
        }
        for task in tasks {
            let (key, out) = task.await.expect("joined");
            match out {
                Ok(Outcome::Answered(Answer::Replay(r))) => {
                    assert_eq!(r.body, key.as_bytes(), "{key} answered another's body")
                }
                Err(idem_core::RunError::Idem(e)) if e.is_retryable() => {}
                other => panic!("{key}: {other:?}"),
            }
        }
    }
}

/// C4, C7, C8: several engines (two stores, one with a replay cache, one reading first, one
/// not) run the same keys from many tasks while the proxy keeps losing answers: each time, the
/// next request of the test's prefix has its reply cut after its first line and both sockets
/// closed. No key's effect runs twice; every answer is the key's own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn c04_many_engines_retrying_the_same_keys_while_answers_are_lost() {
    let dir = common::temp_dir();
    let (child, port) = common::start_on_free_port(&dir, &[]);
    let _server = common::Server(child, dir);
    let proxy = Arc::new(
        FaultProxy::start(&format!("127.0.0.1:{port}"))
            .await
            .expect("a proxy"),
    );
    let prefix = format!("t{}", idem_core::FencingToken::generate());
    let mut engines = Vec::new();
    for (read_first, cached) in [(true, true), (false, false), (true, false)] {
        let store = RedisStore::builder()
            .prefix(&prefix)
            .response_timeout(TIMEOUTS)
            .connection_timeout(TIMEOUTS)
            .change_feed(false)
            .read_first(read_first)
            .connect(&format!("redis://{}", proxy.addr()))
            .await
            .expect("connect through the proxy");
        let policy = Policy::default()
            .lease(Duration::from_secs(20))
            .store_timeout(BUDGET);
        let mut builder = Idempotency::builder(store).policy(policy);
        if cached {
            builder = builder.replay_cache(idem_core::ReplayCache::new(10_000, 1 << 24));
        }
        engines.push(builder.build().expect("an engine"));
    }
    let effects: Arc<std::sync::Mutex<std::collections::HashMap<String, usize>>> = Arc::default();
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let chaos = {
        let (proxy, stop, prefix) = (Arc::clone(&proxy), Arc::clone(&stop), prefix.clone());
        tokio::spawn(async move {
            while !stop.load(Ordering::SeqCst) {
                proxy.set(LoseAnswer::to(prefix.as_bytes()).reply_end(&b"\r\n"[..]));
                tokio::time::sleep(Duration::from_millis(15)).await;
            }
            proxy.set(Fault::PassThrough);
        })
    };
    let started = Instant::now();
    let mut tasks = Vec::new();
    for t in 0..24 {
        let idem = engines[t % engines.len()].clone();
        let effects = Arc::clone(&effects);
        tasks.push(tokio::spawn(async move {
            let mut wrong = Vec::new();
            let mut slowest = Duration::ZERO;
            for round in 0..150 {
                let key = format!("r{round}-{}", t % 6);
                let req = request(&idem, &key);
                let (effects, body) = (Arc::clone(&effects), key.clone());
                let asked = Instant::now();
                let out = idem
                    .run(&req, move |_ctx| async move {
                        *effects
                            .lock()
                            .expect("effects")
                            .entry(body.clone())
                            .or_default() += 1;
                        tokio::time::sleep(Duration::from_millis(5)).await;
                        Ok::<_, Failure<std::io::Error>>(StoredResponse::new(201, body))
                    })
                    .await;
                slowest = slowest.max(asked.elapsed());
                match &out {
                    Ok(Outcome::Executed(r)) | Ok(Outcome::Answered(Answer::Replay(r)))
                        if r.body != key.as_bytes() =>
                    {
                        wrong.push(format!("{key}: {out:?}"))
                    }
                    Err(idem_core::RunError::Idem(e)) if e.is_retryable() => {}
                    Err(e) => wrong.push(format!("{key}: not a 503: {e:?}")),
                    _ => {}
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            (wrong, slowest)
        }));
    }
    let mut wrong = Vec::new();
    let mut slowest = Duration::ZERO;
    for task in tasks {
        let (w, s) = task.await.expect("joined");
        wrong.extend(w);
        slowest = slowest.max(s);
    }
    stop.store(true, Ordering::SeqCst);
    chaos.await.expect("chaos");
    let twice: Vec<_> = effects
        .lock()
        .expect("effects")
        .iter()
        .filter(|(_, n)| **n > 1)
        .map(|(k, n)| format!("{k}:{n}"))
        .collect();
    println!(
        "lost {} answers in {:?}; slowest call {slowest:?}",
        proxy.answers_lost(),
        started.elapsed()
    );
    assert!(wrong.is_empty(), "answers of another call: {wrong:?}");
    assert!(twice.is_empty(), "effects run twice: {twice:?}");
}
