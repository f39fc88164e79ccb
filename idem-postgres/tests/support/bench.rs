//! A store reached through a fault proxy, a charges table of its own, and retrying clients:
//! what the network fault tests share. Charges are counted on connections straight to the
//! server, so a fault never hides one.

use fault_proxy::FaultProxy;
use idem_core::{Answer, FencingToken, Idempotency, Outcome, Policy, Request, RunError};
use idem_core::{Error, StoreErrorKind, StoredResponse};
use idem_postgres::sqlx::{self, AssertSqlSafe, Connection, PgConnection, Row};
use idem_postgres::{PgIdempotency, PgStore, PgStoreBuilder};
use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// What one transactional charge answered.
pub(crate) type Charged = Result<Outcome, RunError<sqlx::Error>>;

/// An engine over a store reached through a fault proxy.
pub(crate) struct Bench {
    pub proxy: Arc<FaultProxy>,
    pub idem: Idempotency<PgStore>,
    /// The server, straight (no proxy).
    pub direct_url: String,
    /// The store's table, schema-qualified and quoted.
    pub records: String,
    /// The charges table, schema-qualified.
    pub charges: String,
}

impl Bench {
    /// A bench on the server of `url` (through a new proxy), the store built by `builder` on a
    /// new table of `schema`, the engine with `policy`.
    pub(crate) async fn new(
        url: &str,
        schema: &str,
        builder: PgStoreBuilder,
        policy: Policy,
    ) -> Self {
        let (proxy, through) = super::proxied(url).await;
        let store = builder
            .schema(schema)
            .table(&format!("t_{}", FencingToken::generate()))
            .connect(&through)
            .await
            .expect("connect through the proxy");
        store.migrate().await.expect("migrate");
        let charges = format!("{schema}.charges_{}", FencingToken::generate());
        let records = store.table();
        let idem = Idempotency::with_policy(store, policy).expect("policy");
        let bench = Self {
            proxy: Arc::new(proxy),
            idem,
            direct_url: url.to_owned(),
            records,
            charges,
        };
        bench
            .direct(&format!(
                "CREATE TABLE {} (id bigserial PRIMARY KEY, intent text NOT NULL)",
                bench.charges
            ))
            .await;
        bench
    }

    /// A charge request for `key`.
    pub(crate) fn request(&self, key: &str) -> Request {
        self.idem
            .request("acct", "POST", "/charges")
            .key(Some(key))
            .body(b"{\"cents\":2500}")
            .build()
            .expect("request")
    }

    /// The INSERT of a charge for `request`, for an effect.
    pub(crate) fn insert(&self, request: &Request) -> (String, String) {
        (
            format!(
                "INSERT INTO {} (intent) VALUES ($1) RETURNING id",
                self.charges
            ),
            request.id().key().to_owned(),
        )
    }

    /// The charge, in the transaction of the engine's transactional closure.
    pub(crate) async fn charge(&self, request: &Request) -> Charged {
        let (insert, intent) = self.insert(request);
        self.idem
            .run_in_transaction(request, move |tx, _lease| {
                Box::pin(async move {
                    let (id,): (i64,) = sqlx::query_as(AssertSqlSafe(insert))
                        .bind(intent)
                        .fetch_one(&mut *tx)
                        .await?;
                    Ok::<_, sqlx::Error>(StoredResponse::new(201, format!("charge {id}")))
                })
            })
            .await
    }

    /// Runs `statement` on a connection straight to the server.
    pub(crate) async fn direct(&self, statement: &str) {
        let mut conn = PgConnection::connect(&self.direct_url)
            .await
            .expect("connect");
        sqlx::raw_sql(AssertSqlSafe(statement.to_owned()))
            .execute(&mut conn)
            .await
            .expect(statement);
    }

    /// How many charges each intent has, read straight from the server.
    pub(crate) async fn charges_by_intent(&self) -> HashMap<String, i64> {
        let mut conn = PgConnection::connect(&self.direct_url)
            .await
            .expect("connect");
        let query = format!(
            "SELECT intent, COUNT(*) FROM {} GROUP BY intent",
            self.charges
        );
        sqlx::raw_sql(AssertSqlSafe(query))
            .fetch_all(&mut conn)
            .await
            .expect("charges")
            .iter()
            .map(|row| {
                (
                    row.try_get::<String, _>(0).expect("an intent"),
                    row.try_get::<i64, _>(1).expect("a count"),
                )
            })
            .collect()
    }

    /// How many charges `request` has.
    pub(crate) async fn charges_of(&self, request: &Request) -> i64 {
        self.charges_by_intent()
            .await
            .get(request.id().key())
            .copied()
            .unwrap_or(0)
    }

    /// Charges `request` until it is executed or replayed, at most until `within` has passed,
    /// `retry_every` between attempts; what each attempt answered, and how long it took.
    pub(crate) async fn charge_until_answered(
        &self,
        request: &Request,
        retry_every: Duration,
        within: Duration,
    ) -> Vec<(Charged, Duration)> {
        let until = Instant::now() + within;
        let mut attempts = Vec::new();
        loop {
            let started = Instant::now();
            let charged = self.charge(request).await;
            let took = started.elapsed();
            let done = answered(&charged);
            attempts.push((charged, took));
            if done || Instant::now() >= until {
                return attempts;
            }
            tokio::time::sleep(retry_every).await;
        }
    }
}

/// One charge of `key` by `idem`: its row in `charges`, written in the transaction of the
/// completion; the body is the row's id and the port of the server that ran it.
pub(crate) async fn charge_reporting_port(
    idem: &Idempotency<PgStore>,
    charges: &str,
    key: &str,
) -> Charged {
    let request = idem
        .request("acct", "POST", "/charges")
        .key(Some(key))
        .body(b"{\"cents\":2500}")
        .build()
        .expect("request");
    let insert = format!("INSERT INTO {charges} (intent) VALUES ($1) RETURNING id");
    let intent = key.to_owned();
    idem.run_in_transaction(&request, move |tx, _lease| {
        Box::pin(async move {
            let (id,): (i64,) = sqlx::query_as(AssertSqlSafe(insert))
                .bind(intent)
                .fetch_one(&mut *tx)
                .await?;
            let (port,): (String,) = sqlx::query_as("SELECT current_setting('port')")
                .fetch_one(&mut *tx)
                .await?;
            Ok::<_, sqlx::Error>(StoredResponse::new(201, format!("{id} {port}")))
        })
    })
    .await
}

/// Whether `charged` is the request's answer for good: executed, or replayed.
pub(crate) fn answered(charged: &Charged) -> bool {
    matches!(
        charged,
        Ok(Outcome::Executed(_)) | Ok(Outcome::Answered(Answer::Replay(_)))
    )
}

/// Whether `charged` is a store-unavailable error: a 503 with `Retry-After`.
pub(crate) fn unavailable(charged: &Charged) -> bool {
    matches!(
        charged,
        Err(RunError::Idem(Error::Store(e))) if e.kind() == StoreErrorKind::Unavailable
    )
}

/// A short account of what `charged` is, for the test's report.
pub(crate) fn kind(charged: &Charged) -> String {
    match charged {
        Ok(Outcome::Executed(_)) => "executed".into(),
        Ok(Outcome::Answered(Answer::Replay(_))) => "replayed".into(),
        Ok(Outcome::Answered(Answer::InFlight { .. })) => "in_flight".into(),
        Ok(other) => format!("{other:?}"),
        Err(RunError::Idem(Error::Store(e))) if e.kind() == StoreErrorKind::Other => {
            format!("store_Other({e})")
        }
        Err(RunError::Idem(Error::Store(e))) => format!("store_{:?}", e.kind()),
        Err(RunError::Idem(e)) => format!("idem_error({e})"),
        Err(RunError::Released(_)) => "released(effect error)".into(),
        Err(RunError::InDoubt(_)) => "in_doubt".into(),
        Err(other) => format!("{other:?}"),
    }
}

/// Counts of each kind of answer, sorted, for the test's report.
pub(crate) fn tally<'a>(answers: impl IntoIterator<Item = &'a Charged>) -> Vec<(String, usize)> {
    let mut counts: HashMap<String, usize> = HashMap::new();
    for charged in answers {
        *counts.entry(kind(charged)).or_default() += 1;
    }
    let mut counts: Vec<_> = counts.into_iter().collect();
    counts.sort();
    counts
}
