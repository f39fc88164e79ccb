//! The reconciler of records in doubt: passes that check each record due with the
//! application's [`Reconcile`] and apply what it found with the engine's one decision path
//! ([`resolve`]).

use crate::listing::ListQuery;
use crate::operator::Operator;
use crate::periodic::Periodic;
use crate::reconcile::{in_doubt, resolve, Decided, Finding, InDoubt};
use crate::Holder;
use async_trait::async_trait;
use idem_core::store::CatchUnwind;
use idem_core::{Error, Idempotency, Operation};
use std::future::Future;
use std::time::Duration;

/// The application's side of a reconciliation: asks the provider about one record in doubt
/// and says what it found. Any `Fn(InDoubt) -> impl Future<Output = Finding>` is one.
///
/// A check that fails (the provider is down) is a [`Finding::still_unknown`], with what failed
/// as its [`answered`](Finding::answered) text; one that panics, or gives no answer within
/// [`CHECK_DEADLINE`], is taken as still unknown.
#[async_trait]
pub trait Reconcile: Send + Sync {
    /// What became of `case`'s effect.
    async fn check(&self, case: InDoubt) -> Finding;
}

#[async_trait]
impl<F, Fut> Reconcile for F
where
    F: Fn(InDoubt) -> Fut + Send + Sync,
    Fut: Future<Output = Finding> + Send,
{
    async fn check(&self, case: InDoubt) -> Finding {
        self(case).await
    }
}

/// The longest one [`Reconcile::check`] may take: past it the record is taken as still unknown
/// and the pass goes on (every wait has a deadline).
pub const CHECK_DEADLINE: Duration = Duration::from_secs(30);

/// The most records one pass checks ([`reconcile_now`]); the rest wait for the next pass.
pub const MAX_PER_PASS: usize = 1000;

/// What one reconciliation pass did ([`reconcile_now`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct Reconciled {
    /// Records checked with the reconciler.
    pub checked: usize,
    /// Settled with their real answer.
    pub settled: usize,
    /// Released.
    pub released: usize,
    /// Still unknown, due again later.
    pub deferred: usize,
    /// Decided by someone else first (nothing written).
    pub contested: usize,
    /// Not decided: the store failed, or the settled answer could not be stored.
    pub failed: usize,
}

impl Reconciled {
    fn count(&mut self, decided: Option<Decided>) {
        match decided {
            Some(Decided::Settled { .. }) => self.settled += 1,
            Some(Decided::Released) => self.released += 1,
            Some(_) => self.deferred += 1,
            None => self.contested += 1,
        }
    }
}

/// One reconciliation pass, now: every record in doubt that is due for a check (oldest
/// first, at most [`MAX_PER_PASS`]) is read, checked with `reconciler` and decided
/// ([`resolve`]) as `reconciler <this process>`. A record that cannot be read or
/// decided is counted as failed and the pass goes on; a listing that fails ends the pass with
/// its error. Run it from several processes at once if you like: each record is decided once.
/// Needs a Tokio runtime with its time driver (a check has a deadline).
///
/// ```
/// use idem_core::{Failure, Idempotency, MemoryStore, StoredResponse};
/// use idem_ops::reconcile::{Finding, InDoubt};
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let idem = Idempotency::new(MemoryStore::new());
/// let request = idem.request("acct_1", "POST", "/charges").key(Some("k1")).body(b"{}").build()?;
/// let _ = idem.run(&request, |_ctx| async {
///     Err::<StoredResponse, _>(Failure::unknown("the card network timed out"))
/// }).await;
/// let report = idem_ops::reconcile_now(&idem, &|case: InDoubt| async move {
///     Finding::settled(StoredResponse::new(201, r#"{"id":"ch_1"}"#)).asked(case.downstream_key())
/// }).await?;
/// assert_eq!((report.checked, report.settled), (1, 1));
/// # Ok(())
/// # }
/// ```
pub async fn reconcile_now<S, R>(idem: &Idempotency<S>, reconciler: &R) -> Result<Reconciled, Error>
where
    S: Operator,
    R: Reconcile + ?Sized,
{
    let by = format!("reconciler {}", Holder::this_process());
    let mut report = Reconciled::default();
    let mut query = ListQuery::due_for_reconciliation();
    loop {
        let page = idem
            .store_call(Operation::List, None, |deadline| {
                idem.store().list(&query, deadline)
            })
            .await?;
        for listed in page.records {
            if report.checked >= MAX_PER_PASS {
                return Ok(report);
            }
            let case = match in_doubt(idem, &listed.id).await {
                // Decided since it was listed (or listed twice by a scanning store).
                Ok(Some(case)) if case.check_at == listed.check_at => case,
                Ok(_) => continue,
                Err(error) => {
                    tracing::warn!(target: "idem", %error, "idem.reconcile: a record in doubt could not be read");
                    report.failed += 1;
                    continue;
                }
            };
            report.checked += 1;
            let finding = checked(reconciler, case.clone()).await;
            match resolve(idem, &case, finding, &by).await {
                Ok(decided) => report.count(decided),
                Err(error) => {
                    tracing::warn!(
                        target: "idem",
                        consumer = case.id.consumer(),
                        route = case.id.route(),
                        %error,
                        "idem.reconcile: a decision could not be stored"
                    );
                    report.failed += 1;
                }
            }
        }
        match page.next {
            Some(cursor) => query = ListQuery::due_for_reconciliation().after(cursor),
            None => return Ok(report),
        }
    }
}

/// Runs [`reconcile_now`] every `period` with `reconciler`, on a task of its own, until
/// stopped; a pass that checked something or failed is logged.
pub fn reconcile_every<S, R>(idem: &Idempotency<S>, period: Duration, reconciler: R) -> Periodic
where
    S: Operator + 'static,
    R: Reconcile + 'static,
{
    let idem = idem.clone();
    let reconciler = std::sync::Arc::new(reconciler);
    Periodic::spawn(period, move |_stopped| {
        let (idem, reconciler) = (idem.clone(), std::sync::Arc::clone(&reconciler));
        async move {
            match reconcile_now(&idem, &*reconciler).await {
                Ok(report) if report.checked > 0 || report.failed > 0 => {
                    tracing::info!(target: "idem", ?report, "idem.reconcile: pass done");
                }
                Ok(_) => {}
                Err(error) => tracing::warn!(target: "idem", %error, "idem.reconcile failed"),
            }
        }
    })
}

/// The reconciler's finding for `case`, within [`CHECK_DEADLINE`]; a panic or no answer is
/// still unknown.
async fn checked<R: Reconcile + ?Sized>(reconciler: &R, case: InDoubt) -> Finding {
    let check = CatchUnwind::new(reconciler.check(case));
    match tokio::time::timeout(CHECK_DEADLINE, check).await {
        Ok(Ok(finding)) => finding,
        Ok(Err(_panic)) => Finding::still_unknown().answered("the reconciler panicked"),
        Err(_) => Finding::still_unknown().answered(format!(
            "the reconciler gave no answer within {} s",
            CHECK_DEADLINE.as_secs()
        )),
    }
}
