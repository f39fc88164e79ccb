//! Several processes on one SQLite file (C4, C6, C9, C13), as a payments team runs it: child
//! processes (this test binary in child mode) charge random keys through `run_in_transaction`
//! while the parent kills them with SIGKILL at random points, freezes them with SIGSTOP (a
//! frozen writer), and purges. Afterwards every key has exactly one charge if its record is
//! completed and none otherwise, and no call took much longer than the store budget.

mod common;

use idem_core::{Idempotency, Outcome, Policy, RunError, StoredResponse};
use idem_sqlite::{rusqlite, SqliteIdempotency, SqliteStore};
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const CHILD_ENV: &str = "IDEM_SQLITE_CHAOS_CHILD";
const LEASE: Duration = Duration::from_millis(1000);
const BUDGET: Duration = Duration::from_millis(1000);
fn keys() -> u64 {
    std::env::var("CHAOS_KEYS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(300)
}

/// The size of each stored response (a disk that fills needs records that grow it).
fn body_len() -> usize {
    std::env::var("CHAOS_BODY")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0)
}

fn body(intent: &str) -> String {
    let mut body = format!("charge {intent}");
    while body.len() < body_len() {
        body.push_str(" padding");
    }
    body
}

struct Rng(u64);
impl Rng {
    fn new(seed: u64) -> Self {
        Self(seed | 1)
    }
    fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.0 = x;
        x
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

fn seed() -> u64 {
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("time")
        .as_nanos() as u64;
    t ^ (u64::from(std::process::id()) << 32)
}

fn policy() -> Policy {
    Policy::default().lease(LEASE).store_timeout(BUDGET)
}

/// What one charge answered.
type Charged = Result<Outcome, RunError<rusqlite::Error>>;

/// One charge of `key`: its row in `charges`, written in the completion's transaction, which
/// is held `hold` longer; the stored body is [`body`] of the key.
async fn charge(idem: &Idempotency<SqliteStore>, key: &str, hold: Duration) -> Charged {
    let request = idem
        .request("acct_chaos", "POST", "/charges")
        .key(Some(key))
        .body(b"{\"cents\":100}")
        .build()
        .expect("request");
    let intent = key.to_owned();
    idem.run_in_transaction(&request, move |tx, _lease| {
        tx.execute("INSERT INTO charges (intent) VALUES (?1)", [&intent])?;
        std::thread::sleep(hold);
        Ok::<_, rusqlite::Error>(StoredResponse::new(201, body(&intent)))
    })
    .await
}

/// How many charges `key` has, and its record's state (none without a record).
async fn charges_and_state(store: &SqliteStore, key: &str) -> (i64, Option<i64>) {
    let key = key.to_owned();
    store
        .read(move |db| {
            let c = db.query_row(
                "SELECT COUNT(*) FROM charges WHERE intent = ?1",
                [&key],
                |r| r.get(0),
            )?;
            let s = db
                .query_row(
                    "SELECT state FROM idem_records WHERE key = ?1",
                    [&key],
                    |r| r.get(0),
                )
                .ok();
            Ok::<_, rusqlite::Error>((c, s))
        })
        .await
        .expect("read")
        .expect("counts")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "child process of the chaos test"]
async fn chaos_child() {
    let spec = std::env::var(CHILD_ENV).expect("run by the chaos test");
    let mut parts = spec.split('|');
    let db = PathBuf::from(parts.next().expect("db"));
    let millis: u64 = parts.next().expect("ms").parse().expect("ms");
    let style = parts.next().unwrap_or("tx").to_owned();
    if style == "checkpoint" {
        checkpoints(&db, millis);
        return;
    }
    let store = SqliteStore::open(&db).await.expect("open");
    let idem = Idempotency::with_policy(store, policy()).expect("policy");
    let mut rng = Rng::new(seed());
    let until = Instant::now() + Duration::from_millis(millis);
    println!("READY");
    let mut worst = Duration::ZERO;
    while Instant::now() < until {
        let key = format!("k{}", rng.below(keys()));
        let hold = Duration::from_millis(rng.below(20));
        let started = Instant::now();
        let outcome = if style == "guard" {
            charge_guard(&idem, &key, hold).await
        } else {
            charge(&idem, &key, hold).await
        };
        let took = started.elapsed();
        worst = worst.max(took);
        let what = match &outcome {
            Ok(Outcome::Executed(_)) => "executed".to_owned(),
            Ok(Outcome::Answered(a)) => format!("answered {a:?}").chars().take(40).collect(),
            Ok(other) => format!("{other:?}"),
            Err(RunError::Idem(e)) => format!("idem error {e}"),
            Err(e) => format!("error {e}"),
        };
        if took > BUDGET * 2 + Duration::from_millis(500) {
            println!("SLOW {} ms {key}: {what}", took.as_millis());
        }
        if let Ok(Outcome::Answered(idem_core::Answer::Replay(r))) = &outcome {
            let expected = body(&key);
            if r.body[..] != *expected.as_bytes() {
                println!("WRONG REPLAY {key}: {:?}", String::from_utf8_lossy(&r.body));
            }
        }
    }
    println!("DONE worst {} ms", worst.as_millis());
}

/// A process that checkpoints the WAL back to back (`TRUNCATE`: copy, then cut the file), as
/// an operator's backup script or `sqlite3` shell may, until `millis` have passed.
fn checkpoints(db: &Path, millis: u64) {
    let conn = rusqlite::Connection::open(db).expect("open");
    conn.busy_timeout(Duration::from_millis(50)).expect("busy");
    let until = Instant::now() + Duration::from_millis(millis);
    println!("READY");
    while Instant::now() < until {
        let _ = conn.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(()));
    }
    println!("DONE worst 0 ms");
}

/// [`charge`] in the guard style: `begin`, then the charge and its completion in one
/// transaction (`complete_transaction`).
async fn charge_guard(idem: &Idempotency<SqliteStore>, key: &str, hold: Duration) -> Charged {
    let request = idem
        .request("acct_chaos", "POST", "/charges")
        .key(Some(key))
        .body(b"{\"cents\":100}")
        .build()
        .expect("request");
    let lease = match idem.begin(&request).await.map_err(RunError::Idem)? {
        idem_core::Begin::Acquired(lease) => lease,
        idem_core::Begin::Answered(answer) => return Ok(Outcome::Answered(answer)),
    };
    let intent = key.to_owned();
    let completion = idem
        .complete_transaction(
            &lease,
            Box::new(
                move |tx: &rusqlite::Transaction<'_>, _lease: &idem_core::store::Lease| {
                    tx.execute("INSERT INTO charges (intent) VALUES (?1)", [&intent])?;
                    std::thread::sleep(hold);
                    Ok::<_, rusqlite::Error>(StoredResponse::new(201, body(&intent)))
                },
            ),
        )
        .await?;
    idem.committed(&completion);
    Ok(Outcome::Executed(completion.response().clone()))
}

fn spawn(db: &Path, millis: u64, log: Arc<Mutex<Vec<String>>>) -> Child {
    spawn_styled(db, millis, "tx", log)
}

fn spawn_styled(db: &Path, millis: u64, style: &str, log: Arc<Mutex<Vec<String>>>) -> Child {
    let mut child = Command::new(std::env::current_exe().expect("test binary"))
        .args([
            "--ignored",
            "--exact",
            "chaos_child",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD_ENV, format!("{}|{millis}|{style}", db.display()))
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn");
    let out = child.stdout.take().expect("stdout");
    let pid = child.id();
    std::thread::spawn(move || {
        for line in BufReader::new(out).lines().map_while(Result::ok) {
            if line.starts_with("SLOW") || line.starts_with("WRONG") || line.starts_with("DONE") {
                log.lock().expect("log").push(format!("[{pid}] {line}"));
            }
        }
    });
    child
}

fn signal(pid: u32, sig: &str) {
    let _ = Command::new("kill").args([sig, &pid.to_string()]).status();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn c04_c06_c09_c13_several_processes_killed_and_frozen_one_charge_per_key() {
    killed_and_frozen("chaos.db", &["tx", "tx", "tx"], true).await;
}

/// The guard style (`begin`, then `complete_transaction`) across processes killed and frozen at
/// random points, beside a process checkpointing the WAL back to back (`TRUNCATE`) that is
/// killed and frozen too, in the middle of its checkpoints (C4, C6, C9, C13).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn c04_c06_c09_guard_style_and_killed_checkpoints_one_charge_per_key() {
    killed_and_frozen("guard.db", &["tx", "guard", "guard", "checkpoint"], false).await;
}

/// Child processes of `styles` on the file `name`, all but the first killed and frozen at
/// random points (and, with `purge`, this process purging meanwhile) for `CHAOS_SECS` (15 by
/// default): every key ends with one charge and its completed record, and the first child,
/// never frozen or killed, waits no longer than twice the store budget.
async fn killed_and_frozen(name: &str, styles: &[&str], purge: bool) {
    let dir = tempfile::tempdir().expect("dir");
    let db = dir.path().join(name);
    let store = SqliteStore::open(&db).await.expect("open");
    common::with_intent_charges(&store).await;
    let idem = Idempotency::with_policy(store.clone(), policy()).expect("policy");
    let log = Arc::new(Mutex::new(Vec::new()));
    let run_for = Duration::from_secs(
        std::env::var("CHAOS_SECS")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(15),
    );
    let end = Instant::now() + run_for;
    let mut rng = Rng::new(seed());
    let left = |end: Instant| end.saturating_duration_since(Instant::now()).as_millis() as u64;
    let mut children: Vec<Child> = styles
        .iter()
        .map(|style| spawn_styled(&db, left(end), style, Arc::clone(&log)))
        .collect();
    let observer = format!("[{}]", children[0].id());
    let (mut kills, mut stops, mut purged) = (0, 0, 0usize);
    while Instant::now() + Duration::from_millis(500) < end {
        tokio::time::sleep(Duration::from_millis(100 + rng.below(300))).await;
        // Child 0 is never frozen or killed: it measures the survivors' waits (C13).
        let i = 1 + rng.below(children.len() as u64 - 1) as usize;
        match rng.below(if purge { 3 } else { 2 }) {
            0 => {
                let _ = children[i].kill();
                let _ = children[i].wait();
                kills += 1;
                children[i] = spawn_styled(&db, left(end), styles[i], Arc::clone(&log));
            }
            1 => {
                let pid = children[i].id();
                signal(pid, "-STOP");
                stops += 1;
                let pause = Duration::from_millis(300 + rng.below(2500));
                std::thread::spawn(move || {
                    std::thread::sleep(pause);
                    signal(pid, "-CONT");
                });
            }
            _ => {
                if let Ok(n) = idem.purge_expired().await {
                    purged += n;
                }
            }
        }
    }
    tokio::time::sleep(Duration::from_secs(3)).await;
    for child in &mut children {
        signal(child.id(), "-CONT");
        let _ = child.wait();
    }
    // Every orphan's lease passes; the survivors' retries settle every key.
    tokio::time::sleep(LEASE * 2).await;
    let mut bad = Vec::new();
    for k in 0..keys() {
        let key = format!("k{k}");
        let _ = charge(&idem, &key, Duration::ZERO).await;
        let (charges, state) = charges_and_state(&store, &key).await;
        if charges != 1 || state != Some(1) {
            bad.push(format!("{key}: {charges} charges, state {state:?}"));
        }
    }
    let log = log.lock().expect("log").clone();
    eprintln!("kills {kills}, stops {stops}, purged {purged}");
    for line in &log {
        eprintln!("{line}");
    }
    let slow: Vec<_> = log
        .iter()
        .filter(|l| (l.contains("SLOW") && l.starts_with(&observer)) || l.contains("WRONG"))
        .collect();
    assert!(bad.is_empty(), "keys charged other than once: {bad:?}");
    assert!(
        slow.is_empty(),
        "calls past twice the store budget, or wrong replays: {slow:?}"
    );
}

const OPEN_ENV: &str = "IDEM_SQLITE_OPEN_CHILD";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "child process of the concurrent-open test"]
async fn open_child() {
    let spec = std::env::var(OPEN_ENV).expect("run by the open test");
    let (db, go) = spec.split_once('|').expect("spec");
    while !Path::new(go).exists() {
        std::thread::yield_now();
    }
    match SqliteStore::open(db).await {
        Ok(_) => println!("OPENED"),
        Err(e) => println!("FAILED {e}"),
    }
}

/// Workers of one service started together on a new file all open it.
#[test]
fn several_processes_open_a_new_file_at_once() {
    let mut failures = Vec::new();
    for round in 0..15 {
        let dir = tempfile::tempdir().expect("dir");
        let db = dir.path().join("new.db");
        let go = dir.path().join("go");
        let children: Vec<Child> = (0..6)
            .map(|_| {
                Command::new(std::env::current_exe().expect("test binary"))
                    .args([
                        "--ignored",
                        "--exact",
                        "open_child",
                        "--nocapture",
                        "--test-threads=1",
                    ])
                    .env(OPEN_ENV, format!("{}|{}", db.display(), go.display()))
                    .stdout(Stdio::piped())
                    .stderr(Stdio::null())
                    .spawn()
                    .expect("spawn")
            })
            .collect();
        std::thread::sleep(Duration::from_millis(300));
        std::fs::write(&go, b"").expect("go");
        for child in children {
            let out = child.wait_with_output().expect("wait");
            let text = String::from_utf8_lossy(&out.stdout);
            for line in text.lines().filter(|l| l.starts_with("FAILED")) {
                failures.push(format!("round {round}: {line}"));
            }
        }
    }
    assert!(failures.is_empty(), "{failures:#?}");
}

/// Fills the file system holding `dir` (a small tmpfs): writes a filler file until it is full.
fn fill(dir: &Path) -> PathBuf {
    use std::io::Write;
    let filler = dir.join("filler");
    let mut file = std::fs::File::create(&filler).expect("filler");
    let chunk = vec![0u8; 4096];
    while file.write_all(&chunk).is_ok() {}
    let _ = file.sync_all();
    filler
}

/// The disk full during traffic (C6, C8, C13): two processes charge while the file system
/// holding the database fills up, then is freed. Every key ends with one charge and its
/// record, nothing waits past twice the budget, no replay is another request's.
/// `CHAOS_DIR` names a small file system (`mount -t tmpfs -o size=16m tmpfs DIR`), of 16 MiB
/// at least: the WAL alone grows to SQLite's automatic checkpoint (1000 pages, about 4 MiB)
/// and keeps that size, so on 4 MiB it fills the file system by itself before the filler does,
/// and removing the filler gives nothing back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs CHAOS_DIR on a small tmpfs"]
async fn c06_c13_disk_full_during_traffic_one_charge_per_key() {
    let dir = PathBuf::from(std::env::var("CHAOS_DIR").expect("CHAOS_DIR"));
    let db = dir.join("full.db");
    let store = SqliteStore::open(&db).await.expect("open");
    common::with_intent_charges(&store).await;
    let idem = Idempotency::with_policy(store.clone(), policy()).expect("policy");
    let log = Arc::new(Mutex::new(Vec::new()));
    let run_for = Duration::from_secs(
        std::env::var("CHAOS_SECS")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(20),
    );
    let end = Instant::now() + run_for;
    let left = |end: Instant| end.saturating_duration_since(Instant::now()).as_millis() as u64;
    let mut children: Vec<Child> = (0..2)
        .map(|_| spawn(&db, left(end), Arc::clone(&log)))
        .collect();
    tokio::time::sleep(run_for / 5).await;
    let filler = fill(&dir);
    eprintln!("disk full");
    let mut full_errors = 0;
    let full_until = Instant::now() + run_for * 2 / 5;
    while Instant::now() < full_until {
        tokio::time::sleep(Duration::from_millis(200)).await;
        if idem.purge_expired().await.is_err() {
            full_errors += 1;
        }
    }
    std::fs::remove_file(&filler).expect("free the disk");
    eprintln!("disk freed ({full_errors} purge errors while full)");
    for child in &mut children {
        let _ = child.wait();
    }
    tokio::time::sleep(LEASE * 2).await;
    let mut bad = Vec::new();
    for k in 0..keys() {
        let key = format!("k{k}");
        let last = charge(&idem, &key, Duration::ZERO).await;
        let (charges, state) = charges_and_state(&store, &key).await;
        if charges != 1 || state != Some(1) {
            bad.push(format!(
                "{key}: {charges} charges, state {state:?}, last {:?}",
                last.map(|o| format!("{o:?}").chars().take(60).collect::<String>())
                    .map_err(|e| e.to_string())
            ));
        }
    }
    let log = log.lock().expect("log").clone();
    for line in &log {
        eprintln!("{line}");
    }
    let slow: Vec<_> = log
        .iter()
        .filter(|l| l.contains("SLOW") || l.contains("WRONG"))
        .collect();
    assert!(bad.is_empty(), "keys charged other than once: {bad:#?}");
    assert!(
        slow.is_empty(),
        "calls past twice the store budget, or wrong replays: {slow:?}"
    );
}
