//! End-to-end tests of the receiver's other senders (Standard Webhooks, GitHub, Shopify): the
//! real binary as a child process, each sender on its own route with its own secret. For each
//! scheme a storm of shuffled, concurrent duplicate deliveries gives exactly one effect per
//! event (the rows of `received_events`, `GET /test/events/count`), for GitHub and Shopify
//! whatever delivery ids the copies carry; a captured GitHub or Shopify delivery replayed under
//! fresh delivery ids runs no second effect; bad signatures are refused, a rotated-out secret
//! is refused while the new and the old one pass during the rotation; Standard Webhooks' stale
//! timestamps are refused and Svix's header names accepted; a sender without a secret has no
//! route; a doubled `Stripe-Signature` is refused.

mod support;

use idem::inbox::{GitHubScheme, ShopifyScheme, SignatureScheme, StandardWebhooks};
use reqwest::StatusCode;
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use support::{
    assert_problem, error_chain, new_event_id, now_unix, random_u64, shuffle, Event, Reply, Server,
    TestEnv,
};

const STRIPE_SECRET: &str = "whsec_e2e_schemes_stripe";
/// Standard Webhooks secrets: the one in use, the one being rotated out, and one retired
/// before (no longer configured).
const STANDARD_NEW: &str = "whsec_bmV3LXN0YW5kYXJkLXNlY3JldC0wMDE=";
const STANDARD_OLD: &str = "whsec_b2xkLXN0YW5kYXJkLXNlY3JldC0wMDA=";
const STANDARD_RETIRED: &str = "whsec_cmV0aXJlZC1zdGFuZGFyZC1zZWNyZXQ=";
const GITHUB_NEW: &str = "github-new-secret";
const GITHUB_OLD: &str = "github-old-secret";
const GITHUB_RETIRED: &str = "github-retired-secret";
const SHOPIFY_NEW: &str = "shpss_new_0123456789";
const SHOPIFY_OLD: &str = "shpss_old_0123456789";
const SHOPIFY_RETIRED: &str = "shpss_retired_012345";

/// Events per storm, and deliveries of each.
const EVENTS: usize = 5;
const COPIES: usize = 8;
/// Concurrent senders in a storm.
const SENDERS: usize = 10;

/// One of the three senders, signing with `secret`.
#[derive(Clone, Copy, Debug)]
enum Kind {
    Standard,
    GitHub,
    Shopify,
}

impl Kind {
    fn path(self) -> &'static str {
        match self {
            Kind::Standard => "/webhooks/standard",
            Kind::GitHub => "/webhooks/github",
            Kind::Shopify => "/webhooks/shopify",
        }
    }

    fn source(self) -> &'static str {
        match self {
            Kind::Standard => "standard-webhooks",
            Kind::GitHub => "github",
            Kind::Shopify => "shopify",
        }
    }

    /// The secrets of a rotation: (new, old, retired).
    fn secrets(self) -> (&'static str, &'static str, &'static str) {
        match self {
            Kind::Standard => (STANDARD_NEW, STANDARD_OLD, STANDARD_RETIRED),
            Kind::GitHub => (GITHUB_NEW, GITHUB_OLD, GITHUB_RETIRED),
            Kind::Shopify => (SHOPIFY_NEW, SHOPIFY_OLD, SHOPIFY_RETIRED),
        }
    }

    /// The headers a sender signing with `secret` puts on one delivery `id` of an event
    /// (`webhook-id`, signed; `X-GitHub-Delivery` and `X-Shopify-Event-Id`, not signed), signed
    /// at `t` (only Standard Webhooks signs a time).
    fn headers(self, secret: &str, id: &str, body: &[u8], t: i64) -> Vec<(String, String)> {
        let pairs: Vec<(&str, String)> = match self {
            Kind::Standard => {
                let scheme = StandardWebhooks::new([secret]).expect("a Standard Webhooks secret");
                vec![
                    ("webhook-id", id.to_owned()),
                    ("webhook-timestamp", t.to_string()),
                    ("webhook-signature", scheme.sign(id, t, body)),
                ]
            }
            Kind::GitHub => {
                let scheme = GitHubScheme::new([secret]).expect("a GitHub secret");
                vec![
                    ("x-hub-signature-256", scheme.sign(body)),
                    ("x-github-delivery", id.to_owned()),
                    ("x-github-event", self.event_name().to_owned()),
                    ("user-agent", "GitHub-Hookshot/e2e".to_owned()),
                ]
            }
            Kind::Shopify => {
                let scheme = ShopifyScheme::new([secret]).expect("a Shopify secret");
                vec![
                    ("x-shopify-hmac-sha256", scheme.sign(body)),
                    ("x-shopify-event-id", id.to_owned()),
                    ("x-shopify-topic", self.event_name().to_owned()),
                    // Another webhook id on every attempt: the key does not depend on it (nor on
                    // the event id), only on the topic and the body.
                    ("x-shopify-webhook-id", format!("wh_{:016x}", random_u64())),
                ]
            }
        };
        pairs
            .into_iter()
            .map(|(name, value)| (name.to_owned(), value))
            .collect()
    }

    /// An event's body, serialised once: every delivery of it sends these bytes.
    fn body(self, id: &str) -> Vec<u8> {
        let value = match self {
            Kind::Standard => json!({
                "type": "invoice.paid",
                "timestamp": "2026-01-01T00:00:00Z",
                "data": {"id": id, "amount": 4200},
            }),
            Kind::GitHub => json!({
                "action": "opened",
                "issue": {"number": random_u64() % 10_000, "title": id},
                "repository": {"full_name": "octo-org/octo-repo"},
            }),
            Kind::Shopify => json!({
                "id": random_u64() % 1_000_000_000,
                "name": format!("#{id}"),
                "financial_status": "paid",
                "total_price": "42.00",
            }),
        };
        serde_json::to_vec(&value).expect("json")
    }

    /// The event name (GitHub) or topic (Shopify) the senders put on their deliveries.
    fn event_name(self) -> &'static str {
        match self {
            Kind::Standard => "-",
            Kind::GitHub => "issues",
            Kind::Shopify => "orders/paid",
        }
    }

    fn new_id(self, label: &str) -> String {
        match self {
            Kind::Standard => format!("msg_{label}_{:016x}", random_u64()),
            Kind::GitHub | Kind::Shopify => format!(
                "{:08x}-{:04x}-4{:03x}-8{:03x}-{:012x}-{label}",
                random_u64() as u32,
                random_u64() as u16,
                random_u64() % 0x1000,
                random_u64() % 0x1000,
                random_u64() % 0x1_0000_0000_0000
            ),
        }
    }
}

/// A server with every sender's secrets: Stripe's, and for each other sender the new and the
/// old secret of a rotation.
async fn start(env: &TestEnv) -> Server {
    let standard = format!("{STANDARD_NEW},{STANDARD_OLD}");
    let github = format!("{GITHUB_NEW}, {GITHUB_OLD}");
    let shopify = format!("{SHOPIFY_NEW},{SHOPIFY_OLD}");
    Server::start_with(
        env,
        STRIPE_SECRET,
        &[
            ("STANDARD_WEBHOOK_SECRET", standard.as_str()),
            ("GITHUB_WEBHOOK_SECRET", github.as_str()),
            ("SHOPIFY_WEBHOOK_SECRET", shopify.as_str()),
        ],
    )
    .await
}

fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .no_proxy()
        .connect_timeout(Duration::from_secs(2))
        .build()
        .expect("a reqwest client")
}

/// One POST of `body` with `headers` to `path`; no retry.
async fn post(
    http: &reqwest::Client,
    server: &Server,
    path: &str,
    headers: &[(String, String)],
    body: &[u8],
) -> Result<Reply, String> {
    let mut request = http
        .post(server.url(path))
        .header("content-type", "application/json")
        .timeout(Duration::from_secs(30))
        .body(body.to_vec());
    for (name, value) in headers {
        request = request.header(name.as_str(), value.as_str());
    }
    Reply::fetch(request).await.map_err(|e| error_chain(&e))
}

/// Delivers `body` under delivery id `id` until the receiver answers other than 409 or 5xx, as
/// the senders do (signing each attempt afresh); returns every status and the final reply.
async fn deliver(
    http: &reqwest::Client,
    server: &Server,
    kind: Kind,
    id: &str,
    body: &[u8],
    delay_ms: u64,
) -> (Reply, Vec<u16>) {
    let started = Instant::now();
    let mut statuses = Vec::new();
    loop {
        let mut headers = kind.headers(kind.secrets().0, id, body, now_unix());
        headers.push(("x-test-delay-ms".to_owned(), delay_ms.to_string()));
        match post(http, server, kind.path(), &headers, body).await {
            Ok(reply) => {
                statuses.push(reply.status.as_u16());
                if reply.status != StatusCode::CONFLICT && !reply.status.is_server_error() {
                    return (reply, statuses);
                }
            }
            Err(error) => eprintln!("delivery of {id} failed, retrying: {error}"),
        }
        assert!(
            started.elapsed() < Duration::from_secs(120),
            "{id} was not acknowledged: {statuses:?}"
        );
        tokio::time::sleep(Duration::from_millis(20 + random_u64() % 30)).await;
    }
}

/// `GET /test/events/count?source=...`: (rows, distinct event ids).
async fn effects(http: &reqwest::Client, server: &Server, kind: Kind) -> (u64, u64) {
    let path = format!("/test/events/count?source={}", kind.source());
    let reply = Reply::fetch(http.get(server.url(&path)).timeout(Duration::from_secs(10)))
        .await
        .unwrap_or_else(|e| panic!("GET {path}: {}", error_chain(&e)));
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.describe());
    let page: Value = reply.json();
    (
        page["count"].as_u64().expect("count"),
        page["distinct"].as_u64().expect("distinct"),
    )
}

/// 5 events × 8 copies, shuffled, from 10 concurrent senders that retry 409s and 5xx: every
/// delivery acknowledged, exactly one live processing and exactly one effect per event, the
/// others replays; the audit trail has each event once. For GitHub and Shopify half the copies
/// carry the event's delivery id (redeliveries) and half a fresh one (replays of a capture):
/// their key is the event name and the body, so all are duplicates.
async fn storm_gives_one_effect_per_event(kind: Kind) {
    let env = TestEnv::new(&format!("storm-{}", kind.source()));
    let server = start(&env).await;
    let http = client();

    let events: Vec<(String, Vec<u8>)> = (0..EVENTS)
        .map(|n| {
            let id = kind.new_id(&format!("n{n}"));
            let body = kind.body(&id);
            (id, body)
        })
        .collect();
    // (event, delivery id, body)
    let mut queue: Vec<(String, String, Vec<u8>)> = events
        .iter()
        .flat_map(|(id, body)| {
            (0..COPIES).map(move |copy| {
                let delivery = match kind {
                    Kind::GitHub | Kind::Shopify if copy % 2 == 1 => kind.new_id("replay"),
                    _ => id.clone(),
                };
                (id.clone(), delivery, body.clone())
            })
        })
        .collect();
    shuffle(&mut queue);
    let queue = Arc::new(queue);
    let next = Arc::new(AtomicUsize::new(0));
    let server = Arc::new(server);

    let mut tasks = Vec::new();
    for _ in 0..SENDERS {
        let (queue, next, server, http) = (
            Arc::clone(&queue),
            Arc::clone(&next),
            Arc::clone(&server),
            http.clone(),
        );
        tasks.push(tokio::spawn(async move {
            let mut done = Vec::new();
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                let Some((id, delivery, body)) = queue.get(i) else {
                    break;
                };
                // A short handler, so that copies arrive while the first one runs (409s).
                let (reply, statuses) = deliver(&http, &server, kind, delivery, body, 30).await;
                done.push((id.clone(), reply, statuses));
            }
            done
        }));
    }
    let mut live: BTreeMap<String, usize> = BTreeMap::new();
    let mut deliveries = 0;
    let mut statuses_seen: BTreeMap<u16, usize> = BTreeMap::new();
    for task in tasks {
        for (id, reply, statuses) in task.await.expect("a sender task panicked") {
            deliveries += 1;
            assert_eq!(reply.status, StatusCode::OK, "{id}: {}", reply.describe());
            assert_eq!(
                reply.json(),
                json!({"received": true}),
                "{}",
                reply.describe()
            );
            for status in statuses {
                *statuses_seen.entry(status).or_default() += 1;
            }
            if !reply.replayed() {
                *live.entry(id).or_default() += 1;
            }
        }
    }
    eprintln!("{kind:?}: {deliveries} deliveries, statuses {statuses_seen:?}");
    assert_eq!(deliveries, EVENTS * COPIES);
    assert_eq!(
        live.len(),
        EVENTS,
        "each event processed live once: {live:?}"
    );
    assert!(
        live.values().all(|n| *n == 1),
        "an event ran live twice: {live:?}"
    );
    assert_eq!(
        effects(&http, &server, kind).await,
        (EVENTS as u64, EVENTS as u64),
        "exactly one effect per event"
    );

    let audit_path = format!("/test/audit?source={}", kind.source());
    let audit = Reply::fetch(http.get(server.url(&audit_path)))
        .await
        .expect("the audit trail")
        .json();
    let entries = audit["entries"].as_array().cloned().expect("entries");
    assert_eq!(entries.len(), EVENTS, "{entries:#?}");
    for entry in &entries {
        assert_eq!(entry["outcome"], "processed", "{entry}");
        // The audit's event id is the inbox's key: the signed id, or the name and the body's
        // digest.
        let key = entry["event_id"].as_str().expect("an event id");
        let expected = match kind {
            Kind::Standard => events.iter().any(|(id, _)| id == key),
            Kind::GitHub | Kind::Shopify => events.iter().any(|(_, body)| {
                key == format!("{} {}", kind.event_name(), blake3::hash(body).to_hex())
            }),
        };
        assert!(expected, "{key}");
    }
}

/// A captured GitHub or Shopify delivery (one body, its signature) posted again under fresh
/// delivery ids: acknowledged as a duplicate each time, no second effect. The same body under
/// another (unsigned) event name is one more event, and no more however often it is sent.
async fn replay_under_fresh_delivery_ids_runs_once(kind: Kind) {
    let env = TestEnv::new(&format!("replay-{}", kind.source()));
    let server = start(&env).await;
    let http = client();
    let (secret, _, _) = kind.secrets();
    let body = kind.body(&kind.new_id("captured"));
    let captured = kind.headers(secret, &kind.new_id("captured"), &body, 0);
    let (delivery_header, event_header) = match kind {
        Kind::GitHub => ("x-github-delivery", "x-github-event"),
        _ => ("x-shopify-event-id", "x-shopify-topic"),
    };
    let with = |name: &str, value: &str| -> Vec<(String, String)> {
        captured
            .iter()
            .map(|(n, v)| {
                let v = if n == name {
                    value.to_owned()
                } else {
                    v.clone()
                };
                (n.clone(), v)
            })
            .collect()
    };
    for n in 0..3 {
        let replay = with(delivery_header, &kind.new_id(&format!("replay{n}")));
        let reply = post(&http, &server, kind.path(), &replay, &body)
            .await
            .expect("an answer");
        assert_eq!(reply.status, StatusCode::OK, "{}", reply.describe());
        assert_eq!(reply.replayed(), n > 0, "{n}: {}", reply.describe());
        assert_eq!(effects(&http, &server, kind).await, (1, 1), "replay {n}");
    }
    // Another event name: at most one more run, whatever delivery ids it carries.
    for n in 0..2 {
        let mut renamed = with(event_header, "renamed");
        renamed.retain(|(name, _)| name != delivery_header);
        renamed.push((
            delivery_header.to_owned(),
            kind.new_id(&format!("renamed{n}")),
        ));
        let reply = post(&http, &server, kind.path(), &renamed, &body)
            .await
            .expect("an answer");
        assert_eq!(reply.status, StatusCode::OK, "{}", reply.describe());
        assert_eq!(reply.replayed(), n > 0, "{n}: {}", reply.describe());
    }
    assert_eq!(effects(&http, &server, kind).await, (2, 2));
}

/// Signatures that are not the sender's are refused with a 400 and record nothing; during a
/// rotation the new and the old secret pass, a retired one does not.
async fn bad_signatures_and_rotation(kind: Kind) {
    let env = TestEnv::new(&format!("origin-{}", kind.source()));
    let server = start(&env).await;
    let http = client();
    let (new, old, retired) = kind.secrets();

    // A retired secret, an altered body, no signature at all: 400, nothing recorded.
    let id = kind.new_id("retired");
    let body = kind.body(&id);
    let headers = kind.headers(retired, &id, &body, now_unix());
    let reply = post(&http, &server, kind.path(), &headers, &body)
        .await
        .expect("an answer");
    assert_problem(&reply, 400, "signature-mismatch");

    let good = kind.headers(new, &id, &body, now_unix());
    let mut altered = body.clone();
    altered.push(b' ');
    let reply = post(&http, &server, kind.path(), &good, &altered)
        .await
        .expect("an answer");
    assert_problem(&reply, 400, "signature-mismatch");

    let signature_header = match kind {
        Kind::Standard => "webhook-signature",
        Kind::GitHub => "x-hub-signature-256",
        Kind::Shopify => "x-shopify-hmac-sha256",
    };
    let unsigned: Vec<(String, String)> = good
        .iter()
        .filter(|(name, _)| name != signature_header)
        .cloned()
        .collect();
    let reply = post(&http, &server, kind.path(), &unsigned, &body)
        .await
        .expect("an answer");
    assert_problem(&reply, 400, "signature-missing");

    let garbled: Vec<(String, String)> = good
        .iter()
        .map(|(name, value)| {
            if name == signature_header {
                (name.clone(), "not a signature".to_owned())
            } else {
                (name.clone(), value.clone())
            }
        })
        .collect();
    let reply = post(&http, &server, kind.path(), &garbled, &body)
        .await
        .expect("an answer");
    assert_problem(&reply, 400, "signature-malformed");
    assert_eq!(
        effects(&http, &server, kind).await,
        (0, 0),
        "nothing recorded"
    );

    // During the rotation: the new secret and the old one are both accepted.
    for (label, secret) in [("new", new), ("old", old)] {
        let id = kind.new_id(label);
        let body = kind.body(&id);
        let headers = kind.headers(secret, &id, &body, now_unix());
        let reply = post(&http, &server, kind.path(), &headers, &body)
            .await
            .expect("an answer");
        assert_eq!(
            reply.status,
            StatusCode::OK,
            "{label}: {}",
            reply.describe()
        );
    }
    assert_eq!(effects(&http, &server, kind).await, (2, 2));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn standard_webhooks_storm_gives_one_effect_per_event() {
    storm_gives_one_effect_per_event(Kind::Standard).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn github_storm_gives_one_effect_per_event() {
    storm_gives_one_effect_per_event(Kind::GitHub).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn shopify_storm_gives_one_effect_per_event() {
    storm_gives_one_effect_per_event(Kind::Shopify).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn standard_webhooks_bad_signatures_refused_rotation_accepted() {
    bad_signatures_and_rotation(Kind::Standard).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn github_bad_signatures_refused_rotation_accepted() {
    bad_signatures_and_rotation(Kind::GitHub).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shopify_bad_signatures_refused_rotation_accepted() {
    bad_signatures_and_rotation(Kind::Shopify).await;
}

/// Standard Webhooks signs a time: a delivery signed more than 5 minutes ago (or ahead) is
/// refused, authentic or not, and records nothing; a redelivery re-signed now passes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn standard_webhooks_stale_or_future_timestamps_are_refused() {
    let env = TestEnv::new("standard-stale");
    let server = start(&env).await;
    let http = client();
    let kind = Kind::Standard;
    let id = kind.new_id("stale");
    let body = kind.body(&id);

    // 30 s beyond the tolerance either way, a margin for the test's own clock reading.
    let stale = kind.headers(STANDARD_NEW, &id, &body, now_unix() - 330);
    let reply = post(&http, &server, kind.path(), &stale, &body)
        .await
        .expect("an answer");
    assert_problem(&reply, 400, "signature-stale");
    let future = kind.headers(STANDARD_NEW, &id, &body, now_unix() + 330);
    let reply = post(&http, &server, kind.path(), &future, &body)
        .await
        .expect("an answer");
    assert_problem(&reply, 400, "signature-future");
    // Well within the tolerance (it is exact at 300 s: see the scheme's unit tests).
    let recent = kind.headers(STANDARD_NEW, &id, &body, now_unix() - 240);
    let reply = post(&http, &server, kind.path(), &recent, &body)
        .await
        .expect("an answer");
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.describe());
    assert_eq!(effects(&http, &server, kind).await, (1, 1));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn github_replay_under_fresh_delivery_ids_runs_once() {
    replay_under_fresh_delivery_ids_runs_once(Kind::GitHub).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shopify_replay_under_fresh_event_ids_runs_once() {
    replay_under_fresh_delivery_ids_runs_once(Kind::Shopify).await;
}

/// GitHub's key is the event name and the body, not the unsigned delivery id: another payload
/// under a delivery id already seen is another event, processed (GitHub itself never sends
/// that: a redelivery re-sends the same bytes).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn github_another_payload_under_a_seen_delivery_id_is_another_event() {
    let env = TestEnv::new("github-other-payload");
    let server = start(&env).await;
    let http = client();
    let kind = Kind::GitHub;
    let id = kind.new_id("reused");
    let body = kind.body(&id);
    let headers = kind.headers(GITHUB_NEW, &id, &body, 0);
    let first = post(&http, &server, kind.path(), &headers, &body)
        .await
        .expect("an answer");
    assert_eq!(first.status, StatusCode::OK, "{}", first.describe());
    let other = kind.body(&id);
    assert_ne!(other, body);
    let headers = kind.headers(GITHUB_NEW, &id, &other, 0);
    let reply = post(&http, &server, kind.path(), &headers, &other)
        .await
        .expect("an answer");
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.describe());
    assert!(!reply.replayed(), "{}", reply.describe());
    assert_eq!(effects(&http, &server, kind).await, (2, 2));
}

/// Svix sends the Standard Webhooks headers as `svix-id`, `svix-timestamp`, `svix-signature`:
/// accepted, and the same message under the `webhook-*` names is a duplicate; a request with
/// headers of both sets is a 400 `headers-mixed` and records nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn standard_webhooks_accepts_svix_header_names_and_refuses_a_mix() {
    let env = TestEnv::new("standard-svix");
    let server = start(&env).await;
    let http = client();
    let kind = Kind::Standard;
    let id = kind.new_id("svix");
    let body = kind.body(&id);
    let standard = kind.headers(STANDARD_NEW, &id, &body, now_unix());
    let svix: Vec<(String, String)> = standard
        .iter()
        .map(|(name, value)| (name.replacen("webhook-", "svix-", 1), value.clone()))
        .collect();
    let mut mixed = svix.clone();
    mixed.push(standard.first().cloned().expect("webhook-id"));
    let reply = post(&http, &server, kind.path(), &mixed, &body)
        .await
        .expect("an answer");
    assert_problem(&reply, 400, "headers-mixed");
    assert_eq!(effects(&http, &server, kind).await, (0, 0));

    let reply = post(&http, &server, kind.path(), &svix, &body)
        .await
        .expect("an answer");
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.describe());
    assert!(!reply.replayed(), "{}", reply.describe());
    let reply = post(&http, &server, kind.path(), &standard, &body)
        .await
        .expect("an answer");
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.describe());
    assert!(reply.replayed(), "{}", reply.describe());
    assert_eq!(effects(&http, &server, kind).await, (1, 1));
}

/// A `Stripe-Signature` sent twice is malformed (400, nothing recorded), as every scheme's
/// header; the same delivery with the header once is processed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stripe_signature_sent_twice_is_refused() {
    let env = TestEnv::new("stripe-doubled");
    let server = start(&env).await;
    let http = client();
    let event = Event::other(&new_event_id("doubled"), "customer.created");
    let signature = SignatureScheme::new([STRIPE_SECRET])
        .expect("a Stripe secret")
        .sign(&event.body, now_unix());
    let once = vec![("stripe-signature".to_owned(), signature.clone())];
    let mut twice = once.clone();
    twice.push(("Stripe-Signature".to_owned(), signature));
    let reply = post(&http, &server, "/webhooks/stripe", &twice, &event.body)
        .await
        .expect("an answer");
    assert_problem(&reply, 400, "signature-malformed");
    let audit = Reply::fetch(http.get(server.url("/test/audit?source=stripe")))
        .await
        .expect("the audit trail")
        .json();
    assert_eq!(audit["count"], 0, "nothing recorded: {audit}");
    let reply = post(&http, &server, "/webhooks/stripe", &once, &event.body)
        .await
        .expect("an answer");
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.describe());
}

/// A sender whose secret is not set has no route: 404, while the configured one works.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sender_without_a_secret_has_no_route() {
    let env = TestEnv::new("unconfigured");
    let server = Server::start_with(
        &env,
        STRIPE_SECRET,
        &[("GITHUB_WEBHOOK_SECRET", GITHUB_NEW)],
    )
    .await;
    let http = client();
    for kind in [Kind::Standard, Kind::Shopify] {
        let id = kind.new_id("unrouted");
        let body = kind.body(&id);
        let (new, _, _) = kind.secrets();
        let headers = kind.headers(new, &id, &body, now_unix());
        let reply = post(&http, &server, kind.path(), &headers, &body)
            .await
            .expect("an answer");
        assert_problem(&reply, 404, "not-found");
    }
    let kind = Kind::GitHub;
    let id = kind.new_id("routed");
    let body = kind.body(&id);
    let headers = kind.headers(GITHUB_NEW, &id, &body, 0);
    let reply = post(&http, &server, kind.path(), &headers, &body)
        .await
        .expect("an answer");
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.describe());
}

/// `GET /test/audit` lists every entry, past `/audit`'s default page of 100; `limit` still
/// bounds it when given.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_test_audit_lists_every_entry() {
    let env = TestEnv::new("audit-all");
    let server = start(&env).await;
    let http = client();
    let scheme = SignatureScheme::new([STRIPE_SECRET]).expect("a Stripe secret");
    const EVENTS: usize = 105;
    for i in 0..EVENTS {
        let event = Event::other(&new_event_id(&format!("all{i}")), "customer.created");
        let signature = scheme.sign(&event.body, now_unix());
        let headers = vec![("stripe-signature".to_owned(), signature)];
        let reply = post(&http, &server, "/webhooks/stripe", &headers, &event.body)
            .await
            .expect("an answer");
        assert_eq!(reply.status, StatusCode::OK, "{}", reply.describe());
    }
    let all = Reply::fetch(http.get(server.url("/test/audit?source=stripe")))
        .await
        .expect("the audit trail")
        .json();
    assert_eq!(all["count"], EVENTS, "every entry: {}", all["count"]);
    let page = Reply::fetch(http.get(server.url("/audit?source=stripe")))
        .await
        .expect("the audit page")
        .json();
    assert_eq!(page["count"], 100, "the operator endpoint's default page");
    let bounded = Reply::fetch(http.get(server.url("/test/audit?source=stripe&limit=7")))
        .await
        .expect("the audit trail")
        .json();
    assert_eq!(bounded["count"], 7);
}
