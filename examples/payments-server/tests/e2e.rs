//! End-to-end tests of `payments-server`: the real binary as a child process on a free loopback
//! port, a real HTTP client that retries like a production payment client, every scenario on
//! SQLite (a fresh file per test) and on PostgreSQL (a fresh database per test on the server
//! at `IDEM_PG_URL`, which must be set: the PostgreSQL tests fail without it).
//!
//! Each idempotency scenario asserts exactly one committed charge row (`GET
//! /test/charges/count`, `IDEM_TEST_HOOKS=1`) and one body for every 200 the client saw. The
//! `doubt_*` scenarios make the server's card network time out (`X-Test-Network`) and
//! reconcile the charge in doubt (`POST /test/reconcile`, or the server's own reconciler); they
//! print what the client saw at each step (`--nocapture` shows it).

#[macro_use]
mod support;

use reqwest::StatusCode;
use serde_json::json;
use std::collections::BTreeSet;
use std::time::Duration;
use support::{
    assert_charge, assert_error, assert_in_flight_conflict, assert_unavailable,
    fire_until_conflict, land_all, new_key, Attempt, Backend, ChargeRequest, NetworkFault,
    RetryPolicy, Server, TestEnv,
};

on_both_backends! {
    slow_first_attempt_with_client_timeout =>
        sqlite_slow_first_attempt_with_client_timeout,
        postgres_slow_first_attempt_with_client_timeout;
    concurrent_duplicates =>
        sqlite_concurrent_duplicates,
        postgres_concurrent_duplicates;
    key_reused_with_another_amount =>
        sqlite_key_reused_with_another_amount,
        postgres_key_reused_with_another_amount;
    sequential_replay =>
        sqlite_sequential_replay,
        postgres_sequential_replay;
    duplicate_while_in_flight =>
        sqlite_duplicate_while_in_flight,
        postgres_duplicate_while_in_flight;
    missing_idempotency_key =>
        sqlite_missing_idempotency_key,
        postgres_missing_idempotency_key;
    killed_mid_request_then_retried_after_lease =>
        sqlite_killed_mid_request_then_retried_after_lease,
        postgres_killed_mid_request_then_retried_after_lease;
    form_and_json_charges_are_retrievable_and_listed =>
        sqlite_form_and_json_charges_are_retrievable_and_listed,
        postgres_form_and_json_charges_are_retrievable_and_listed;
    validation_error_releases_the_key =>
        sqlite_validation_error_releases_the_key,
        postgres_validation_error_releases_the_key;
    keys_are_scoped_per_api_key =>
        sqlite_keys_are_scoped_per_api_key,
        postgres_keys_are_scoped_per_api_key;
    sigterm_drains_then_restart_replays =>
        sqlite_sigterm_drains_then_restart_replays,
        postgres_sigterm_drains_then_restart_replays;
    doubt_network_timed_out_after_charging_is_settled =>
        sqlite_doubt_network_timed_out_after_charging_is_settled,
        postgres_doubt_network_timed_out_after_charging_is_settled;
    doubt_network_timed_out_before_charging_is_released =>
        sqlite_doubt_network_timed_out_before_charging_is_released,
        postgres_doubt_network_timed_out_before_charging_is_released;
    doubt_two_reconcilers_at_once_settle_once =>
        sqlite_doubt_two_reconcilers_at_once_settle_once,
        postgres_doubt_two_reconcilers_at_once_settle_once;
    doubt_the_servers_own_reconciler_settles =>
        sqlite_doubt_the_servers_own_reconciler_settles,
        postgres_doubt_the_servers_own_reconciler_settles;
    doubt_released_after_the_reconciler_recorded_the_charge_answers_it =>
        sqlite_doubt_released_after_the_reconciler_recorded_the_charge_answers_it,
        postgres_doubt_released_after_the_reconciler_recorded_the_charge_answers_it;
}

/// Asserts `replay` is the replay of `original`: same status, byte-identical body,
/// `Idempotent-Replayed: true`, the key echoed.
fn assert_replay_of(replay: &support::Reply, original: &support::Reply, key: &str) {
    assert_eq!(
        replay.status,
        original.status,
        "a replay has the original status; original: {}\nreplay: {}",
        original.describe(),
        replay.describe()
    );
    assert_eq!(
        replay.text(),
        original.text(),
        "a replay has the original body byte for byte; original: {}\nreplay: {}",
        original.describe(),
        replay.describe()
    );
    assert!(
        replay.replayed(),
        "a replay carries Idempotent-Replayed: true: {}",
        replay.describe()
    );
    assert_eq!(
        replay.header("idempotency-key").as_deref(),
        Some(key),
        "a replay echoes the Idempotency-Key: {}",
        replay.describe()
    );
}

/// Scenario 1: the first attempt is slow (1.5 s) and the client times out after 0.5 s: it
/// retries with the same key (timeouts, 409s) until it gets the 200, which a later replay
/// matches.
async fn slow_first_attempt_with_client_timeout(backend: Backend) {
    let env = TestEnv::new(backend, "slow-first").await;
    let server = Server::start(&env, None).await;
    let api = server.api();
    let key = new_key("slow");
    let req = ChargeRequest::form(&key, 4242).with_delay(1500);
    let policy = RetryPolicy::default()
        .attempt_timeout(Duration::from_millis(500))
        .deadline(Duration::from_secs(30));

    let outcome = api.post_charge(&req, &policy).await;
    eprintln!("{backend:?} slow first attempt: {}", outcome.summary());
    let charge = assert_charge(&outcome.reply, 4242, "usd");
    assert!(
        matches!(outcome.attempts.first(), Some(Attempt::Timeout(_))),
        "the first attempt (1.5 s of work, 0.5 s timeout) should have timed out: {:#?}",
        outcome.attempts
    );
    assert!(outcome.attempts.len() >= 2, "{:#?}", outcome.attempts);
    // The live answer went to the abandoned first attempt: the execution must have carried on
    // after the client hung up, and the retry got its stored response.
    assert!(
        outcome.reply.replayed(),
        "the client's final 200 should be the replay of the abandoned first attempt's execution: \
         {}\nattempts: {:#?}",
        outcome.reply.describe(),
        outcome.attempts
    );
    assert_eq!(
        outcome.reply.header("idempotency-key").as_deref(),
        Some(key.as_str())
    );

    let replay = api.post_raw(&req).await;
    assert_replay_of(&replay, &outcome.reply, &key);
    assert_eq!(replay.json()["id"], charge["id"]);
    assert_eq!(api.charge_count().await, 1, "exactly one charge row");
}

/// Scenario 2: eight identical requests fired at once through retrying clients: one charge, eight
/// identical 200 bodies, exactly one of them live.
async fn concurrent_duplicates(backend: Backend) {
    let env = TestEnv::new(backend, "concurrent").await;
    let server = Server::start(&env, None).await;
    let api = server.api();
    let key = new_key("concurrent");
    // A little work so that the duplicates overlap the execution.
    let req = ChargeRequest::form(&key, 4242).with_delay(500);
    let policy = RetryPolicy::default();

    let start = tokio::time::Instant::now() + Duration::from_millis(200);
    let clients: Vec<_> = (0..8)
        .map(|_| {
            let (api, req, policy) = (api.clone(), req.clone(), policy.clone());
            tokio::spawn(async move {
                tokio::time::sleep_until(start).await;
                api.post_charge(&req, &policy).await
            })
        })
        .collect();
    let mut outcomes = Vec::new();
    for client in clients {
        outcomes.push(
            client
                .await
                .expect("a concurrent client panicked (message above)"),
        );
    }

    for outcome in &outcomes {
        eprintln!("{backend:?} concurrent client: {}", outcome.summary());
    }
    let first = &outcomes[0].reply;
    let charge = assert_charge(first, 4242, "usd");
    for outcome in &outcomes {
        assert_charge(&outcome.reply, 4242, "usd");
        assert_eq!(
            outcome.reply.text(),
            first.text(),
            "every client must see the same body; one: {}\nanother: {}",
            first.describe(),
            outcome.reply.describe()
        );
        assert_eq!(
            outcome.reply.header("idempotency-key").as_deref(),
            Some(key.as_str())
        );
    }
    let live = outcomes.iter().filter(|o| !o.reply.replayed()).count();
    let conflicts: usize = outcomes.iter().map(|o| o.count_status(409)).sum();
    assert_eq!(
        live,
        1,
        "exactly one of the 8 final answers is the live one, the others replays ({conflicts} \
         409s seen); attempts: {:#?}",
        outcomes.iter().map(|o| &o.attempts).collect::<Vec<_>>()
    );
    assert_eq!(
        api.charge_count().await,
        1,
        "exactly one charge row for 8 duplicates"
    );

    let replay = api.post_raw(&req).await;
    assert_replay_of(&replay, first, &key);
    assert_eq!(replay.json()["id"], charge["id"]);
}

/// Scenario 3: the key reused with another amount: a Stripe-shaped 422, nothing executed, and the
/// original request still replays.
async fn key_reused_with_another_amount(backend: Backend) {
    let env = TestEnv::new(backend, "reuse").await;
    let server = Server::start(&env, None).await;
    let api = server.api();
    let key = new_key("reuse");
    let original = ChargeRequest::form(&key, 4242);

    let first = api.post_raw(&original).await;
    assert_charge(&first, 4242, "usd");
    assert!(
        !first.replayed(),
        "the first answer is live: {}",
        first.describe()
    );

    let reused = api.post_raw(&ChargeRequest::form(&key, 9999)).await;
    assert_error(
        &reused,
        422,
        "idempotency_error",
        Some("idempotency_key_reused"),
    );
    assert!(!reused.replayed(), "{}", reused.describe());
    assert_eq!(
        api.charge_count().await,
        1,
        "the reused key must not execute"
    );

    let replay = api.post_raw(&original).await;
    assert_replay_of(&replay, &first, &key);
    assert_eq!(api.charge_count().await, 1, "exactly one charge row");
}

/// Scenario 4: a sequential retry: the same status, a byte-identical body,
/// `Idempotent-Replayed: true` on the replay only, the key echoed on both.
async fn sequential_replay(backend: Backend) {
    let env = TestEnv::new(backend, "replay").await;
    let server = Server::start(&env, None).await;
    let api = server.api();
    let key = new_key("replay");
    let req = ChargeRequest::json(
        &key,
        json!({"amount": 4242, "currency": "usd", "description": "sequential replay"}),
    );

    let first = api.post_raw(&req).await;
    assert_charge(&first, 4242, "usd");
    assert!(
        !first.replayed(),
        "the live answer has no Idempotent-Replayed: true: {}",
        first.describe()
    );
    assert_eq!(
        first.header("idempotency-key").as_deref(),
        Some(key.as_str()),
        "the live answer echoes the Idempotency-Key: {}",
        first.describe()
    );

    let replay = api.post_raw(&req).await;
    assert_replay_of(&replay, &first, &key);
    assert_eq!(
        replay.header("content-type"),
        first.header("content-type"),
        "a replay has the original Content-Type"
    );
    assert_eq!(api.charge_count().await, 1, "exactly one charge row");
}

/// Scenario 5: a duplicate while the first request runs (3 s): a 409 at once with
/// `Retry-After`; after the first finishes, the replay.
async fn duplicate_while_in_flight(backend: Backend) {
    let env = TestEnv::new(backend, "in-flight").await;
    let server = Server::start(&env, None).await;
    let api = server.api();
    let key = new_key("inflight");
    let req = ChargeRequest::form(&key, 4242).with_delay(3000);

    let in_flight = fire_until_conflict(
        &api,
        &req,
        Duration::from_millis(250),
        Duration::from_secs(10),
    )
    .await;
    eprintln!(
        "{backend:?} in-flight duplicate: {}",
        in_flight.conflict.describe()
    );
    assert_in_flight_conflict(&in_flight.conflict);

    let mut executed = Vec::new();
    for landed in land_all(in_flight.pending, Duration::from_secs(30)).await {
        match landed {
            Ok(reply) if reply.status == StatusCode::OK => executed.push(reply),
            Ok(reply) if reply.status == StatusCode::CONFLICT => {
                assert_error(&reply, 409, "idempotency_error", None);
            }
            Ok(reply) => panic!("unexpected answer in flight: {}", reply.describe()),
            Err(e) => panic!("a request in flight failed: {e}"),
        }
    }
    assert_eq!(
        executed.len(),
        1,
        "exactly one of the identical requests executes: {:#?}",
        executed.iter().map(|r| r.describe()).collect::<Vec<_>>()
    );
    let live = &executed[0];
    assert_charge(live, 4242, "usd");
    assert!(
        !live.replayed(),
        "the executing request's answer is live: {}",
        live.describe()
    );

    let replay = api.post_raw(&req).await;
    assert_replay_of(&replay, live, &key);
    assert_eq!(api.charge_count().await, 1, "exactly one charge row");
}

/// Scenario 6: no `Idempotency-Key`: a 400 `idempotency_key_missing`, nothing executed.
async fn missing_idempotency_key(backend: Backend) {
    let env = TestEnv::new(backend, "missing-key").await;
    let server = Server::start(&env, None).await;
    let api = server.api();

    let form = api
        .post_raw(&ChargeRequest::form("unused", 4242).without_key())
        .await;
    assert_error(
        &form,
        400,
        "invalid_request_error",
        Some("idempotency_key_missing"),
    );
    let json = api
        .post_raw(
            &ChargeRequest::json("unused", json!({"amount": 4242, "currency": "usd"}))
                .without_key(),
        )
        .await;
    assert_error(
        &json,
        400,
        "invalid_request_error",
        Some("idempotency_key_missing"),
    );
    assert_eq!(api.charge_count().await, 0, "no charge without a key");
}

/// Scenario 7: the server SIGKILLed while the first request runs (its charge row written,
/// uncommitted), restarted on the same database: the client's retry gets 409s until the 2 s
/// lease passes, then executes once.
async fn killed_mid_request_then_retried_after_lease(backend: Backend) {
    const LEASE_MS: u64 = 2000;
    let env = TestEnv::new(backend, "killed").await;
    let mut server = Server::start(&env, Some(LEASE_MS)).await;
    let api = server.api();
    let key = new_key("killed");
    let req = ChargeRequest::form(&key, 4242).with_delay(30_000);

    let in_flight = fire_until_conflict(
        &api,
        &req,
        Duration::from_millis(250),
        Duration::from_secs(15),
    )
    .await;
    assert_error(&in_flight.conflict, 409, "idempotency_error", None);
    // The reservation exists; the row insert follows it at once: leave it a moment.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        api.charge_count().await,
        0,
        "the running request's charge is not committed yet"
    );

    server.kill().await;
    // The killed server's clients see their connections die (or had their 409s).
    let landed = land_all(in_flight.pending, Duration::from_secs(15)).await;
    for reply in landed.into_iter().flatten() {
        assert_ne!(
            reply.status,
            StatusCode::OK,
            "no request could complete before the kill: {}",
            reply.describe()
        );
    }

    let restarted = Server::start(&env, Some(LEASE_MS)).await;
    let api = restarted.api();
    assert_eq!(
        api.charge_count().await,
        0,
        "the killed request's uncommitted charge must not survive the crash"
    );

    // The client's retry: same key and body (no test delay this time).
    let retry = req.clone().without_delay();
    let outcome = api
        .post_charge(
            &retry,
            &RetryPolicy::default().deadline(Duration::from_secs(30)),
        )
        .await;
    eprintln!("{backend:?} retry after the crash: {}", outcome.summary());
    let charge = assert_charge(&outcome.reply, 4242, "usd");
    assert!(
        !outcome.reply.replayed(),
        "the killed attempt stored no response, so the retry executes live: {}\nattempts: {:#?}",
        outcome.reply.describe(),
        outcome.attempts
    );
    for attempt in &outcome.attempts[..outcome.attempts.len() - 1] {
        assert!(
            matches!(attempt, Attempt::Status { status: 409, .. }),
            "before the lease passes the retry should only get 409s: {:#?}",
            outcome.attempts
        );
    }
    assert_eq!(
        api.charge_count().await,
        1,
        "exactly one charge row after the crash"
    );

    let replay = api.post_raw(&retry).await;
    assert_replay_of(&replay, &outcome.reply, &key);
    assert_eq!(replay.json()["id"], charge["id"]);
    assert_eq!(api.charge_count().await, 1, "exactly one charge row");
}

/// A form-encoded and a JSON charge: both created, retrievable by id, listed newest first;
/// an unknown id 404s.
async fn form_and_json_charges_are_retrievable_and_listed(backend: Backend) {
    let env = TestEnv::new(backend, "form-json").await;
    let server = Server::start(&env, None).await;
    let api = server.api();

    let form = api
        .post_raw(&ChargeRequest::form_fields(
            &new_key("form"),
            &[
                ("amount", "1000"),
                ("currency", "usd"),
                ("description", "form-encoded charge"),
            ],
        ))
        .await;
    let form_charge = assert_charge(&form, 1000, "usd");
    assert_eq!(
        form_charge["description"],
        "form-encoded charge",
        "{}",
        form.describe()
    );

    let json_reply = api
        .post_raw(&ChargeRequest::json(
            &new_key("json"),
            json!({"amount": 2000, "currency": "eur", "description": "JSON charge"}),
        ))
        .await;
    let json_charge = assert_charge(&json_reply, 2000, "eur");
    assert_eq!(
        json_charge["description"],
        "JSON charge",
        "{}",
        json_reply.describe()
    );
    assert_ne!(form_charge["id"], json_charge["id"]);

    for charge in [&form_charge, &json_charge] {
        let id = charge["id"].as_str().expect("checked by assert_charge");
        let got = api.get(&format!("/v1/charges/{id}")).await;
        assert_eq!(
            got.status,
            StatusCode::OK,
            "GET /v1/charges/{id}: {}",
            got.describe()
        );
        let got_json = got.json();
        for field in [
            "id",
            "object",
            "amount",
            "currency",
            "description",
            "created",
        ] {
            assert_eq!(
                got_json[field],
                charge[field],
                "GET /v1/charges/{id}: field {field} differs from the created charge: {}",
                got.describe()
            );
        }
    }

    let missing = api.get("/v1/charges/ch_doesnotexist0000000000").await;
    assert_error(
        &missing,
        404,
        "invalid_request_error",
        Some("resource_missing"),
    );

    let list = api.get("/v1/charges?limit=10").await;
    assert_eq!(list.status, StatusCode::OK, "{}", list.describe());
    let list_json = list.json();
    assert_eq!(list_json["object"], "list", "{}", list.describe());
    assert_eq!(list_json["url"], "/v1/charges", "{}", list.describe());
    assert_eq!(list_json["has_more"], false, "{}", list.describe());
    let data = list_json["data"]
        .as_array()
        .unwrap_or_else(|| panic!("the list has no `data` array: {}", list.describe()));
    let listed: BTreeSet<&str> = data.iter().filter_map(|c| c["id"].as_str()).collect();
    let created: BTreeSet<&str> = [&form_charge, &json_charge]
        .iter()
        .filter_map(|c| c["id"].as_str())
        .collect();
    assert_eq!(data.len(), 2, "{}", list.describe());
    assert_eq!(
        listed,
        created,
        "the list holds both charges: {}",
        list.describe()
    );
    let times: Vec<i64> = data.iter().filter_map(|c| c["created"].as_i64()).collect();
    assert!(
        times.windows(2).all(|w| w[0] >= w[1]),
        "the list is newest first: {}",
        list.describe()
    );

    let page = api.get("/v1/charges?limit=1").await;
    assert_eq!(page.status, StatusCode::OK, "{}", page.describe());
    let page_json = page.json();
    assert_eq!(
        page_json["data"].as_array().map(Vec::len),
        Some(1),
        "limit=1: {}",
        page.describe()
    );
    assert_eq!(
        page_json["has_more"],
        true,
        "limit=1 of 2: {}",
        page.describe()
    );

    assert_eq!(api.charge_count().await, 2, "two charges");
}

/// Validation failures are not stored: the same key with a corrected body executes.
async fn validation_error_releases_the_key(backend: Backend) {
    let env = TestEnv::new(backend, "validation").await;
    let server = Server::start(&env, None).await;
    let api = server.api();
    let key = new_key("invalid");

    let negative = api
        .post_raw(&ChargeRequest::form_fields(
            &key,
            &[("amount", "-5"), ("currency", "usd")],
        ))
        .await;
    let body = assert_error(&negative, 400, "invalid_request_error", None);
    assert!(
        body["error"]["code"].is_string(),
        "error.code: {}",
        negative.describe()
    );
    assert!(!negative.replayed(), "{}", negative.describe());

    // Another body under the same key: a 400 again, not a 422, since nothing was stored.
    let no_currency = api
        .post_raw(&ChargeRequest::form_fields(&key, &[("amount", "4242")]))
        .await;
    assert_error(&no_currency, 400, "invalid_request_error", None);
    assert_eq!(
        api.charge_count().await,
        0,
        "invalid requests charge nothing"
    );

    let corrected = ChargeRequest::form(&key, 4242);
    let good = api.post_raw(&corrected).await;
    assert_charge(&good, 4242, "usd");
    assert!(
        !good.replayed(),
        "the corrected request executes live: {}",
        good.describe()
    );
    assert_eq!(api.charge_count().await, 1, "exactly one charge row");

    let replay = api.post_raw(&corrected).await;
    assert_replay_of(&replay, &good, &key);
    assert_eq!(api.charge_count().await, 1, "exactly one charge row");
}

/// The same `Idempotency-Key` under two API keys and anonymously: three separate charges, each
/// replaying its own (the first also under Basic authentication with the key as user name).
async fn keys_are_scoped_per_api_key(backend: Backend) {
    let env = TestEnv::new(backend, "scoped").await;
    let server = Server::start(&env, None).await;
    let api = server.api();
    let key = new_key("scoped");
    let requests = [
        ChargeRequest::form(&key, 4242),
        ChargeRequest::form(&key, 4242).with_api_key(Some("sk_test_e2e_other")),
        ChargeRequest::form(&key, 4242).with_api_key(None),
    ];

    let mut replies = Vec::new();
    for req in &requests {
        let reply = api.post_raw(req).await;
        assert_charge(&reply, 4242, "usd");
        assert!(
            !reply.replayed(),
            "another account's key is another request ({:?}): {}",
            req.api_key,
            reply.describe()
        );
        replies.push(reply);
    }
    let ids: BTreeSet<String> = replies.iter().map(|r| r.json()["id"].to_string()).collect();
    assert_eq!(ids.len(), 3, "three distinct charges: {ids:?}");
    assert_eq!(api.charge_count().await, 3, "one charge per account");

    for (req, original) in requests.iter().zip(&replies) {
        let replay = api.post_raw(req).await;
        assert_replay_of(&replay, original, &key);
    }
    // The same API key as the Basic user name is the same account.
    let basic = api.post_raw(&requests[0].clone().with_basic_auth()).await;
    assert_replay_of(&basic, &replies[0], &key);
    assert_eq!(api.charge_count().await, 3, "replays charge nothing");
}

/// SIGTERM while a request executes: the server lets it finish (its client gets the 200),
/// exits successfully, and restarted on the same database (SQLite spelled `sqlite://path`
/// this time) replays both requests it answered.
async fn sigterm_drains_then_restart_replays(backend: Backend) {
    let env = TestEnv::new(backend, "sigterm").await;
    let mut server = Server::start(&env, None).await;
    let api = server.api();
    let done_key = new_key("sigterm-done");
    let done = ChargeRequest::form(&done_key, 4242);
    let first = api.post_raw(&done).await;
    assert_charge(&first, 4242, "usd");

    let running_key = new_key("sigterm-running");
    let running = ChargeRequest::form(&running_key, 1234).with_delay(1500);
    let in_flight = fire_until_conflict(
        &api,
        &running,
        Duration::from_millis(250),
        Duration::from_secs(10),
    )
    .await;
    assert_error(&in_flight.conflict, 409, "idempotency_error", None);

    let status = server.terminate(Duration::from_secs(20)).await;
    assert!(
        status.success(),
        "the server should exit successfully on SIGTERM, got {status}; its log:\n{}",
        server.log_tail(40)
    );
    let mut executed = Vec::new();
    for landed in land_all(in_flight.pending, Duration::from_secs(10)).await {
        match landed {
            Ok(reply) if reply.status == StatusCode::CONFLICT => {}
            Ok(reply) => executed.push(reply),
            Err(e) => panic!(
                "a graceful shutdown should let the running request answer, but it failed: {e}"
            ),
        }
    }
    assert_eq!(executed.len(), 1, "the running request answers once");
    assert_charge(&executed[0], 1234, "usd");

    let database = match backend {
        Backend::Sqlite => format!("sqlite://{}", env.database),
        Backend::Postgres => env.database.clone(),
    };
    let restarted = Server::start_on(&env, &database, None).await;
    let api = restarted.api();
    let replay = api.post_raw(&done).await;
    assert_replay_of(&replay, &first, &done_key);
    let replay = api.post_raw(&running.without_delay()).await;
    assert_replay_of(&replay, &executed[0], &running_key);
    assert_eq!(api.charge_count().await, 2, "exactly the two charges");
}

/// PostgreSQL only: the database refuses connections (its sessions ended): a charge gets a
/// 503 with `Retry-After`; once the database is back, the client's retry with the same key
/// executes once.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn postgres_store_outage_is_503_then_recovers() {
    let env = TestEnv::new(Backend::Postgres, "outage").await;
    let server = Server::start(&env, None).await;
    let api = server.api();
    let warm = api
        .post_raw(&ChargeRequest::form(&new_key("warm"), 100))
        .await;
    assert_charge(&warm, 100, "usd");

    env.set_pg_connections_allowed(false).await;
    let key = new_key("outage");
    let req = ChargeRequest::form(&key, 4242);
    let down = api.post_raw(&req).await;
    eprintln!("store down: {}", down.describe());
    assert_unavailable(&down, "the store is down");

    env.set_pg_connections_allowed(true).await;
    let outcome = api
        .post_charge(
            &req,
            &RetryPolicy::default().deadline(Duration::from_secs(40)),
        )
        .await;
    eprintln!("after the outage: {}", outcome.summary());
    assert_charge(&outcome.reply, 4242, "usd");
    assert!(
        !outcome.reply.replayed(),
        "nothing ran during the outage, so the retry executes live: {}",
        outcome.reply.describe()
    );
    let replay = api.post_raw(&req).await;
    assert_replay_of(&replay, &outcome.reply, &key);
    assert_eq!(
        api.charge_count().await,
        2,
        "the warm-up charge and exactly one more"
    );
}

/// The server on `env`'s database without its own reconciler (`IDEM_RECONCILE_EVERY=0`): only
/// the test's `POST /test/reconcile` decides the records in doubt.
async fn start_without_reconciler(env: &TestEnv) -> Server {
    Server::start_with(env, &env.database, None, &[("IDEM_RECONCILE_EVERY", "0")]).await
}

/// Prints what the client saw at `step`: the status, whether it was a replay, the body.
fn show(backend: Backend, step: &str, reply: &support::Reply) {
    println!(
        "[{backend:?}] {step}: {} (Idempotent-Replayed: {})\n    {}",
        reply.status,
        reply
            .header("idempotent-replayed")
            .unwrap_or_else(|| "-".to_owned()),
        reply.text()
    );
}

/// Prints the card network's authorizations and the charge rows, and asserts one of each.
async fn show_and_assert_one_charge(backend: Backend, api: &support::Api) {
    let (authorizations, rows) = (api.authorization_count().await, api.charge_count().await);
    println!(
        "[{backend:?}] end: {authorizations} authorization(s) at the network, {rows} charge row(s)"
    );
    assert_eq!(authorizations, 1, "exactly one authorization");
    assert_eq!(rows, 1, "exactly one charge row");
}

/// Prints a reconciliation pass's report.
fn show_report(backend: Backend, step: &str, report: &serde_json::Value) {
    println!("[{backend:?}] {step}: POST /test/reconcile -> {report}");
}

/// Asserts `reply` is the answer of a charge in doubt: a 502 problem (`no-store`) that is also
/// a Stripe error (`api_error`, `card_network_timeout`), saying the charge may have gone through and
/// not to retry with another key.
fn assert_in_doubt(reply: &support::Reply) {
    assert_eq!(
        reply.status,
        StatusCode::BAD_GATEWAY,
        "the answer in doubt is a 502: {}",
        reply.describe()
    );
    assert_eq!(
        reply.header("content-type").as_deref(),
        Some("application/problem+json"),
        "{}",
        reply.describe()
    );
    // A problem, first sent or replayed: never kept by a cache (section 7).
    assert_eq!(
        reply.header("cache-control").as_deref(),
        Some("no-store"),
        "{}",
        reply.describe()
    );
    let body = assert_error(reply, 502, "api_error", Some("card_network_timeout"));
    assert_eq!(body["status"], 502, "{}", reply.describe());
    assert!(
        body["type"]
            .as_str()
            .is_some_and(|t| t.ends_with("/outcome-unknown")),
        "{}",
        reply.describe()
    );
    let message = body["error"]["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("may have gone through") && message.contains("another key"),
        "{}",
        reply.describe()
    );
}

/// Asserts a pass's report: these counts, every other one 0.
fn assert_report(report: &serde_json::Value, expected: &[(&str, u64)]) {
    for field in [
        "checked",
        "settled",
        "released",
        "deferred",
        "contested",
        "failed",
    ] {
        let want = expected
            .iter()
            .find(|(name, _)| *name == field)
            .map_or(0, |(_, n)| *n);
        assert_eq!(report[field].as_u64(), Some(want), "{field}: {report}");
    }
}

/// Asserts GET /v1/charges/{id} answers `charge` as it was answered to the client.
async fn assert_retrievable(api: &support::Api, charge: &serde_json::Value) {
    let id = charge["id"].as_str().expect("checked by assert_charge");
    let got = api.get(&format!("/v1/charges/{id}")).await;
    assert_eq!(got.status, StatusCode::OK, "{}", got.describe());
    assert_eq!(
        &got.json(),
        charge,
        "GET /v1/charges/{id}: {}",
        got.describe()
    );
}

/// The card network records the authorization and the handler's call times out: the client
/// gets the 502 in doubt, and so does its retry (a replay: nothing charged again). The
/// reconciler finds the authorization, records the charge and settles the record: the
/// client's retry gets the real charge, replayed. One authorization, one charge row.
async fn doubt_network_timed_out_after_charging_is_settled(backend: Backend) {
    let env = TestEnv::new(backend, "doubt-after").await;
    let server = start_without_reconciler(&env).await;
    let api = server.api();
    let key = new_key("doubt-after");
    let req =
        ChargeRequest::form(&key, 4242).with_network_fault(NetworkFault::TimeoutAfterCharging);
    let retry = req.clone().without_network_fault();

    let first = api.post_raw(&req).await;
    show(
        backend,
        "1. charge; the network charged, then timed out",
        &first,
    );
    assert_in_doubt(&first);
    assert!(!first.replayed(), "{}", first.describe());
    assert_eq!(api.authorization_count().await, 1, "the network charged");
    assert_eq!(api.charge_count().await, 0, "no charge row yet");

    let before = api.post_raw(&retry).await;
    show(backend, "2. retry before reconciliation", &before);
    assert_replay_of(&before, &first, &key);
    assert_eq!(
        api.authorization_count().await,
        1,
        "the retry charged nothing"
    );

    let report = api.reconcile().await;
    show_report(backend, "3. reconcile", &report);
    assert_report(&report, &[("checked", 1), ("settled", 1)]);
    assert_eq!(
        api.charge_count().await,
        1,
        "the reconciler recorded the charge"
    );

    let settled = api.post_raw(&retry).await;
    show(backend, "4. retry after reconciliation", &settled);
    let charge = assert_charge(&settled, 4242, "usd");
    assert!(
        settled.replayed(),
        "the settled answer is replayed: {}",
        settled.describe()
    );
    assert_eq!(
        settled.header("idempotency-key").as_deref(),
        Some(key.as_str())
    );
    let authorization = charge["authorization"].as_str().unwrap_or_default();
    assert!(authorization.starts_with("auth_"), "{}", settled.describe());
    assert_eq!(
        charge["id"].as_str().and_then(|id| id.strip_prefix("ch_")),
        authorization.strip_prefix("auth_"),
        "the charge is the authorization's: {}",
        settled.describe()
    );
    assert_eq!(charge["description"], format!("e2e charge {key}"));
    assert_retrievable(&api, &charge).await;

    let again = api.post_raw(&retry).await;
    assert_replay_of(&again, &settled, &key);
    let report = api.reconcile().await;
    show_report(backend, "5. reconcile again", &report);
    assert_report(&report, &[]);
    show_and_assert_one_charge(backend, &api).await;
}

/// The handler's call times out before the network charged: the client gets the 502 in
/// doubt. The reconciler finds no authorization and releases the key: the client's retry
/// charges, live. One authorization, one charge row.
async fn doubt_network_timed_out_before_charging_is_released(backend: Backend) {
    let env = TestEnv::new(backend, "doubt-before").await;
    let server = start_without_reconciler(&env).await;
    let api = server.api();
    let key = new_key("doubt-before");
    let req =
        ChargeRequest::form(&key, 4242).with_network_fault(NetworkFault::TimeoutBeforeCharging);
    let retry = req.clone().without_network_fault();

    let first = api.post_raw(&req).await;
    show(
        backend,
        "1. charge; the network timed out before charging",
        &first,
    );
    assert_in_doubt(&first);
    assert_eq!(
        api.authorization_count().await,
        0,
        "the network charged nothing"
    );

    let before = api.post_raw(&retry).await;
    show(backend, "2. retry before reconciliation", &before);
    assert_replay_of(&before, &first, &key);
    assert_eq!(
        api.authorization_count().await,
        0,
        "the retry charged nothing"
    );

    let report = api.reconcile().await;
    show_report(backend, "3. reconcile", &report);
    assert_report(&report, &[("checked", 1), ("released", 1)]);
    assert_eq!(api.charge_count().await, 0, "nothing recorded");

    let executed = api.post_raw(&retry).await;
    show(backend, "4. retry after reconciliation", &executed);
    let charge = assert_charge(&executed, 4242, "usd");
    assert!(
        !executed.replayed(),
        "the released key executes the retry live: {}",
        executed.describe()
    );
    assert!(charge["authorization"]
        .as_str()
        .is_some_and(|a| a.starts_with("auth_")));
    assert_retrievable(&api, &charge).await;

    let replay = api.post_raw(&retry).await;
    show(backend, "5. retry again", &replay);
    assert_replay_of(&replay, &executed, &key);
    show_and_assert_one_charge(backend, &api).await;
}

/// Two reconciliation passes at once over one record in doubt: one settles it, the other
/// decides nothing (it lost the race, or found nothing left to check); one charge row.
async fn doubt_two_reconcilers_at_once_settle_once(backend: Backend) {
    let env = TestEnv::new(backend, "doubt-race").await;
    let server = start_without_reconciler(&env).await;
    let api = server.api();
    let key = new_key("doubt-race");
    let req =
        ChargeRequest::form(&key, 4242).with_network_fault(NetworkFault::TimeoutAfterCharging);

    let first = api.post_raw(&req).await;
    show(
        backend,
        "1. charge; the network charged, then timed out",
        &first,
    );
    assert_in_doubt(&first);

    let (one, other) = tokio::join!(api.reconcile(), api.reconcile());
    show_report(backend, "2a. reconcile", &one);
    show_report(backend, "2b. reconcile at the same time", &other);
    let (winner, loser) = if one["settled"] == 1 {
        (one, other)
    } else {
        (other, one)
    };
    assert_report(&winner, &[("checked", 1), ("settled", 1)]);
    let lost = loser
        == json!({"checked": 1, "settled": 0, "released": 0, "deferred": 0, "contested": 1, "failed": 0});
    let late = loser["checked"] == 0;
    assert!(lost || late, "the other pass decides nothing: {loser}");
    if late {
        assert_report(&loser, &[]);
    }

    let settled = api.post_raw(&req.without_network_fault()).await;
    show(backend, "3. retry", &settled);
    assert_charge(&settled, 4242, "usd");
    assert!(settled.replayed(), "{}", settled.describe());
    show_and_assert_one_charge(backend, &api).await;
}

/// The server's own reconciler (every second here) settles a charge in doubt without anyone
/// asking: the client's retries get the 502 until then, and the real charge after.
async fn doubt_the_servers_own_reconciler_settles(backend: Backend) {
    let env = TestEnv::new(backend, "doubt-background").await;
    let server =
        Server::start_with(&env, &env.database, None, &[("IDEM_RECONCILE_EVERY", "1")]).await;
    let api = server.api();
    let key = new_key("doubt-background");
    let req =
        ChargeRequest::form(&key, 4242).with_network_fault(NetworkFault::TimeoutAfterCharging);
    let retry = req.clone().without_network_fault();

    let first = api.post_raw(&req).await;
    show(
        backend,
        "1. charge; the network charged, then timed out",
        &first,
    );
    assert_in_doubt(&first);

    let last = e2e_support::poll(
        40,
        Duration::from_millis(250),
        || api.post_raw(&retry),
        |reply| reply.status != StatusCode::BAD_GATEWAY,
    )
    .await;
    show(backend, "2. retry once the server reconciled", &last);
    assert_charge(&last, 4242, "usd");
    assert!(last.replayed(), "{}", last.describe());
    assert_report(&api.reconcile().await, &[]);
    show_and_assert_one_charge(backend, &api).await;
}

/// Deletes the idempotency record of `key` from `env`'s database, as a release does.
async fn delete_record(env: &TestEnv, key: &str) {
    match env.backend {
        Backend::Sqlite => {
            let db = idem::sqlite::rusqlite::Connection::open(&env.database).expect("the file");
            let deleted = db
                .execute("DELETE FROM idem_records WHERE key = ?1", [key])
                .expect("deleted");
            assert_eq!(deleted, 1, "one record of {key}");
        }
        Backend::Postgres => {
            use sqlx::Connection as _;
            let mut db = sqlx::PgConnection::connect(&env.database)
                .await
                .expect("the database");
            let deleted = sqlx::query("DELETE FROM public.idem_records WHERE key = $1")
                .bind(key)
                .execute(&mut db)
                .await
                .expect("deleted");
            assert_eq!(deleted.rows_affected(), 1, "one record of {key}");
        }
    }
}

/// An operator's `idem doubt release` (or the record's retention passing) lands between the
/// reconciler's insert of the authorised charge and its settlement, which then changes
/// nothing: the charge row is there and the key is free (C8). The client's retry runs the
/// handler again, the network answers the same authorization under the same downstream key,
/// and the client gets that charge, the row the reconciler recorded: never a 500 on every
/// retry for a charge that went through. One authorization, one charge row.
async fn doubt_released_after_the_reconciler_recorded_the_charge_answers_it(backend: Backend) {
    let env = TestEnv::new(backend, "doubt-lost-settle").await;
    let server = start_without_reconciler(&env).await;
    let api = server.api();
    let key = new_key("doubt-lost-settle");
    let req =
        ChargeRequest::form(&key, 4242).with_network_fault(NetworkFault::TimeoutAfterCharging);
    let retry = req.clone().without_network_fault();

    let first = api.post_raw(&req).await;
    assert_in_doubt(&first);
    let report = api.reconcile().await;
    assert_report(&report, &[("checked", 1), ("settled", 1)]);
    assert_eq!(api.charge_count().await, 1, "the reconciler recorded it");
    // The end of that race: the record released, the reconciler's row kept.
    delete_record(&env, &key).await;

    let again = api.post_raw(&retry).await;
    show(backend, "retry after the release", &again);
    let charge = assert_charge(&again, 4242, "usd");
    assert!(!again.replayed(), "{}", again.describe());
    assert_retrievable(&api, &charge).await;
    let replay = api.post_raw(&retry).await;
    assert_replay_of(&replay, &again, &key);
    show_and_assert_one_charge(backend, &api).await;
}

/// A description with a NUL character (`description=a%00b`, or `"a\u0000b"` in JSON) is a
/// client's error: PostgreSQL's text cannot hold it. It must be refused as such (a 400 before
/// anything is charged), never a retry-inviting 500 (docs/http.md: "the client's errors are
/// never a retry-inviting 500"). Today the card network authorises the card first, the charge's
/// INSERT then fails, and the key is released with a 500 `internal_error`: every retry
/// re-authorises and fails again, and the corrected retry is a 409 `network_key_reused`.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn c08_postgres_a_nul_in_the_description_is_a_400_and_charges_nothing() {
    let env = TestEnv::new(Backend::Postgres, "nul-description").await;
    let server = Server::start(&env, None).await;
    let api = server.api();
    let key = new_key("nul-description");
    let req = ChargeRequest::form_fields(
        &key,
        &[
            ("amount", "321"),
            ("currency", "usd"),
            ("description", "a\0b"),
        ],
    );
    let first = api.post_raw(&req).await;
    let corrected = api
        .post_raw(&ChargeRequest::form_fields(
            &key,
            &[
                ("amount", "321"),
                ("currency", "usd"),
                ("description", "ab"),
            ],
        ))
        .await;
    println!(
        "NUL description: {} {}\ncorrected retry: {} {}\nauthorizations: {}, rows: {}",
        first.status,
        first.text(),
        corrected.status,
        corrected.text(),
        api.authorization_count().await,
        api.charge_count().await
    );
    assert_eq!(
        first.status,
        StatusCode::BAD_REQUEST,
        "a client's error, refused: {}",
        first.describe()
    );
    assert_charge(&corrected, 321, "usd");
    assert_eq!(api.authorization_count().await, 1, "one authorization");
}
