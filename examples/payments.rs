//! A small charge service on SQLite, in front of a slow card network, driven by a client whose
//! network misbehaves.
//!
//! `cargo run --example payments`
//!
//! The service charges cards the way a payments team should:
//!
//! - `idem.run` runs each charge on a task of its own: when the client gives up (a real server
//!   drops the request's future on disconnect, and so does this demo: no `tokio::spawn` around
//!   the attempt), the charge still finishes and its answer is stored for the retry;
//! - the card network is called with a key derived from the idempotency key, so that a retry
//!   that must run again after a crash cannot charge the card twice;
//! - the lease (1 s) is renewed on a heartbeat while the network is slow, so no retry takes the
//!   key over from a charge that is still running;
//! - the charge row and the idempotency completion commit in one SQLite transaction;
//! - when the network's answer never comes (the call times out after the request was sent),
//!   the handler says the outcome is unknown: the key is kept with a 500 answer in doubt, and
//!   a reconciler asks the network later by the same derived key, then settles the record with
//!   the real charge or releases the key (docs/state-machine.md, "Records in doubt").
//!
//! The client times out and retries, fires concurrent duplicates, reuses a key with another
//! amount, meets a network slower than the lease, retries after the server died mid-charge, and
//! meets a network whose answer is lost, or that never got the charge. The last lines check that
//! cards were charged once per intent (counted at the network, the downstream effect) and that
//! the local table agrees.

use idem::ops::Operator;
use idem::ops::{Decided, Finding, InDoubt, Reconciled};
use idem::sqlite::rusqlite::{params, TransactionBehavior};
use idem::sqlite::SqliteStore;
use idem::store::Deadline;
use idem::tower::canonical::canonical_json;
use idem::{
    Answer, Begin, Context, Failure, Idempotency, Outcome, Policy, Request, RunError,
    StoredResponse,
};
use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// What goes wrong with the next call to the card network (once).
#[derive(Default, Clone, Copy, PartialEq, Eq)]
enum Fault {
    #[default]
    None,
    /// The network charges the card, and its answer never arrives.
    AnswerLost,
    /// The request never reaches the network.
    Unreachable,
}

/// The card network: slow, and idempotent by the key its callers send (as real ones are).
#[derive(Default)]
struct CardNetwork {
    latency_ms: AtomicUsize,
    /// How long the service waits for an answer (its HTTP client's timeout).
    timeout_ms: AtomicUsize,
    /// Authorisation requests the network received.
    calls: AtomicUsize,
    /// Lookups by key (a reconciler asking what became of a request).
    lookups: AtomicUsize,
    fault: Mutex<Fault>,
    /// Authorisations by downstream key: each one is money taken from a card.
    authorised: Mutex<HashMap<String, (String, i64)>>,
}

impl CardNetwork {
    async fn authorise(&self, key: &str, amount: i64) -> Result<String, String> {
        let fault = self
            .fault
            .lock()
            .map(|mut fault| std::mem::take(&mut *fault))
            .unwrap_or_default();
        if fault == Fault::Unreachable {
            std::future::pending::<()>().await;
        }
        self.calls.fetch_add(1, Ordering::SeqCst);
        let latency = self.latency_ms.load(Ordering::SeqCst) as u64;
        tokio::time::sleep(Duration::from_millis(latency)).await;
        let (id, charged) = {
            let mut authorised = self.authorised.lock().map_err(|e| e.to_string())?;
            let next = authorised.len() + 1;
            authorised
                .entry(key.to_owned())
                .or_insert_with(|| (format!("auth_{next}"), amount))
                .clone()
        };
        if fault == Fault::AnswerLost {
            std::future::pending::<()>().await;
        }
        if charged != amount {
            return Err(format!("key {key} was used for {charged}, not {amount}"));
        }
        Ok(id)
    }

    /// `GET /v1/authorizations?idempotency_key=...`: the authorisation made under `key`, if any.
    fn lookup(&self, key: &str) -> Result<Option<(String, i64)>, String> {
        self.lookups.fetch_add(1, Ordering::SeqCst);
        let authorised = self.authorised.lock().map_err(|e| e.to_string())?;
        Ok(authorised.get(key).cloned())
    }

    fn fail_next(&self, fault: Fault) {
        if let Ok(mut next) = self.fault.lock() {
            *next = fault;
        }
    }

    fn timeout(&self) -> Duration {
        Duration::from_millis(self.timeout_ms.load(Ordering::SeqCst) as u64)
    }

    fn cards_charged(&self) -> usize {
        self.authorised
            .lock()
            .map(|a| a.len())
            .unwrap_or(usize::MAX)
    }
}

/// What the service answers, as an HTTP server would put it on the wire.
fn wire(status: u16, replayed: bool, retry_after: Option<&[u8]>, body: &[u8]) -> String {
    let problem = problem_title(body);
    let outcome = match (status, replayed) {
        (_, true) => "replayed",
        (409, _) => "in flight",
        (422, _) => "mismatch",
        (500, _) if problem.as_deref() == Some("outcome-unknown") => "in doubt",
        (s, _) if s < 400 => "executed",
        _ => "error",
    };
    let status = match retry_after {
        Some(secs) => format!("{status} (Retry-After: {})", String::from_utf8_lossy(secs)),
        None => status.to_string(),
    };
    let body = match problem {
        Some(title) if replayed || outcome == "in doubt" => format!("problem {title}"),
        _ if replayed || outcome == "executed" => String::from_utf8_lossy(body).into_owned(),
        _ => String::new(),
    };
    format!("{outcome:<10} {status:<21} {body}")
}

/// The `title` of an RFC 9457 problem body (`outcome-unknown`), if `body` is one.
fn problem_title(body: &[u8]) -> Option<String> {
    let problem = serde_json::from_slice::<serde_json::Value>(body).ok()?;
    problem["type"].as_str()?;
    problem["title"].as_str().map(str::to_owned)
}

/// The charge service.
#[derive(Clone)]
struct Service {
    idem: Idempotency<SqliteStore>,
    network: Arc<CardNetwork>,
}

impl Service {
    /// `POST /v1/charges` with an `Idempotency-Key` header and `{"amount": cents}`: what goes
    /// on the wire.
    async fn charge(&self, key: &str, body: &str) -> String {
        let request = match self.request(key, body) {
            Ok(request) => request,
            // A bad key or a body over the limit: nothing ran.
            Err(error) => return format!("refused    {error}"),
        };
        let amount = amount_of(body);
        let network = Arc::clone(&self.network);
        let outcome = self
            .idem
            .run(&request, move |ctx| charge_card(ctx, network, amount))
            .await;
        match outcome {
            Ok(Outcome::Executed(sent) | Outcome::Refused(sent)) => {
                wire(sent.status, false, None, &sent.body)
            }
            // What the HTTP layer (`idem::tower`) answers in place of running the charge.
            Ok(Outcome::Answered(Answer::Replay(stored))) => {
                wire(stored.status, true, None, &stored.body)
            }
            Ok(Outcome::Answered(Answer::InFlight { retry_after })) => {
                let secs = retry_after.as_millis().div_ceil(1000).max(1).to_string();
                wire(409, false, Some(secs.as_bytes()), b"")
            }
            Ok(Outcome::Answered(Answer::Mismatch)) => wire(422, false, None, b""),
            Err(RunError::Unknown { response, .. }) => {
                wire(response.status, false, None, &response.body)
            }
            Err(error) => format!("failed     {error}"),
        }
    }

    /// What a server process that dies mid-charge leaves behind: the key reserved, the card
    /// authorised, no local commit and no answer (the real SIGKILL test is
    /// idem-sqlite/tests/crash.rs).
    async fn charge_and_die(&self, key: &str, body: &str) -> String {
        let Ok(request) = self.request(key, body) else {
            return "bad request".to_owned();
        };
        if let Ok(Begin::Acquired(lease)) = self.idem.begin(&request).await {
            let _ = self
                .network
                .authorise(&lease.downstream_key(), amount_of(body))
                .await;
        }
        format!("{:<10} {:<21}", "no answer", "-")
    }

    /// The idempotent request of a charge: the client's JSON in canonical form (what the HTTP
    /// layer makes of it), its send time left out of the fingerprint.
    fn request(&self, key: &str, body: &str) -> Result<Request, idem::Error> {
        let canonical = canonical_json(body.as_bytes(), &["/client_sent_at"])?;
        self.idem
            .request("acct_demo", "POST", "/v1/charges")
            .key(Some(key))
            .body(body.as_bytes())
            .canonical_json(&canonical)
            .build()
    }

    /// The reconciler: asks the card network what became of a charge in doubt, by the key the
    /// handler sent it.
    async fn check(&self, case: InDoubt) -> Finding {
        let key = case.downstream_key();
        let asked = format!("GET /v1/authorizations?idempotency_key={key}");
        match self.network.lookup(&key) {
            Err(error) => Finding::still_unknown().asked(asked).answered(error),
            Ok(None) => Finding::not_happened()
                .asked(asked)
                .answered("no authorisation under this key"),
            Ok(Some((id, amount))) => {
                // The charge row is a step of its own, before the settlement: keyed by the
                // authorisation, so a pass that dies between the two writes it once.
                let auth = id.clone();
                let recorded = self
                    .idem
                    .store()
                    .try_call(move |db| {
                        db.execute(
                            "INSERT INTO charges (amount, authorization_id) VALUES (?1, ?2) \
                             ON CONFLICT (authorization_id) DO NOTHING",
                            params![amount, auth],
                        )
                    })
                    .await;
                match recorded {
                    Ok(_) => Finding::settled(charge_response(&id, amount))
                        .asked(asked)
                        .answered(format!("{id}, {amount} authorised")),
                    Err(error) => Finding::still_unknown().asked(asked).answered(format!(
                        "{id} found; the charge row could not be written: {error}"
                    )),
                }
            }
        }
    }

    /// One reconciliation pass over the records in doubt, as a wire-like line.
    async fn reconcile(&self) -> String {
        let pass = idem::ops::reconcile_now(&self.idem, &|case: InDoubt| self.check(case)).await;
        let summary = match pass {
            Ok(Reconciled {
                checked,
                settled,
                released,
                deferred,
                failed,
                ..
            }) => {
                let did = [
                    ("settled", settled),
                    ("released", released),
                    ("still unknown", deferred),
                    ("failed", failed),
                ];
                let did: Vec<_> = did
                    .iter()
                    .filter(|(_, n)| *n > 0)
                    .map(|(what, n)| format!("{n} {what}"))
                    .collect();
                format!("{checked} checked: {}", did.join(", "))
            }
            Err(error) => format!("failed: {error}"),
        };
        format!("{:<10} {:<21} {summary}", "reconciled", "-")
    }

    /// The audit trail of the record of `key`: one entry per decision about it.
    async fn print_trail(&self, key: &str, body: &str) -> Result<(), BoxError> {
        let request = self.request(key, body)?;
        let trail = self
            .idem
            .store()
            .reconciliations(request.id(), Deadline::default())
            .await?;
        println!("  the audit trail of {key}:");
        for entry in trail {
            let decided = match entry.decided {
                Decided::Settled { status } => format!("settled with {status}"),
                Decided::StillUnknown { attempt, .. } => format!("still unknown (#{attempt})"),
                other => other.name().to_owned(),
            };
            println!(
                "    {} UTC  by {}: {decided}",
                time_of_day(entry.at.as_millis()),
                entry.by
            );
            println!("      asked {} -> {}", entry.asked, entry.answer);
        }
        Ok(())
    }

    async fn charges(&self) -> i64 {
        self.idem
            .store()
            .try_call(|db| db.query_row("SELECT COUNT(*) FROM charges", [], |r| r.get(0)))
            .await
            .unwrap_or(-1)
    }
}

/// The handler: authorise on the card network (renewing the lease while it is slow), then the
/// charge row and the completion in one transaction.
async fn charge_card(
    mut ctx: Context<SqliteStore>,
    network: Arc<CardNetwork>,
    amount: i64,
) -> Result<idem::Completion, Failure<BoxError>> {
    let heartbeat = ctx.idem().policy().lease / 3;
    // The charge downstream carries a key derived from the record's identity: the same on
    // every retry and takeover, and what a reconciler asks the network by.
    let downstream_key = ctx.downstream_key();
    let call = network.authorise(&downstream_key, amount);
    let deadline = tokio::time::sleep(network.timeout());
    tokio::pin!(call, deadline);
    let authorisation = loop {
        tokio::select! {
            result = &mut call => break result,
            _ = &mut deadline => {
                // The request went out and no answer came: the card may have been charged.
                // The key stays taken, in doubt, until a reconciler asks the network.
                return Err(Failure::unknown("the card network timed out".into())
                    .noting(downstream_key.as_str()));
            }
            _ = tokio::time::sleep(heartbeat) => {
                // Lost means another attempt holds the key: stop; the network's key keeps the
                // card from being charged twice whatever happens next.
                ctx.renew().await.map_err(|e| Failure::unknown(e.into()))?;
            }
        }
    };
    let (response, authorised) = match authorisation {
        Ok(id) => (charge_response(&id, amount), Some(id)),
        // A decline is an answer: stored and replayed.
        Err(reason) => (
            StoredResponse::new(402, format!("{{\"error\":\"{reason}\"}}")),
            None,
        ),
    };
    let completion = ctx.completion(response);
    let store = ctx.idem().store().clone();
    let (writer, written) = (store.clone(), completion.clone());
    let local = store
        .call(move |db| -> Result<(), BoxError> {
            let tx = db.transaction_with_behavior(TransactionBehavior::Immediate)?;
            if let Some(id) = authorised {
                tx.execute(
                    "INSERT INTO charges (amount, authorization_id) VALUES (?1, ?2)",
                    params![amount, id],
                )?;
            }
            writer.complete_in(&tx, &written)?; // lease lost: roll back
            tx.commit()?;
            Ok(())
        })
        .await;
    match local {
        Ok(Ok(())) => Ok(completion),
        // The local transaction rolled back: nothing happened here, and the network's key makes
        // a retry safe, so give the key back.
        Ok(Err(error)) => Err(Failure::nothing_happened(error)),
        Err(error) => Err(Failure::nothing_happened(error.into())),
    }
}

/// The service's answer to an authorised charge (the handler's, and the reconciler's).
fn charge_response(authorisation: &str, amount: i64) -> StoredResponse {
    StoredResponse::new(
        201,
        format!("{{\"charge\":\"{authorisation}\",\"amount\":{amount}}}"),
    )
    .with_header("content-type", "application/json")
}

fn amount_of(body: &str) -> i64 {
    serde_json::from_str::<serde_json::Value>(body)
        .ok()
        .and_then(|v| v["amount"].as_i64())
        .unwrap_or(0)
}

/// `HH:MM:SS.mmm` (UTC) of a timestamp in milliseconds since the epoch.
fn time_of_day(millis: u64) -> String {
    let (secs, ms) = (millis / 1000, millis % 1000);
    let (h, m, s) = ((secs / 3600) % 24, (secs / 60) % 60, secs % 60);
    format!("{h:02}:{m:02}:{s:02}.{ms:03}")
}

/// One attempt of the client: it waits at most `patience`, then drops the request, as a client
/// disconnect makes a real server drop the handler's future.
async fn attempt(service: &Service, key: &str, body: &str, patience: Duration) -> String {
    match tokio::time::timeout(patience, service.charge(key, body)).await {
        Ok(line) => line,
        Err(_) => format!("{:<10} {:<21}", "gave up", "-"),
    }
}

fn row(label: &str, line: &str, service_charges: i64, network: &CardNetwork) {
    println!(
        "  {label:<32} {line:<60} local {service_charges}, cards {}",
        network.cards_charged()
    );
}

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("payments.db");
    let store = SqliteStore::open(&path).await?;
    store
        .try_call(|db| {
            db.execute_batch(
                "CREATE TABLE charges (id INTEGER PRIMARY KEY, amount INTEGER NOT NULL, \
                 authorization_id TEXT NOT NULL UNIQUE)",
            )
        })
        .await?;
    let lease = Duration::from_secs(1);
    let idem = Idempotency::with_policy(store, Policy::default().lease(lease))?;
    let network = Arc::new(CardNetwork::default());
    network.latency_ms.store(300, Ordering::SeqCst);
    network.timeout_ms.store(3_000, Ordering::SeqCst);
    let service = Service {
        idem,
        network: Arc::clone(&network),
    };
    let patient = Duration::from_secs(10);
    let mut intents = 0;
    println!("idem demo: a charge service on SQLite ({})", path.display());

    println!("\n1. The client gives up at 100 ms while the card network takes 300 ms, and retries");
    intents += 1;
    let body = r#"{"amount": 2500, "client_sent_at": "10:00:00"}"#;
    let line = attempt(&service, "key-timeout", body, Duration::from_millis(100)).await;
    row("1  gives up", &line, service.charges().await, &network);
    let again = r#"{"client_sent_at": "10:00:01", "amount": 2500}"#;
    let line = attempt(&service, "key-timeout", again, patient).await;
    row(
        "2  at once, same intent",
        &line,
        service.charges().await,
        &network,
    );
    tokio::time::sleep(Duration::from_millis(400)).await;
    let line = attempt(&service, "key-timeout", body, patient).await;
    row(
        "3  after Retry-After",
        &line,
        service.charges().await,
        &network,
    );

    println!("\n2. 16 concurrent duplicates (a double-click storm)");
    intents += 1;
    let storm: Vec<_> = (0..16)
        .map(|_| {
            let service = service.clone();
            tokio::spawn(async move {
                attempt(&service, "key-storm", r#"{"amount": 990}"#, patient).await
            })
        })
        .collect();
    let mut tally = std::collections::BTreeMap::<String, usize>::new();
    for task in storm {
        let line = task.await?;
        let kind = line
            .split_whitespace()
            .take(2)
            .collect::<Vec<_>>()
            .join(" ");
        *tally.entry(kind).or_default() += 1;
    }
    for (kind, count) in &tally {
        println!("  {count:>2} of 16 got {kind}");
    }
    let line = attempt(&service, "key-storm", r#"{"amount": 990}"#, patient).await;
    row(
        "a retry after the storm",
        &line,
        service.charges().await,
        &network,
    );

    println!("\n3. The same key reused with another amount");
    intents += 1;
    let line = attempt(&service, "key-reused", r#"{"amount": 4000}"#, patient).await;
    row("amount 4000", &line, service.charges().await, &network);
    let line = attempt(&service, "key-reused", r#"{"amount": 9900}"#, patient).await;
    row(
        "amount 9900, same key",
        &line,
        service.charges().await,
        &network,
    );

    println!("\n4. The card network takes 2.5 s, longer than the 1 s lease; the lease is renewed");
    intents += 1;
    network.latency_ms.store(2_500, Ordering::SeqCst);
    let slow = {
        let service = service.clone();
        tokio::spawn(
            async move { attempt(&service, "key-slow", r#"{"amount": 1200}"#, patient).await },
        )
    };
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    let line = attempt(&service, "key-slow", r#"{"amount": 1200}"#, patient).await;
    row(
        "1  a retry at 1.5 s",
        &line,
        service.charges().await,
        &network,
    );
    let line = slow.await?;
    row(
        "2  the first attempt",
        &line,
        service.charges().await,
        &network,
    );
    network.latency_ms.store(300, Ordering::SeqCst);

    println!("\n5. The server dies after the card network answered, before its commit");
    intents += 1;
    let body = r#"{"amount": 7000}"#;
    let line = service.charge_and_die("key-crash", body).await;
    row("1  server dies", &line, service.charges().await, &network);
    let line = attempt(&service, "key-crash", body, patient).await;
    row("2  at once", &line, service.charges().await, &network);
    tokio::time::sleep(lease + Duration::from_millis(100)).await;
    let line = attempt(&service, "key-crash", body, patient).await;
    row(
        "3  after the 1 s lease",
        &line,
        service.charges().await,
        &network,
    );
    let line = attempt(&service, "key-crash", body, patient).await;
    row("4  once more", &line, service.charges().await, &network);

    println!(
        "\n6. The card network charges the card and its answer never arrives (the call times out)"
    );
    intents += 1;
    // The service waits 500 ms here, to keep the demo short.
    network.timeout_ms.store(500, Ordering::SeqCst);
    let calls = network.calls.load(Ordering::SeqCst);
    let lookups = network.lookups.load(Ordering::SeqCst);
    let body = r#"{"amount": 3100}"#;
    network.fail_next(Fault::AnswerLost);
    let line = attempt(&service, "key-lost", body, patient).await;
    row(
        "1  the call times out",
        &line,
        service.charges().await,
        &network,
    );
    let line = attempt(&service, "key-lost", body, patient).await;
    row("2  a retry", &line, service.charges().await, &network);
    let line = service.reconcile().await;
    row(
        "3  the reconciler asks",
        &line,
        service.charges().await,
        &network,
    );
    let line = attempt(&service, "key-lost", body, patient).await;
    row(
        "4  the next retry",
        &line,
        service.charges().await,
        &network,
    );
    println!(
        "  at the network: authorisation requests {}, lookups {}",
        network.calls.load(Ordering::SeqCst) - calls,
        network.lookups.load(Ordering::SeqCst) - lookups
    );
    service.print_trail("key-lost", body).await?;

    println!("\n7. The card network never receives the charge (the call times out before it)");
    intents += 1;
    let body = r#"{"amount": 5600}"#;
    network.fail_next(Fault::Unreachable);
    let line = attempt(&service, "key-unreached", body, patient).await;
    row(
        "1  the call times out",
        &line,
        service.charges().await,
        &network,
    );
    let line = service.reconcile().await;
    row(
        "2  the reconciler asks",
        &line,
        service.charges().await,
        &network,
    );
    let line = attempt(&service, "key-unreached", body, patient).await;
    row("3  a retry", &line, service.charges().await, &network);
    network.timeout_ms.store(3_000, Ordering::SeqCst);

    let (local, cards) = (service.charges().await, network.cards_charged());
    let calls = network.calls.load(Ordering::SeqCst);
    println!(
        "\nintents: {intents}; cards charged at the network: {cards}; local charges: {local}; network calls: {calls} (the crash's retry called again with the same key)"
    );
    if cards != intents || local != intents as i64 {
        return Err(
            format!("{cards} cards and {local} local charges for {intents} intents").into(),
        );
    }
    println!("one charge per intent, at the network and locally: ok");
    Ok(())
}
