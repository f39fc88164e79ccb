//! The server against the clients of the open internet: slow and stalled raw-socket clients
//! (half a request line, half the headers, half a body), a slow-loris crowd, near-limit uploads
//! that stall, malformed credentials, wrong methods, a database that goes away under a read,
//! and a client that hangs up while its charge is made. Short timeouts are configured so that
//! each test proves the server cuts what it must within them while it keeps serving others.

mod support;

use e2e_support::slow::{
    assert_cut, rounds_during, Lorises, StalledHeads, BODY_TIMEOUT, DEADLINES, HEADER_TIMEOUT,
    SLACK,
};
use e2e_support::{poll, RawClient};
use fault_proxy::{Fault, FaultProxy};
use reqwest::{Method, StatusCode};
use std::time::Duration;
use support::{
    assert_charge, assert_unavailable, new_key, spawn_once, Backend, ChargeRequest, RetryPolicy,
    Server, TestEnv, API_KEY,
};

/// The server on `env` with the tests' short deadlines and the settings `vars`.
async fn start(env: &TestEnv, vars: &[(&str, &str)]) -> Server {
    let mut all = DEADLINES.to_vec();
    all.extend_from_slice(vars);
    Server::start_with(env, &env.database, None, &all).await
}

/// A normal client's charge and read, answered at once while slow clients hold connections.
async fn assert_served(server: &Server, label: &str) {
    let api = server.api();
    let reply = api
        .post_raw(&ChargeRequest::form(&new_key(label), 4242))
        .await;
    assert_charge(&reply, 4242, "usd");
    assert!(
        reply.latency < Duration::from_millis(800),
        "{label}: a normal charge took {:?} beside the slow clients",
        reply.latency
    );
    let list = api.get("/v1/charges?limit=1").await;
    assert_eq!(list.status, StatusCode::OK, "{}", list.describe());
}

/// Half a request line, half the headers, headers then half a body, and a connection that
/// sends nothing: each is closed within its deadline, while a normal client is served.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn stalled_heads_and_bodies_are_cut_within_their_deadlines() {
    let env = TestEnv::new(Backend::Sqlite, "stalled").await;
    let server = start(&env, &[]).await;
    let addr = server.addr().to_owned();

    let heads = StalledHeads::open(
        &addr,
        b"POST /v1/char",
        b"POST /v1/charges HTTP/1.1\r\nHost: x\r\nIdempotency-Key: stalled\r\nContent-Ty",
    )
    .await;
    let mut half_body = RawClient::connect(&addr).await;
    let head = format!(
        "POST /v1/charges HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {API_KEY}\r\n\
         Idempotency-Key: {}\r\nContent-Type: application/x-www-form-urlencoded\r\n\
         Content-Length: 100\r\n\r\namount=4242&curr",
        new_key("half-body")
    );
    assert!(half_body.send(head.as_bytes()).await);

    assert_served(&server, "beside-stalled").await;

    heads.assert_cut().await;
    let closed = assert_cut(&mut half_body, "half a body", BODY_TIMEOUT).await;
    assert_eq!(
        closed.status(),
        Some(408),
        "a stalled body is answered 408: {}",
        closed.text()
    );
    assert!(
        closed
            .text()
            .to_ascii_lowercase()
            .contains("cache-control: no-store"),
        "an error is never cached: {}",
        closed.text()
    );
    assert!(
        closed.text().contains("request_timeout"),
        "{}",
        closed.text()
    );
    assert_served(&server, "after-stalled").await;
    assert_eq!(
        server.api().charge_count().await,
        2,
        "the stalled charge never ran"
    );
}

/// Fifty slow-loris connections dribbling their headers a byte at a time: all are closed
/// within the head deadline (dribbling does not extend it), while a normal client is served
/// throughout.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn fifty_slow_loris_connections_are_closed_while_a_client_is_served() {
    const LORISES: usize = 50;
    let env = TestEnv::new(Backend::Sqlite, "loris").await;
    let server = start(&env, &[]).await;
    let addr = server.addr().to_owned();

    let lorises = Lorises::start(
        &addr,
        LORISES,
        b"GET /v1/charges HTTP/1.1\r\nHost: x\r\nX-Loris: aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
    );
    let served = rounds_during(HEADER_TIMEOUT, |_| assert_served(&server, "beside-lorises")).await;
    lorises.assert_closed().await;
    eprintln!("{served} normal rounds served beside {LORISES} slow-loris connections");
    assert!(served >= 3, "only {served} normal rounds were served");
    assert_served(&server, "after-lorises").await;
}

/// At the connection cap, a new client waits to be accepted until a stalled connection is
/// cut (at its head deadline), then is served: the cap bounds what slow clients hold.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn connections_over_the_cap_wait_for_a_stalled_one_to_be_cut() {
    const CAP: usize = 4;
    let env = TestEnv::new(Backend::Sqlite, "cap").await;
    let cap = CAP.to_string();
    let server = start(&env, &[("IDEM_MAX_CONNECTIONS", &cap)]).await;
    let addr = server.addr().to_owned();
    let mut stalled = Vec::new();
    for _ in 0..CAP {
        let mut client = RawClient::connect(&addr).await;
        assert!(
            client
                .send(b"GET /v1/charges HTTP/1.1\r\nHost: x\r\n")
                .await
        );
        stalled.push(client);
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    let reply = server.api().get("/v1/charges?limit=1").await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.describe());
    eprintln!("served after {:?} at the cap", reply.latency);
    assert!(
        reply.latency >= Duration::from_millis(500),
        "with {CAP} connections open at a cap of {CAP}, a new one waits for a stalled one to \
         be cut, yet it was served in {:?}",
        reply.latency
    );
    assert!(
        reply.latency <= HEADER_TIMEOUT + SLACK,
        "served only after {:?}",
        reply.latency
    );
    for client in &mut stalled {
        assert_cut(client, "a stalled connection at the cap", HEADER_TIMEOUT).await;
    }
}

/// Uploads that stall one byte short of their declared length hold at most the body budget:
/// the first is held (until its deadline, then 408), the next ones find no room and get 503
/// with `Retry-After`, and a small charge still fits and is served.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn stalled_near_limit_uploads_hold_no_more_than_the_budget() {
    const BUDGET: usize = 1024 * 1024;
    const SENT: usize = 700 * 1024;
    let env = TestEnv::new(Backend::Sqlite, "budget").await;
    let budget = BUDGET.to_string();
    let server = start(&env, &[("IDEM_MAX_BUFFERED_BODY_BYTES", &budget)]).await;
    let addr = server.addr().to_owned();

    let mut uploads = Vec::new();
    for i in 0..3 {
        let mut client = RawClient::connect(&addr).await;
        let head = format!(
            "POST /v1/charges HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {API_KEY}\r\n\
             Idempotency-Key: {}\r\nContent-Type: application/x-www-form-urlencoded\r\n\
             Content-Length: {}\r\n\r\n",
            new_key(&format!("upload-{i}")),
            1024 * 1024 - 1
        );
        assert!(client.send(head.as_bytes()).await);
        assert!(client.send(&vec![b'a'; SENT]).await);
        uploads.push(client);
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_served(&server, "beside-uploads").await;
    let mut statuses = Vec::new();
    for (i, upload) in uploads.iter_mut().enumerate() {
        let closed = upload
            .closed_within(BODY_TIMEOUT + SLACK)
            .await
            .unwrap_or_else(|| panic!("upload {i} was still held after {:?}", upload.age()));
        eprintln!(
            "upload {i}: closed after {:?}: {:?}",
            closed.after,
            closed.status()
        );
        if closed.status() == Some(503) {
            assert!(
                closed
                    .text()
                    .to_ascii_lowercase()
                    .contains("retry-after: 1"),
                "a 503 for a full budget carries Retry-After: {}",
                closed.text()
            );
        }
        statuses.push(closed.status());
    }
    assert_eq!(
        statuses,
        vec![Some(408), Some(503), Some(503)],
        "one stalled upload fits the budget (then times out), the others are refused"
    );
    assert_eq!(
        server.api().charge_count().await,
        1,
        "only the small charge"
    );
}

/// A malformed `Authorization` is a 401 with the challenges the server accepts (Bearer, and
/// Basic with the key as user name), on the reads and on the charges alike.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn every_401_carries_www_authenticate() {
    let env = TestEnv::new(Backend::Sqlite, "401").await;
    let server = start(&env, &[]).await;
    let api = server.api();
    let key = new_key("401");
    for (method, path, headers) in [
        (
            Method::GET,
            "/v1/charges",
            vec![("authorization", "Token abc")],
        ),
        (
            Method::GET,
            "/v1/charges/ch_1",
            vec![("authorization", "Bearer")],
        ),
        (
            Method::POST,
            "/v1/charges",
            vec![
                ("authorization", "Basic !!!"),
                ("idempotency-key", key.as_str()),
            ],
        ),
    ] {
        let reply = api
            .send(
                method.clone(),
                path,
                &headers,
                b"amount=1&currency=usd".to_vec(),
            )
            .await;
        assert_eq!(
            reply.status,
            StatusCode::UNAUTHORIZED,
            "{method} {path}: {}",
            reply.describe()
        );
        let challenges: Vec<String> = reply
            .headers
            .get_all("www-authenticate")
            .iter()
            .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned())
            .collect();
        assert!(
            challenges
                .iter()
                .any(|c| c.starts_with("Bearer realm=\"payments\""))
                && challenges
                    .iter()
                    .any(|c| c.starts_with("Basic realm=\"payments\"")),
            "{method} {path}: a 401 names its schemes in WWW-Authenticate: {}",
            reply.describe()
        );
        assert_eq!(reply.json()["error"]["type"], "authentication_error");
    }
}

/// A method a path does not serve: a 405 problem (RFC 9457, with Stripe's `error` object) and
/// `Allow` listing the methods it does.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_wrong_method_is_a_problem_405_with_allow() {
    let env = TestEnv::new(Backend::Sqlite, "405").await;
    let server = start(&env, &[]).await;
    let api = server.api();
    let key = new_key("405");
    for (method, path, allowed) in [
        (Method::DELETE, "/v1/charges", "POST"),
        (Method::PUT, "/v1/charges/ch_1", "GET"),
        (Method::POST, "/v1/charges/ch_1", "GET"),
    ] {
        let reply = api
            .send(
                method.clone(),
                path,
                &[("idempotency-key", key.as_str())],
                Vec::new(),
            )
            .await;
        assert_eq!(
            reply.status,
            StatusCode::METHOD_NOT_ALLOWED,
            "{method} {path}: {}",
            reply.describe()
        );
        assert_eq!(
            reply.header("content-type").as_deref(),
            Some("application/problem+json"),
            "{method} {path}: {}",
            reply.describe()
        );
        assert_eq!(
            reply.header("cache-control").as_deref(),
            Some("no-store"),
            "{method} {path}: an error is never cached: {}",
            reply.describe()
        );
        let allow = reply
            .header("allow")
            .unwrap_or_else(|| panic!("{method} {path}: no Allow: {}", reply.describe()));
        assert!(allow.contains(allowed), "{method} {path}: Allow {allow:?}");
        let body = reply.json();
        assert_eq!(body["status"], 405, "{}", reply.describe());
        assert!(
            body["type"].is_string() && body["title"].is_string(),
            "{}",
            reply.describe()
        );
        assert_eq!(
            body["error"]["code"],
            "method_not_allowed",
            "{}",
            reply.describe()
        );
    }
    assert_eq!(api.charge_count().await, 0);
}

/// Asserts a read answered 503 with `Retry-After`, in Stripe's shape, within `within`.
fn assert_read_unavailable(reply: &support::Reply, what: &str, within: Duration) {
    assert_unavailable(reply, what);
    assert_eq!(
        reply.json()["error"]["type"],
        "api_error",
        "{}",
        reply.describe()
    );
    assert!(
        reply.latency <= within,
        "{what}: the 503 took {:?}",
        reply.latency
    );
}

/// A charge made under a key labelled `label`; its path (`/v1/charges/{id}`).
async fn charged(api: &support::Api, label: &str) -> String {
    let charge = api
        .post_raw(&ChargeRequest::form(&new_key(label), 4242))
        .await;
    let id = assert_charge(&charge, 4242, "usd")["id"]
        .as_str()
        .expect("an id")
        .to_owned();
    format!("/v1/charges/{id}")
}

/// SQLite: the database's path taken away under a running server (the file moved aside, a
/// directory in its place). Reads run on the store's reader connections, opened at start and
/// kept, so they go on answering from the database they have open, as the store's writer and
/// its replays do: the same charge, never an error page nor a half-read, within the read
/// deadline; and again once the file is back.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sqlite_reads_are_answered_by_the_open_connections_when_the_path_goes_away() {
    let env = TestEnv::new(Backend::Sqlite, "read-down").await;
    let server = start(&env, &[]).await;
    let api = server.api();
    let path = charged(&api, "read-down").await;
    let before = api.get(&path).await;
    assert_eq!(before.status, StatusCode::OK, "{}", before.describe());

    let file = std::path::PathBuf::from(&env.database);
    let aside = file.with_extension("aside");
    std::fs::rename(&file, &aside).expect("moving the database aside");
    std::fs::create_dir(&file).expect("a directory in its place");
    let started = std::time::Instant::now();
    let read = api.get(&path).await;
    let list = api.get("/v1/charges?limit=3").await;
    let took = started.elapsed();
    std::fs::remove_dir(&file).expect("removing the directory");
    std::fs::rename(&aside, &file).expect("putting the database back");
    assert_eq!(read.status, StatusCode::OK, "{}", read.describe());
    assert_eq!(read.body, before.body, "the same charge");
    assert_eq!(list.status, StatusCode::OK, "{}", list.describe());
    assert!(took < Duration::from_secs(6), "reads took {took:?}");

    let back = api.get(&path).await;
    assert_eq!(back.status, StatusCode::OK, "{}", back.describe());
}

/// `url` with its host and port replaced by `addr`.
fn via(url: &str, addr: &str) -> String {
    let (start, end) = authority_span(url);
    format!("{}{addr}{}", &url[..start], &url[end..])
}

/// The PostgreSQL server's `host:port` in `url`.
fn authority(url: &str) -> String {
    let (start, end) = authority_span(url);
    url[start..end].to_owned()
}

/// Where `host:port` starts and ends in `url` (after the scheme and any user info).
fn authority_span(url: &str) -> (usize, usize) {
    let start = url
        .find('@')
        .map(|i| i + 1)
        .unwrap_or_else(|| url.find("://").map(|i| i + 3).expect("a URL with a scheme"));
    let end = url[start..].find('/').map_or(url.len(), |i| start + i);
    (start, end)
}

/// Asserts that reads of `path` answer 200 again within a few seconds, as a client retrying
/// its 503s would see (connections the outage ended are discarded as they turn up).
async fn read_recovers(api: &support::Api, path: &str, what: &str) {
    let mut reply = api.get(path).await;
    for _ in 0..40 {
        if reply.status == StatusCode::OK {
            return;
        }
        assert_eq!(
            reply.status,
            StatusCode::SERVICE_UNAVAILABLE,
            "{what}: {}",
            reply.describe()
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
        reply = api.get(path).await;
    }
    panic!("{what}: reads do not answer again: {}", reply.describe());
}

/// PostgreSQL: reads while the database refuses connections, while it is frozen (a
/// blackholed network: sockets open, no answer) and while it is gone (connections refused):
/// 503 with `Retry-After` within the read deadline each time, never a 500 or a hang; then the
/// database comes back and reads answer again.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn postgres_reads_with_the_database_down_are_503_with_retry_after() {
    let env = TestEnv::new(Backend::Postgres, "read-down").await;
    let proxy = FaultProxy::start(&authority(&env.database))
        .await
        .expect("the fault proxy");
    let database = via(&env.database, &proxy.addr().to_string());
    let server = Server::start_with(&env, &database, None, &DEADLINES).await;
    let api = server.api();
    let path = charged(&api, "pg-read-down").await;

    env.set_pg_connections_allowed(false).await;
    let refused = api.get(&path).await;
    env.set_pg_connections_allowed(true).await;
    assert_read_unavailable(
        &refused,
        "database refusing connections",
        Duration::from_secs(7),
    );
    read_recovers(&api, &path, "after the refusal").await;

    proxy.set(Fault::Freeze);
    let frozen = api.get(&path).await;
    let listed = api.get("/v1/charges?limit=3").await;
    proxy.set(Fault::PassThrough);
    assert_read_unavailable(&frozen, "database frozen", Duration::from_secs(7));
    assert_read_unavailable(&listed, "database frozen (list)", Duration::from_secs(7));
    read_recovers(&api, &path, "after the freeze").await;

    drop(proxy);
    let gone = api.get(&path).await;
    assert_read_unavailable(&gone, "database gone", Duration::from_secs(7));
}

/// PostgreSQL frozen (sockets open, no answer) while a charge's transaction is open: the
/// client gets its 503 with `Retry-After` within one store budget (5 s, C13) past the
/// handler's own time (a 1.5 s pause), not a deadline for the transaction and then another
/// for giving the key back; once the database answers again, the retry charges once.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn c13_postgres_frozen_mid_charge_is_503_within_one_store_budget() {
    let env = TestEnv::new(Backend::Postgres, "frozen-charge").await;
    let proxy = FaultProxy::start(&authority(&env.database))
        .await
        .expect("the fault proxy");
    let database = via(&env.database, &proxy.addr().to_string());
    let server = Server::start_with(&env, &database, None, &DEADLINES).await;
    let api = server.api();
    charged(&api, "pg-frozen-warm").await;

    let req = ChargeRequest::form(&new_key("pg-frozen-charge"), 4242).with_delay(1500);
    let flight = spawn_once(&api, &req);
    tokio::time::sleep(Duration::from_millis(700)).await;
    proxy.set(Fault::Freeze);
    let frozen = flight.await.expect("the task").expect("an answer");
    proxy.set(Fault::PassThrough);
    assert_unavailable(&frozen, "database frozen mid-charge");
    let within = Duration::from_millis(1500) + Duration::from_secs(5) + SLACK;
    assert!(
        frozen.latency <= within,
        "the 503 took {:?}, over one store budget past the handler's time ({within:?})",
        frozen.latency
    );

    let retried = api
        .post_charge(
            &req.without_delay(),
            &RetryPolicy::default().deadline(Duration::from_secs(40)),
        )
        .await;
    assert_charge(&retried.reply, 4242, "usd");
    assert_eq!(
        api.charge_count().await,
        2,
        "the warm-up charge and one more"
    );
}

/// A client that hangs up while its charge is made: the charge is made once, and the request
/// log still has exactly one line for it, with its status, written when the execution ended.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_client_that_hangs_up_still_gets_its_log_line() {
    let env = TestEnv::new(Backend::Sqlite, "hang-up").await;
    let server = start(&env, &[]).await;
    let api = server.api();
    let req = ChargeRequest::form(&new_key("hang-up"), 4242).with_delay(1500);
    let cut = api.send_once(&req, Duration::from_millis(300)).await;
    assert!(
        cut.as_ref().is_err_and(reqwest::Error::is_timeout),
        "the client hangs up before the answer: {:?}",
        cut.map(|r| r.describe())
    );
    let every = Duration::from_millis(100);
    let count = poll(50, every, || api.charge_count(), |count| *count == 1).await;
    assert_eq!(count, 1, "the abandoned charge is made once");
    let lines = poll(
        20,
        every,
        || async { server.log_lines(&[" request ", "method=POST"]) },
        |lines| !lines.is_empty(),
    )
    .await;
    assert_eq!(
        lines.len(),
        1,
        "one request line for the POST whose client hung up; the log:\n{}",
        server.log_tail(30)
    );
    let line = &lines[0];
    assert!(
        line.contains("status=200") && line.contains("outcome=\"executed\""),
        "the line says the charge executed: {line}"
    );
    assert!(
        line.contains("client=\"gone\""),
        "and that the client was gone: {line}"
    );
}
