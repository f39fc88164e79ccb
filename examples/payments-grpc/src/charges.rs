//! The `Charges` service's handlers, the generated `charges_server::Charges` trait implemented:
//! `CreateCharge` writes the charge and its idempotency completion in one transaction of the
//! database; `GetCharge` reads one back.

use crate::db::Backend;
use crate::proto::charges_server;
use crate::proto::{Charge, CreateChargeRequest, GetChargeRequest};
use idem::RunError;
use idem_tower::{grpc_nothing_happened, Completed, GrpcAnswer, Reservation};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use tonic::{Request, Response, Status};

/// The largest amount accepted, in the currency's smallest unit.
pub const MAX_AMOUNT: i64 = 99_999_999;

/// The metadata entry that names the account (a stand-in for real authentication).
pub const ACCOUNT: &str = "x-account";

/// With test hooks on, the metadata entry that makes `CreateCharge` wait this many
/// milliseconds before its transaction (a slow handler, for deadline tests).
pub const TEST_DELAY: &str = "x-test-delay-ms";

/// The handlers, over the database that also holds the idempotency records.
#[derive(Debug)]
pub struct Charges<B> {
    backend: B,
    test_hooks: bool,
}

impl<B: Backend> Charges<B> {
    /// The handlers over `backend`; `test_hooks` honours [`TEST_DELAY`].
    pub fn new(backend: B, test_hooks: bool) -> Self {
        Self {
            backend,
            test_hooks,
        }
    }
}

#[tonic::async_trait]
impl<B: Backend> charges_server::Charges for Charges<B> {
    /// `CreateCharge`: checks the request (a refusal, `INVALID_ARGUMENT`, releases the key),
    /// then inserts the charge and completes the reservation in one transaction, and answers
    /// with what was stored.
    async fn create_charge(
        &self,
        request: Request<CreateChargeRequest>,
    ) -> Result<Response<Charge>, Status> {
        let reservation = request
            .extensions()
            .get::<Reservation<B::Store>>()
            .cloned()
            // A misconfigured server, found before anything ran: never stored for the key.
            .ok_or_else(|| {
                grpc_nothing_happened(Status::internal(
                    "no reservation: the idempotency layer is missing",
                ))
            })?;
        let account = account_of(request.metadata())?;
        let delay = self
            .test_hooks
            .then(|| request.metadata().get(TEST_DELAY))
            .flatten()
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<u64>().ok())
            .map(Duration::from_millis);
        let new = request.into_inner();
        if !(1..=MAX_AMOUNT).contains(&new.amount) {
            return Err(Status::invalid_argument(format!(
                "amount must be 1..={MAX_AMOUNT}"
            )));
        }
        if new.currency.len() != 3 || !new.currency.bytes().all(|b| b.is_ascii_lowercase()) {
            return Err(Status::invalid_argument(
                "currency must be three lower-case letters",
            ));
        }
        if let Some(delay) = delay {
            tokio::time::sleep(delay).await;
        }
        let charge = Charge {
            id: new_id(),
            amount: new.amount,
            currency: new.currency,
            description: new.description,
            created: now_secs(),
        };
        let answer = GrpcAnswer::ok(&charge).into_stored();
        let completion = self
            .backend
            .create(&reservation, &account, &charge, answer)
            .await
            .map_err(|error| match error {
                // Failed before its COMMIT answered: the key is given back (fenced) and a
                // retry runs. A COMMIT that did land is found by the engine, which then sends
                // the stored charge instead of this.
                RunError::Released(_) | RunError::Idem(_) => {
                    tracing::warn!(%error, "the charge's transaction failed; giving the key back");
                    grpc_nothing_happened(Status::unavailable("the charge was not recorded; retry"))
                }
                // It may have happened: the key keeps the answer in doubt (C8).
                _ => {
                    tracing::error!(%error, "the charge's transaction may have committed");
                    Status::internal("the outcome of the charge is unknown")
                }
            })?;
        let mut response = Response::new(charge);
        response.extensions_mut().insert(Completed(completion));
        Ok(response)
    }

    /// `GetCharge`: the account's charge by id, or `NOT_FOUND`.
    async fn get_charge(
        &self,
        request: Request<GetChargeRequest>,
    ) -> Result<Response<Charge>, Status> {
        let account = account_of(request.metadata())?;
        let id = request.into_inner().id;
        match self.backend.get(&account, &id).await {
            Ok(Some(charge)) => Ok(Response::new(charge)),
            Ok(None) => Err(Status::not_found("no such charge")),
            Err(error) => Err(Status::unavailable(format!("the database failed: {error}"))),
        }
    }
}

/// The account the call is for: the `x-account` metadata entry (the idempotency layer has
/// already refused a call without one).
fn account_of(metadata: &tonic::metadata::MetadataMap) -> Result<String, Status> {
    metadata
        .get(ACCOUNT)
        .and_then(|v| v.to_str().ok())
        .filter(|v| !v.is_empty())
        .map(str::to_owned)
        .ok_or_else(|| Status::unauthenticated("send the account in x-account"))
}

fn now_secs() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}

/// `ch_` and 24 hex digits: the time in nanoseconds and a counter, unique in this file.
fn new_id() -> String {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    format!("ch_{:016x}{:08x}", nanos as u64, n as u32)
}
