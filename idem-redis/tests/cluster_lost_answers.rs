//! Network faults between the store and a Redis Cluster of the test's own: each master behind a
//! fault proxy of its own, announced to clients at the proxy's port (`cluster-announce-port`),
//! so every connection the cluster client opens goes through a proxy. A script that ran whose
//! answer was lost (a reset before the reply), answers delivered late, and many engines
//! retrying while answers keep being lost: every lost answer is recognised by its token (C4,
//! C6, C8), no call reads another's answer (C7), every call is bounded (C13).

mod support;

use fault_proxy::{Fault, FaultProxy, LoseAnswer};
use idem_core::{Answer, Begin, Failure, Idempotency, Outcome, Policy, StoredResponse};
use idem_redis::RedisStore;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use support::private_cluster::PrivateCluster;
use support::redis_cli::{cli, wait_for};

const TIMEOUTS: Duration = Duration::from_millis(300);
const BUDGET: Duration = Duration::from_secs(1);

struct Setup {
    proxies: Vec<Arc<FaultProxy>>,
    urls: Vec<String>,
    _cluster: PrivateCluster,
}

impl Setup {
    fn set(&self, fault: impl Into<Fault>) {
        let fault = fault.into();
        for proxy in &self.proxies {
            proxy.set(fault.clone());
        }
    }

    fn answers_lost(&self) -> usize {
        self.proxies.iter().map(|p| p.answers_lost()).sum()
    }

    async fn store(&self, prefix: &str, read_first: bool) -> RedisStore {
        let seeds: Vec<&str> = self.urls.iter().map(String::as_str).collect();
        RedisStore::builder()
            .prefix(prefix)
            .response_timeout(TIMEOUTS)
            .connection_timeout(TIMEOUTS)
            .change_feed(false)
            .read_first(read_first)
            .connect_cluster(&seeds)
            .await
            .expect("connect through the proxies")
    }
}

async fn setup() -> Setup {
    let cluster = PrivateCluster::start();
    let mut proxies = Vec::new();
    for port in cluster.ports() {
        let proxy = FaultProxy::start(&format!("127.0.0.1:{port}"))
            .await
            .expect("a proxy");
        let announced = proxy.addr().port().to_string();
        cli(
            port,
            &["config", "set", "cluster-announce-port", &announced],
        );
        proxies.push(Arc::new(proxy));
    }
    let announced: Vec<String> = proxies
        .iter()
        .map(|p| p.addr().port().to_string())
        .collect();
    let ports = cluster.ports();
    wait_for(Duration::from_secs(20), "the proxies announced", || {
        ports.iter().all(|port| {
            let slots = cli(*port, &["cluster", "slots"]);
            ports
                .iter()
                .all(|p| !slots.lines().any(|l| l.trim() == p.to_string()))
                && announced
                    .iter()
                    .all(|a| slots.lines().any(|l| l.trim() == a))
        })
    });
    let urls = proxies
        .iter()
        .map(|p| format!("redis://{}", p.addr()))
        .collect();
    Setup {
        proxies,
        urls,
        _cluster: cluster,
    }
}

fn engine(store: RedisStore, lease: Duration) -> Idempotency<RedisStore> {
    let policy = Policy::default().lease(lease).store_timeout(BUDGET);
    Idempotency::with_policy(store, policy).expect("a policy")
}

fn request(idem: &Idempotency<RedisStore>, key: &str) -> idem_core::Request {
    idem.request("acct", "POST", "/v1/notify")
        .key(Some(key))
        .body(b"{}")
        .build()
        .expect("a request")
}

fn prefix() -> String {
    format!("t{}", idem_core::FencingToken::generate())
}

/// One cluster for every scenario (starting one takes seconds), one at a time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn c04_lost_and_late_answers_on_a_cluster() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter("idem=warn,idem_redis=warn")
        .with_test_writer()
        .try_init();
    let s = setup().await;
    let idem = engine(s.store(&prefix(), true).await, Duration::from_secs(30));

    // C4: a reservation's answer lost.
    let req = request(&idem, "lost-reserve");
    let key = idem.store().key_of(req.id());
    s.set(LoseAnswer::to(key.as_bytes()).reply_end(&b"$-1\r\n"[..]));
    let asked = Instant::now();
    let begun = idem.begin(&req).await;
    s.set(Fault::PassThrough);
    println!(
        "reserve: lost {} in {:?}: {begun:?}",
        s.answers_lost(),
        asked.elapsed()
    );
    assert!(s.answers_lost() >= 1);
    let Ok(Begin::Acquired(lease)) = begun else {
        panic!("a lost reservation answer not recognised: {begun:?}")
    };

    // C6, C8: the completion's answer lost.
    let before = s.answers_lost();
    s.set(LoseAnswer::to(key.as_bytes()).reply_end(&b":1\r\n"[..]));
    let asked = Instant::now();
    let completed = idem.complete(lease, StoredResponse::new(201, "once")).await;
    s.set(Fault::PassThrough);
    println!(
        "complete: lost {} in {:?}: {completed:?}",
        s.answers_lost(),
        asked.elapsed()
    );
    assert!(s.answers_lost() > before);
    assert!(
        matches!(&completed, Ok(r) if r.body == b"once"),
        "a landed completion not recognised: {completed:?}"
    );
    let again = idem.begin(&req).await;
    assert!(
        matches!(&again, Ok(Begin::Answered(Answer::Replay(r))) if r.body == b"once"),
        "{again:?}"
    );

    // C9: a takeover's answer lost.
    let short = engine(s.store(&prefix(), true).await, Duration::from_millis(500));
    let req = request(&short, "lost-replace");
    let Begin::Acquired(orphan) = short.begin(&req).await.expect("begin") else {
        panic!("not acquired")
    };
    tokio::time::sleep(Duration::from_millis(700)).await;
    let before = s.answers_lost();
    s.set(LoseAnswer::to(orphan.token().as_bytes().to_vec()).reply_end(&b"\r\n"[..]));
    let begun = short.begin(&req).await;
    s.set(Fault::PassThrough);
    assert!(s.answers_lost() > before);
    assert!(
        matches!(begun, Ok(Begin::Acquired(_))),
        "a lost takeover answer not recognised: {begun:?}"
    );

    // C7: late answers, then many engines while answers keep being lost.
    let shared = prefix();
    let mut engines = Vec::new();
    for read_first in [true, false, true] {
        engines.push(engine(
            s.store(&shared, read_first).await,
            Duration::from_secs(20),
        ));
    }
    let effects: Arc<std::sync::Mutex<std::collections::HashMap<String, usize>>> = Arc::default();
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let proxies = s.proxies.clone();
    let chaos = {
        let (stop, shared) = (Arc::clone(&stop), shared.clone());
        tokio::spawn(async move {
            let mut i = 0u32;
            while !stop.load(Ordering::SeqCst) {
                i += 1;
                for proxy in &proxies {
                    if i.is_multiple_of(20) {
                        proxy.set(Fault::Delay(TIMEOUTS + Duration::from_millis(50)));
                    } else {
                        proxy.set(LoseAnswer::to(shared.as_bytes()).reply_end(&b"\r\n"[..]));
                    }
                }
                tokio::time::sleep(Duration::from_millis(15)).await;
            }
            for proxy in &proxies {
                proxy.set(Fault::PassThrough);
            }
        })
    };
    let slowest = Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for t in 0..24 {
        let idem = engines[t % engines.len()].clone();
        let (effects, slowest) = (Arc::clone(&effects), Arc::clone(&slowest));
        tasks.push(tokio::spawn(async move {
            let mut wrong = Vec::new();
            for round in 0..100 {
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
                        Ok::<_, Failure<std::io::Error>>(StoredResponse::new(201, body))
                    })
                    .await;
                let took = usize::try_from(asked.elapsed().as_millis()).unwrap_or(usize::MAX);
                slowest.fetch_max(took, Ordering::SeqCst);
                match &out {
                    Ok(Outcome::Executed(r)) | Ok(Outcome::Answered(Answer::Replay(r)))
                        if r.body != key.as_bytes() =>
                    {
                        wrong.push(format!("{key}: {out:?}"))
                    }
                    _ => {}
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            wrong
        }));
    }
    let mut wrong = Vec::new();
    for task in tasks {
        wrong.extend(task.await.expect("joined"));
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
        "chaos: lost {} answers; slowest call {} ms",
        s.answers_lost(),
        slowest.load(Ordering::SeqCst)
    );
    assert!(wrong.is_empty(), "answers of another call: {wrong:?}");
    assert!(twice.is_empty(), "effects run twice: {twice:?}");
    assert!(
        slowest.load(Ordering::SeqCst) < 3000,
        "a call took {} ms",
        slowest.load(Ordering::SeqCst)
    );
}

/// C13: the link to one master blackholed (the cluster itself healthy: its bus does not go
/// through the proxies): the keys of that master are 503s within the deadline; the keys of
/// the other masters are answered as before, by the same store.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn c13_one_master_blackholed_leaves_the_other_masters_answering() {
    let s = setup().await;
    let idem = engine(s.store(&prefix(), true).await, Duration::from_secs(30));
    // Which proxy carries which key: a key's slot's master, asked through the store's record key.
    let ports = s._cluster.ports();
    let mut keys_by_node: Vec<Vec<String>> = vec![Vec::new(); ports.len()];
    for i in 0..300 {
        let key = format!("k{i}");
        let record_key = idem.store().key_of(request(&idem, &key).id());
        let slot: u16 = cli(ports[0], &["cluster", "keyslot", &record_key])
            .parse()
            .expect("a slot");
        let owner = ports
            .iter()
            .position(|p| {
                cli(*p, &["cluster", "nodes"])
                    .lines()
                    .find(|l| l.contains("myself"))
                    .is_some_and(|l| {
                        l.split_whitespace().skip(8).any(|range| {
                            let (a, b) = range.split_once('-').unwrap_or((range, range));
                            let (a, b): (u16, u16) =
                                (a.parse().unwrap_or(u16::MAX), b.parse().unwrap_or(0));
                            a <= slot && slot <= b
                        })
                    })
            })
            .expect("an owner");
        keys_by_node[owner].push(key);
    }
    println!(
        "keys per node: {:?}",
        keys_by_node.iter().map(Vec::len).collect::<Vec<_>>()
    );
    let frozen = 0;
    s.proxies[frozen].set(Fault::Freeze);
    let started = Instant::now();
    // Callers of the frozen master's keys, as a retrying client would be, beside callers of
    // the other masters' keys.
    let mut blocked = Vec::new();
    for t in 0..4 {
        let (idem, keys) = (idem.clone(), keys_by_node[frozen].clone());
        blocked.push(tokio::spawn(async move {
            let mut i = t;
            while started.elapsed() < Duration::from_secs(4) {
                let req = request(&idem, &keys[i % keys.len()]);
                let _ = idem
                    .run(&req, |_ctx| async {
                        Ok::<_, Failure<std::io::Error>>(StoredResponse::new(201, "ok"))
                    })
                    .await;
                i += 4;
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }));
    }
    let mut healthy = Vec::new();
    for t in 0..4 {
        let idem = idem.clone();
        let keys: Vec<String> = keys_by_node
            .iter()
            .enumerate()
            .filter(|(n, _)| *n != frozen)
            .flat_map(|(_, k)| k.clone())
            .collect();
        healthy.push(tokio::spawn(async move {
            let (mut answered, mut refused, mut slow) = (0, Vec::new(), Duration::ZERO);
            let mut i = t;
            while started.elapsed() < Duration::from_secs(4) {
                let key = &keys[i % keys.len()];
                let req = request(&idem, key);
                let asked = Instant::now();
                let out = idem
                    .run(&req, |_ctx| async {
                        Ok::<_, Failure<std::io::Error>>(StoredResponse::new(201, "ok"))
                    })
                    .await;
                slow = slow.max(asked.elapsed());
                match out {
                    Ok(_) => answered += 1,
                    Err(e) => refused.push(format!("{:?} {key}: {e}", started.elapsed())),
                }
                i += 4;
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            (answered, refused, slow)
        }));
    }
    let (mut answered, mut refused, mut slow) = (0, Vec::new(), Duration::ZERO);
    for task in healthy {
        let (a, r, s) = task.await.expect("joined");
        answered += a;
        refused.extend(r);
        slow = slow.max(s);
    }
    for task in blocked {
        task.await.expect("joined");
    }
    s.proxies[frozen].set(Fault::PassThrough);
    println!(
        "answered {answered}, refused {}, slowest {slow:?}",
        refused.len()
    );
    for r in refused.iter().take(10) {
        println!("  {r}");
    }
    assert!(
        refused.is_empty(),
        "{} calls for keys of healthy masters refused (of {}); first: {:?}",
        refused.len(),
        refused.len() + answered,
        refused.first()
    );
}

/// C8, C13: the store loses every connection to the cluster for 1.5 s (each closed by the
/// network, reconnections closed too) while an execution's effect has just run. The store is
/// down, not refusing: the reservations meanwhile are 503s (retryable), and the completion
/// keeps trying until it lands, which it can once the network is back, well within the 5 s
/// lease. A retry after the lease replays the effect's answer; the effect ran once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn c08_every_cluster_connection_lost_for_a_moment_is_a_503_and_the_completion_lands() {
    let s = setup().await;
    let idem = engine(s.store(&prefix(), true).await, Duration::from_secs(5));
    let runs = Arc::new(AtomicUsize::new(0));
    let req = request(&idem, "all-lost");
    let proxies = s.proxies.clone();
    let ran = Arc::clone(&runs);
    let first = idem
        .run(&req, move |_ctx| async move {
            ran.fetch_add(1, Ordering::SeqCst);
            // The effect has run; now the network drops every connection, for 1.5 s.
            for proxy in &proxies {
                proxy.set(Fault::ClientGone);
            }
            let back = proxies.clone();
            tokio::spawn(async move {
                tokio::time::sleep(Duration::from_millis(1500)).await;
                for proxy in &back {
                    proxy.set(Fault::PassThrough);
                }
            });
            tokio::time::sleep(Duration::from_millis(100)).await;
            Ok::<_, Failure<std::io::Error>>(StoredResponse::new(201, "charged once"))
        })
        .await;
    println!("first: {first:?}");
    // Meanwhile another key: the store is down, a 503.
    let other = idem.begin(&request(&idem, "while-down")).await;
    println!("while down: {other:?}");
    tokio::time::sleep(Duration::from_secs(6)).await;
    let ran = Arc::clone(&runs);
    let retry = idem
        .run(&req, move |_ctx| async move {
            ran.fetch_add(1, Ordering::SeqCst);
            Ok::<_, Failure<std::io::Error>>(StoredResponse::new(201, "charged again"))
        })
        .await;
    println!("retry after the lease: {retry:?}");
    assert_eq!(
        runs.load(Ordering::SeqCst),
        1,
        "the effect ran twice: the first completion was given up ({first:?}), the retry after \
         the lease ran it again ({retry:?})"
    );
    assert!(
        matches!(&other, Err(e) if e.is_retryable()) || other.is_ok(),
        "a reservation while the store is down is not a 503: {other:?}"
    );
    assert!(
        matches!(&retry, Ok(Outcome::Answered(Answer::Replay(r))) if r.body == b"charged once"),
        "{retry:?}"
    );
}
