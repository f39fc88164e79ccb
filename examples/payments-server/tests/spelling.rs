//! One record per request whatever its spelling, and strict key syntax, through the real
//! `payments-server` binary on SQLite and on PostgreSQL (docs/http.md; C1, C3): `post` and
//! `POST` share one record; a form whose fields come in another order replays; the same bytes
//! under another media type are another request (422); every invalid form of the key is a 400
//! that charges nothing.

#[macro_use]
mod support;

use support::{assert_charge, assert_error, new_key, Backend, Server, TestEnv};

on_both_backends! {
    c03_a_method_in_lower_case_shares_the_record =>
        sqlite_c03_a_method_in_lower_case_shares_the_record,
        postgres_c03_a_method_in_lower_case_shares_the_record;
    c03_a_form_with_its_fields_reordered_replays =>
        sqlite_c03_a_form_with_its_fields_reordered_replays,
        postgres_c03_a_form_with_its_fields_reordered_replays;
    c03_the_same_bytes_under_another_media_type_are_a_mismatch =>
        sqlite_c03_the_same_bytes_under_another_media_type_are_a_mismatch,
        postgres_c03_the_same_bytes_under_another_media_type_are_a_mismatch;
    c01_every_invalid_key_form_is_a_400_and_charges_nothing =>
        sqlite_c01_every_invalid_key_form_is_a_400_and_charges_nothing,
        postgres_c01_every_invalid_key_form_is_a_400_and_charges_nothing;
}

const FORM: &str = "application/x-www-form-urlencoded";

/// A charge sent with `method` spelled as given, `content_type` and `body`, under `key`.
async fn charge(
    api: &support::Api,
    method: &str,
    key: &str,
    content_type: &str,
    body: &str,
) -> support::Reply {
    api.charge_as(method, key, content_type, body).await
}

async fn c03_a_method_in_lower_case_shares_the_record(backend: Backend) {
    let env = TestEnv::new(backend, "method").await;
    let server = Server::start(&env, None).await;
    let api = server.api();
    let key = new_key("method");
    let body = "amount=1200&currency=usd";
    let first = charge(&api, "POST", &key, FORM, body).await;
    assert_charge(&first, 1200, "usd");
    for spelling in ["post", "Post", "POST"] {
        let again = charge(&api, spelling, &key, FORM, body).await;
        assert!(
            again.replayed(),
            "{spelling}: a replay of the POST, not another charge: {}",
            again.describe()
        );
        assert_eq!(again.body, first.body, "{spelling}: the same bytes");
    }
    assert_eq!(api.charge_count().await, 1, "one charge");
}

async fn c03_a_form_with_its_fields_reordered_replays(backend: Backend) {
    let env = TestEnv::new(backend, "form-order").await;
    let server = Server::start(&env, None).await;
    let api = server.api();
    let key = new_key("form-order");
    let first = charge(
        &api,
        "POST",
        &key,
        FORM,
        "amount=1300&currency=usd&description=a%20b",
    )
    .await;
    assert_charge(&first, 1300, "usd");
    // Another order, another percent-encoding of the same text.
    let reordered = charge(
        &api,
        "POST",
        &key,
        "application/x-www-form-urlencoded; charset=UTF-8",
        "description=a+b&currency=usd&amount=1300",
    )
    .await;
    assert!(
        reordered.replayed(),
        "the same form, re-encoded: {}",
        reordered.describe()
    );
    assert_eq!(reordered.body, first.body);
    assert_eq!(api.charge_count().await, 1, "one charge");
}

async fn c03_the_same_bytes_under_another_media_type_are_a_mismatch(backend: Backend) {
    let env = TestEnv::new(backend, "media-type").await;
    let server = Server::start(&env, None).await;
    let api = server.api();
    let key = new_key("media-type");
    let body = r#"{"amount":1400,"currency":"usd"}"#;
    let first = charge(&api, "POST", &key, "application/json", body).await;
    assert_charge(&first, 1400, "usd");
    let as_form = charge(&api, "POST", &key, FORM, body).await;
    assert_error(&as_form, 422, "idempotency_error", None);
    assert!(!as_form.replayed(), "{}", as_form.describe());
    assert_eq!(api.charge_count().await, 1, "one charge");
}

async fn c01_every_invalid_key_form_is_a_400_and_charges_nothing(backend: Backend) {
    let env = TestEnv::new(backend, "key-forms").await;
    let server = Server::start(&env, None).await;
    let api = server.api();
    for key in [
        "a,b",
        "a, b",
        "k;p=1",
        "\"k\";p=1",
        "k(x)",
        "k=v",
        "mid\"quote",
        "\"unterminated",
        "k v",
    ] {
        let reply = charge(&api, "POST", key, FORM, "amount=1500&currency=usd").await;
        assert_eq!(reply.status.as_u16(), 400, "{key:?}: {}", reply.describe());
    }
    assert_eq!(api.charge_count().await, 0, "no charge");
    // The forms the draft allows, and a bare token, are keys.
    let sf_string = format!("\"{}\"", new_key("sf"));
    let ok = charge(&api, "POST", &sf_string, FORM, "amount=1500&currency=usd").await;
    assert_charge(&ok, 1500, "usd");
}
