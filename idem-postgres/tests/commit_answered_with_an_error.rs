//! A COMMIT answered with an error after it committed (C8, C16): a pooler whose server
//! connection broke answers `FATAL 08P01`, and a backend terminated after its commit `FATAL
//! 57P01`. Every failed COMMIT is classified by the record (read once no transaction holds
//! it), so the caller is told what committed, and a retry replays it.
//!
//! A small proxy that behaves as PgBouncer does in that case sits between the store and the
//! server: the COMMIT reaches the server, which commits; the client gets `FATAL 08P01`
//! instead of the answer, and the connection closes.

mod common;

use common::{pg_url, SCHEMA};
use idem_core::{
    Answer, Begin, Event, EventKind, FencingToken, Idempotency, Observer, Outcome, Policy,
    RunError, StoredResponse,
};
use idem_postgres::sqlx::{self, AssertSqlSafe, Connection, PgConnection, Row};
use idem_postgres::{PgIdempotency, PgStore};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// The simple-protocol COMMIT sqlx sends.
const COMMIT_QUERY: &[u8] = b"Q\0\0\0\x0bCOMMIT\0";
/// ReadyForQuery, idle: the end of the server's answer to a COMMIT.
const READY_IDLE: &[u8] = b"Z\0\0\0\x05I";

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}

/// PgBouncer's answer to a client whose server connection broke during its query.
fn server_conn_crashed() -> Vec<u8> {
    let mut fields = Vec::new();
    for (code, value) in [
        (b'S', "FATAL"),
        (b'V', "FATAL"),
        (b'C', "08P01"),
        (b'M', "server conn crashed?"),
    ] {
        fields.push(code);
        fields.extend_from_slice(value.as_bytes());
        fields.push(0);
    }
    fields.push(0);
    let mut message = vec![b'E'];
    message.extend_from_slice(
        &u32::try_from(fields.len() + 4)
            .expect("a short message")
            .to_be_bytes(),
    );
    message.extend_from_slice(&fields);
    message
}

/// Forwards to `upstream`; once armed, the first COMMIT reaches the server, and its answer is
/// replaced by `FATAL 08P01` and the connection closed.
async fn proxy(upstream: String, armed: Arc<AtomicBool>) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move {
        loop {
            let Ok((client, _)) = listener.accept().await else {
                return;
            };
            let Ok(server) = TcpStream::connect(&upstream).await else {
                continue;
            };
            let armed = Arc::clone(&armed);
            tokio::spawn(async move {
                let (mut from_client, mut to_client) = client.into_split();
                let (mut from_server, mut to_server) = server.into_split();
                let hit = Arc::new(AtomicBool::new(false));
                let hit_up = Arc::clone(&hit);
                let up = tokio::spawn(async move {
                    let mut buf = vec![0u8; 64 * 1024];
                    loop {
                        let n = match from_client.read(&mut buf).await {
                            Ok(n) if n > 0 => n,
                            _ => return,
                        };
                        if contains(&buf[..n], COMMIT_QUERY) && armed.swap(false, Ordering::SeqCst)
                        {
                            hit_up.store(true, Ordering::SeqCst);
                        }
                        if to_server.write_all(&buf[..n]).await.is_err() {
                            return;
                        }
                    }
                });
                let mut buf = vec![0u8; 64 * 1024];
                let mut swallowed = Vec::new();
                loop {
                    let n = match from_server.read(&mut buf).await {
                        Ok(n) if n > 0 => n,
                        _ => break,
                    };
                    if hit.load(Ordering::SeqCst) {
                        swallowed.extend_from_slice(&buf[..n]);
                        if contains(&swallowed, READY_IDLE) {
                            // The server committed; the client hears the pooler's error.
                            let _ = to_client.write_all(&server_conn_crashed()).await;
                            let _ = to_client.shutdown().await;
                            break;
                        }
                        continue;
                    }
                    if to_client.write_all(&buf[..n]).await.is_err() {
                        break;
                    }
                }
                up.abort();
            });
        }
    });
    let url = pg_url();
    let authority = url
        .split("://")
        .nth(1)
        .and_then(|rest| rest.split('/').next())
        .map(|a| a.rsplit('@').next().unwrap_or(a).to_owned())
        .expect("authority");
    url.replacen(&authority, &addr.to_string(), 1)
}

#[derive(Default)]
struct Kinds(Mutex<Vec<EventKind>>);

impl Observer for Kinds {
    fn observe(&self, event: &Event<'_>) {
        if event.kind() != EventKind::StoreCall {
            self.0.lock().expect("not poisoned").push(event.kind());
        }
    }
}

#[tokio::test]
async fn c08_a_commit_answered_with_an_error_after_it_committed_reports_what_committed() {
    let url = pg_url();
    let upstream = url
        .split("://")
        .nth(1)
        .and_then(|rest| rest.split('/').next())
        .map(|a| a.rsplit('@').next().unwrap_or(a).to_owned())
        .expect("authority");
    let armed = Arc::new(AtomicBool::new(false));
    let through = proxy(upstream, Arc::clone(&armed)).await;
    let store = PgStore::builder()
        .schema(SCHEMA)
        .table(&format!("t_{}", FencingToken::generate()))
        .connect(&through)
        .await
        .expect("connect through the proxy");
    store.migrate().await.expect("migrate");
    let charges = format!("{SCHEMA}.charges_{}", FencingToken::generate());
    let mut direct = PgConnection::connect(&url).await.expect("connect");
    sqlx::raw_sql(AssertSqlSafe(format!(
        "CREATE TABLE {charges} (id bigserial PRIMARY KEY, intent text NOT NULL)"
    )))
    .execute(&mut direct)
    .await
    .expect("charges table");
    let kinds = Arc::new(Kinds::default());
    let idem = Idempotency::builder(store)
        .policy(Policy::default())
        .observer(Arc::clone(&kinds))
        .build()
        .expect("policy");
    let request = idem
        .request("acct", "POST", "/charges")
        .key(Some("commit-error"))
        .body(b"{\"cents\":2500}")
        .build()
        .expect("request");

    armed.store(true, Ordering::SeqCst);
    let insert = format!("INSERT INTO {charges} (intent) VALUES ('commit-error') RETURNING id");
    let first: Result<Outcome, RunError<sqlx::Error>> = idem
        .run_in_transaction(&request, move |tx, _lease| {
            Box::pin(async move {
                let (id,): (i64,) = sqlx::query_as(AssertSqlSafe(insert))
                    .fetch_one(&mut *tx)
                    .await?;
                Ok::<_, sqlx::Error>(StoredResponse::new(201, format!("charge {id}")))
            })
        })
        .await;
    let events = kinds.0.lock().expect("not poisoned").clone();
    assert!(
        !armed.load(Ordering::SeqCst),
        "the COMMIT went through the proxy"
    );

    let committed: i64 = sqlx::raw_sql(AssertSqlSafe(format!("SELECT count(*) FROM {charges}")))
        .fetch_one(&mut direct)
        .await
        .expect("count")
        .try_get(0)
        .expect("count");
    let retry = idem.begin(&request).await.expect("begin");
    let disposition = match &first {
        Ok(outcome) => outcome.kind(),
        Err(error) => error.kind(),
    };
    eprintln!(
        "first = {first:?}\nevents = {events:?}\ndisposition = {disposition}\ncharges committed = {committed}\nretry = {retry:?}"
    );
    assert_eq!(committed, 1, "the server committed the charge");
    assert!(
        matches!(retry, Begin::Answered(Answer::Replay(_))),
        "a retry replays the committed charge"
    );
    assert!(
        matches!(&first, Ok(Outcome::Executed(_))),
        "the charge committed and a retry replays it, but the caller got {first:?} \
         (disposition {disposition}, events {events:?})"
    );
}
