//! A small charge service on SQLite, driven by a client whose network misbehaves.
//!
//! `cargo run --example payments`
//!
//! The service charges cards with idem's guard style: reserve the key, call the (slow) card
//! network, then write the charge and the idempotency completion in one SQLite transaction.
//! The client times out and retries, fires concurrent duplicates, reuses a key with another
//! amount, and retries after the server crashed mid-charge. Every scenario prints what each
//! attempt got and how many charges exist; the last line checks one charge per intent.

use idem::sqlite::rusqlite::{params, TransactionBehavior};
use idem::sqlite::{SqliteIdempotency, SqliteStore};
use idem::{retry_after_secs, Begin, Error, Idempotency, Lease, Policy, StoredResponse};
use std::time::Duration;

/// What the service answers, as an HTTP server would put it on the wire.
#[derive(Debug, Clone)]
struct Reply {
    status: u16,
    replayed: bool,
    retry_after: Option<u64>,
    body: String,
}

impl Reply {
    fn sent(response: StoredResponse, replayed: bool) -> Self {
        Self {
            status: response.status,
            replayed,
            retry_after: None,
            body: String::from_utf8_lossy(&response.body).into_owned(),
        }
    }

    fn problem(status: u16, kind: &str, retry_after: Option<Duration>) -> Self {
        Self {
            status,
            replayed: false,
            retry_after: retry_after.map(retry_after_secs),
            body: format!("{{\"type\":\"https://idem.rs/problems/{kind}\"}}"),
        }
    }

    fn from_error(error: &Error) -> Self {
        let kind = match error {
            Error::InvalidInput { .. } => "idempotency-key-invalid",
            Error::BodyTooLarge { .. } => "body-too-large",
            Error::StoreUnavailable(_) => "store-unavailable",
            _ => "internal",
        };
        Self::problem(error.http_status(), kind, None)
    }

    fn outcome(&self) -> &'static str {
        match (self.status, self.replayed) {
            (_, true) => "replayed",
            (409, _) => "in flight",
            (422, _) => "mismatch",
            (s, _) if s < 400 => "executed",
            _ => "error",
        }
    }
}

/// The charge service.
#[derive(Clone)]
struct Service {
    idem: Idempotency<SqliteStore>,
    card_network: Duration,
}

impl Service {
    /// `POST /v1/charges` with an `Idempotency-Key` header and `{"amount": cents}`.
    async fn charge(&self, key: &str, body: &str) -> Reply {
        let lease = match self.reserve(key, body).await {
            Ok(lease) => lease,
            Err(reply) => return reply,
        };
        let amount = amount_of(body);
        tokio::time::sleep(self.card_network).await; // authorise with the card network
        let idem = self.idem.clone();
        let committed = self
            .idem
            .store()
            .call(move |db| {
                let tx = db
                    .transaction_with_behavior(TransactionBehavior::Immediate)
                    .map_err(Error::unavailable)?;
                tx.execute("INSERT INTO charges (amount) VALUES (?1)", params![amount])
                    .map_err(Error::unavailable)?;
                let id = tx.last_insert_rowid();
                let response = StoredResponse::new(
                    201,
                    format!("{{\"charge\":\"ch_{id}\",\"amount\":{amount}}}"),
                )
                .with_header("content-type", "application/json");
                let sent = idem.complete_in(&tx, &lease, response)?;
                tx.commit().map_err(Error::unavailable)?;
                Ok::<_, Error>(sent)
            })
            .await
            .and_then(|result| result);
        match committed {
            Ok(sent) => Reply::sent(sent, false),
            Err(error) => Reply::from_error(&error),
        }
    }

    /// The same charge, but the server process dies after writing the charge and before the
    /// commit: the transaction is abandoned, exactly what a killed process leaves behind (the
    /// real SIGKILL test is idem-sqlite/tests/crash.rs). The client gets no answer.
    async fn charge_and_crash(&self, key: &str, body: &str) -> Option<Reply> {
        let lease = match self.reserve(key, body).await {
            Ok(lease) => lease,
            Err(reply) => return Some(reply),
        };
        let amount = amount_of(body);
        let idem = self.idem.clone();
        let _ = self
            .idem
            .store()
            .call(move |db| {
                let tx = db.transaction().map_err(Error::unavailable)?;
                tx.execute("INSERT INTO charges (amount) VALUES (?1)", params![amount])
                    .map_err(Error::unavailable)?;
                idem.complete_in(&tx, &lease, StoredResponse::new(201, "never committed"))?;
                drop(tx); // the process dies here: no commit
                Ok::<_, Error>(())
            })
            .await;
        None
    }

    async fn reserve(&self, key: &str, body: &str) -> Result<Lease, Reply> {
        let request = self
            .idem
            .request("acct_demo", "POST", "/v1/charges")
            .key(Some(key))
            .json_body(body.as_bytes(), &["client_sent_at"])
            .build()
            .map_err(|e| Reply::from_error(&e))?;
        match self.idem.begin(&request).await {
            Ok(Begin::Acquired(lease)) => Ok(lease),
            Ok(Begin::Replay(stored)) => Err(Reply::sent(stored, true)),
            Ok(Begin::InFlight { retry_after }) => Err(Reply::problem(
                409,
                "request-in-progress",
                Some(retry_after),
            )),
            Ok(Begin::Mismatch) => Err(Reply::problem(422, "idempotency-key-reused", None)),
            Err(error) => Err(Reply::from_error(&error)),
        }
    }

    async fn charges(&self) -> i64 {
        self.idem
            .store()
            .call(|db| db.query_row("SELECT COUNT(*) FROM charges", [], |r| r.get(0)))
            .await
            .ok()
            .and_then(Result::ok)
            .unwrap_or(-1)
    }
}

fn amount_of(body: &str) -> i64 {
    serde_json::from_str::<serde_json::Value>(body)
        .ok()
        .and_then(|v| v["amount"].as_i64())
        .unwrap_or(0)
}

/// The client's side of one attempt: the request runs on the server whatever the client does,
/// as it would on a real server; the client may stop waiting for the answer.
async fn attempt(
    service: &Service,
    key: &str,
    body: &str,
    client_timeout: Duration,
) -> Option<Reply> {
    let (service, key, body) = (service.clone(), key.to_owned(), body.to_owned());
    let server = tokio::spawn(async move { service.charge(&key, &body).await });
    tokio::time::timeout(client_timeout, server)
        .await
        .ok()
        .and_then(Result::ok)
}

fn row(label: &str, reply: Option<&Reply>, charges: i64) {
    let body = reply
        .filter(|r| r.status < 300)
        .map_or("", |r| r.body.as_str());
    let (outcome, status) = match reply {
        Some(r) => {
            let status = match r.retry_after {
                Some(s) => format!("{} (Retry-After: {s})", r.status),
                None => r.status.to_string(),
            };
            (r.outcome().to_owned(), status)
        }
        None => ("no answer".to_owned(), "-".to_owned()),
    };
    println!("  {label:<30} {outcome:<10} {status:<21} {charges:<8} {body}");
}

fn header(title: &str) {
    println!("\n{title}");
    println!(
        "  {:<30} {:<10} {:<21} {:<8} body",
        "attempt", "outcome", "HTTP status", "charges"
    );
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("payments.db");
    let store = SqliteStore::open(&path).await?;
    store
        .call(|db| {
            db.execute_batch(
                "CREATE TABLE charges (id INTEGER PRIMARY KEY, amount INTEGER NOT NULL)",
            )
        })
        .await??;
    let lease = Duration::from_secs(1);
    let idem = Idempotency::with_policy(store, Policy::default().lease(lease))?;
    let service = Service {
        idem,
        card_network: Duration::from_millis(300),
    };
    let patient = Duration::from_secs(5);
    let mut intents = 0;
    println!("idem demo: a charge service on SQLite ({})", path.display());

    header("1. The client times out at 100 ms while the card network takes 300 ms, and retries");
    intents += 1;
    let body = r#"{"amount": 2500, "client_sent_at": "10:00:00"}"#;
    let first = attempt(&service, "key-timeout", body, Duration::from_millis(100)).await;
    row("1  (times out)", first.as_ref(), service.charges().await);
    let second = attempt(
        &service,
        "key-timeout",
        r#"{"client_sent_at": "10:00:01", "amount": 2500}"#,
        patient,
    )
    .await;
    row(
        "2  at once, same intent",
        second.as_ref(),
        service.charges().await,
    );
    tokio::time::sleep(Duration::from_millis(400)).await;
    let third = attempt(&service, "key-timeout", body, patient).await;
    row(
        "3  after Retry-After",
        third.as_ref(),
        service.charges().await,
    );

    header("2. 16 concurrent duplicates (a double-click storm)");
    intents += 1;
    let body = r#"{"amount": 990}"#;
    let storm: Vec<_> = (0..16)
        .map(|_| {
            let service = service.clone();
            tokio::spawn(async move { attempt(&service, "key-storm", body, patient).await })
        })
        .collect();
    let mut tally = std::collections::BTreeMap::<(String, u16), usize>::new();
    for task in storm {
        if let Some(reply) = task.await? {
            *tally
                .entry((reply.outcome().to_owned(), reply.status))
                .or_default() += 1;
        }
    }
    for ((outcome, status), count) in &tally {
        println!(
            "  {:<30} {outcome:<10} {status:<21} {}",
            format!("{count} of 16 got"),
            service.charges().await
        );
    }
    let late = attempt(&service, "key-storm", body, patient).await;
    row(
        "a retry after the storm",
        late.as_ref(),
        service.charges().await,
    );

    header("3. The same key reused with another amount");
    intents += 1;
    let ok = attempt(&service, "key-reused", r#"{"amount": 4000}"#, patient).await;
    row("amount 4000", ok.as_ref(), service.charges().await);
    let reused = attempt(&service, "key-reused", r#"{"amount": 9900}"#, patient).await;
    row(
        "amount 9900, same key",
        reused.as_ref(),
        service.charges().await,
    );

    header("4. The server crashes mid-charge; the client retries");
    intents += 1;
    let body = r#"{"amount": 7000}"#;
    let crashed = service.charge_and_crash("key-crash", body).await;
    row(
        "1  server dies before commit",
        crashed.as_ref(),
        service.charges().await,
    );
    let busy = attempt(&service, "key-crash", body, patient).await;
    row("2  at once", busy.as_ref(), service.charges().await);
    tokio::time::sleep(lease + Duration::from_millis(100)).await;
    let retried = attempt(&service, "key-crash", body, patient).await;
    row(
        "3  after the 1 s lease",
        retried.as_ref(),
        service.charges().await,
    );
    let again = attempt(&service, "key-crash", body, patient).await;
    row("4  once more", again.as_ref(), service.charges().await);

    let total = service.charges().await;
    println!("\ntotal charges: {total}, distinct intents: {intents}");
    if total != intents {
        return Err(format!("{total} charges for {intents} intents").into());
    }
    println!("one charge per intent: ok");
    Ok(())
}
