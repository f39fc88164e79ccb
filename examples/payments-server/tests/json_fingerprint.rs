//! JSON bodies fingerprinted in canonical form (C3), through the real `payments-server` binary
//! on SQLite and on PostgreSQL: a charge re-sent with its keys in another order and other
//! whitespace replays; a record an earlier release stored under a JSON body's raw fingerprint
//! replays for the same bytes after the upgrade.

#[macro_use]
mod support;

use idem::store::Store;
use idem::{Begin, Idempotency, StoredResponse};
use support::{assert_charge, new_key, Backend, Server, TestEnv, API_KEY};

on_both_backends! {
    c03_a_json_charge_re_encoded_replays =>
        sqlite_c03_a_json_charge_re_encoded_replays,
        postgres_c03_a_json_charge_re_encoded_replays;
    c03_a_record_stored_under_the_raw_fingerprint_replays_after_the_upgrade =>
        sqlite_c03_a_record_stored_under_the_raw_fingerprint_replays_after_the_upgrade,
        postgres_c03_a_record_stored_under_the_raw_fingerprint_replays_after_the_upgrade;
}

/// A charge with `content_type` and `body` under `key`.
async fn charge(api: &support::Api, key: &str, content_type: &str, body: &str) -> support::Reply {
    api.charge_as("POST", key, content_type, body).await
}

async fn c03_a_json_charge_re_encoded_replays(backend: Backend) {
    let env = TestEnv::new(backend, "json-order").await;
    let server = Server::start(&env, None).await;
    let api = server.api();
    let key = new_key("json-order");
    let first = charge(
        &api,
        &key,
        "application/json",
        r#"{"amount":1500,"currency":"usd"}"#,
    )
    .await;
    assert_charge(&first, 1500, "usd");
    let reencoded = charge(
        &api,
        &key,
        "application/json; charset=utf-8",
        "{\n  \"currency\": \"usd\",\n  \"amount\": 1500\n}",
    )
    .await;
    assert!(
        reencoded.replayed(),
        "the same JSON, re-encoded: {}",
        reencoded.describe()
    );
    assert_eq!(reencoded.status, first.status);
    assert_eq!(reencoded.body, first.body);
    assert_eq!(api.charge_count().await, 1, "one charge");
}

/// The account the server scopes a request with `API_KEY` to (its `account`).
fn account() -> String {
    let digest = blake3::hash(API_KEY.as_bytes()).to_hex();
    format!("acct_{}", &digest[..16])
}

/// What an earlier release stored for a JSON charge: the record under the body's raw
/// fingerprint, as the layer then computed it, completed with `answer`.
async fn store_as_earlier_release<S: Store + 'static>(
    store: S,
    key: &str,
    body: &str,
    answer: &str,
) {
    let idem = Idempotency::new(store);
    let request = idem
        .request(&account(), "POST", "/v1/charges")
        .path("/v1/charges")
        .key(Some(key))
        .content_type("application/json")
        .body(body.as_bytes())
        .build()
        .expect("a request");
    let Begin::Acquired(lease) = idem.begin(&request).await.expect("begin") else {
        panic!("a fresh key is acquired")
    };
    let response =
        StoredResponse::new(201, answer.to_owned()).with_header("content-type", "application/json");
    idem.complete(lease, response).await.expect("complete");
}

async fn c03_a_record_stored_under_the_raw_fingerprint_replays_after_the_upgrade(backend: Backend) {
    let env = TestEnv::new(backend, "json-upgrade").await;
    let key = new_key("json-upgrade");
    let body = r#"{"amount":1600,"currency":"usd"}"#;
    let earlier = r#"{"id":"ch_earlier","amount":1600,"currency":"usd"}"#;
    match backend {
        Backend::Sqlite => {
            let store = idem::sqlite::SqliteStore::open(&env.database)
                .await
                .expect("open");
            store_as_earlier_release(store, &key, body, earlier).await;
        }
        Backend::Postgres => {
            let store = idem::postgres::PgStore::connect(&env.database)
                .await
                .expect("connect");
            store.migrate().await.expect("migrate");
            store_as_earlier_release(store, &key, body, earlier).await;
        }
    }
    let server = Server::start(&env, None).await;
    let api = server.api();
    let retry = charge(&api, &key, "application/json", body).await;
    assert!(
        retry.replayed(),
        "the earlier release's record: {}",
        retry.describe()
    );
    assert_eq!(retry.status, 201);
    assert_eq!(retry.text(), earlier);
    let other = charge(
        &api,
        &key,
        "application/json",
        &body.replace("1600", "1601"),
    )
    .await;
    assert_eq!(other.status, 422, "{}", other.describe());
    assert_eq!(api.charge_count().await, 0, "nothing charged again");
}
