//! The dispatcher: claims due deliveries with a lease, delivers them, records each attempt
//! under its claim.

use std::collections::{HashMap, HashSet};
use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use std::time::{Duration, Instant};

use tokio::sync::Notify;
use tokio::task::{JoinHandle, JoinSet};

use crate::address::AddressPolicy;
use crate::backend::{bounded, Backend, STORE_TIMEOUT};
use crate::claim::{Claimed, DeliveryState, Record, Taken, Undecodable};
use crate::event::{DeadReason, OutboxEvent, OutboxEventKind};
use crate::transport::{Sent, Transport};
use crate::{DeliveryInfo, Endpoint, OutboxError};

/// The longest a receiver's `Retry-After` may push an attempt back: one day.
pub const MAX_RETRY_AFTER: Duration = Duration::from_secs(24 * 3600);

/// How long a dispatcher keeps an endpoint's settings it read: a change (a new URL, secret,
/// schedule) takes effect within this.
pub const ENDPOINT_CACHE: Duration = Duration::from_secs(1);

/// How long an ended attempt waits for the others of its claim before it is recorded: those
/// ending meanwhile are recorded with it, in one statement.
pub const RECORD_LINGER: Duration = Duration::from_millis(5);

/// Endpoints read, with when.
type Endpoints = Arc<Mutex<HashMap<String, (Instant, Endpoint)>>>;

/// Dead ends written without an answer (the database's deadline ran out): each reported once
/// it is seen to have landed.
type Unconfirmed = Arc<Mutex<Vec<Unattempted>>>;

/// The most dead ends kept unconfirmed (the oldest are dropped, logged).
const MAX_UNCONFIRMED: usize = 1024;

/// Deliveries whose last claim here was given back for running short ([`too_short`]): the
/// next claim of one attempts with what it has, so a database always that slow never starves
/// it. Forgotten all at once past [`MAX_SHORT`] (at worst one more give-back each).
type GivenBack = Arc<Mutex<HashSet<i64>>>;

/// The most deliveries remembered in [`GivenBack`].
const MAX_SHORT: usize = 4096;

/// What is called with each [`OutboxEvent`].
pub type Observer = Arc<dyn Fn(&OutboxEvent) + Send + Sync>;

/// Delivers an outbox's messages: claims due deliveries for a lease (several dispatchers, in
/// any number of processes, share the work: a delivery is claimed by one at a time), sends
/// each signed (Standard Webhooks, signed afresh on every attempt, `webhook-id` the message's
/// stable id), and records each attempt under its claim, so a dispatcher whose claim ran out
/// cannot overwrite a newer one's result (C17).
///
/// - An ended attempt waits up to [`RECORD_LINGER`] for the others of its claim; those that end
///   meanwhile are recorded with it (one statement on PostgreSQL, one transaction on SQLite),
///   each under its own claim. An attempt's event is reported once it is recorded.
/// - Each attempt ends before the claim's last quarter (its timeout is the endpoint's, cut
///   shorter when the claim runs out sooner), so two dispatchers never deliver one message at
///   the same moment. A claim that sends nothing (less than half of what a fresh claim gives an
///   attempt left, the endpoint not readable now) gives its attempt back (the schedule counts attempts made) and the
///   delivery is due again after the [`poll_interval`](Self::poll_interval).
/// - A 2xx delivers; anything else (3xx included: redirects are never followed), a transport
///   error or a timeout fails, and the delivery is tried again on the endpoint's [`Schedule`](
///   crate::Schedule), later if the receiver's `Retry-After` says so. `410 Gone` and
///   `webhook-delivery: abort-message` stop it; a delivery whose schedule runs out is dead,
///   kept and reported ([`OutboxEventKind::Dead`]). An endpoint failing for
///   [`disable_after`](Self::disable_after) (default 5 days) is disabled.
/// - Loopback, private and link-local addresses are refused unless allowed (no proxy is used,
///   `HTTP_PROXY` included); TLS certificates are verified; the first KiB of a response body is stored, and at most 64 KiB of it read
///   (so a short body's connection is reused).
/// - Woken by each enqueue (in process for SQLite, `LISTEN`/`NOTIFY` for PostgreSQL), it
///   polls besides, every [`poll_interval`](Self::poll_interval).
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// # let dir = tempfile::tempdir()?;
/// # let store = idem_sqlite::SqliteStore::open(dir.path().join("a.db")).await?;
/// # let outbox = idem_outbox::SqliteOutbox::open(&store).await?;
/// use std::time::Duration;
/// let dispatching = outbox
///     .dispatcher()
///     .lease(Duration::from_secs(60))?
///     .on_event(|event| println!("{event:?}"))
///     .start()?;
/// // ... serve ...
/// dispatching.stop().await;
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct Dispatcher {
    backend: Backend,
    lease: Duration,
    batch: usize,
    poll: Duration,
    policy: AddressPolicy,
    disable_after: Duration,
    store_timeout: Duration,
    observer: Option<Observer>,
    transport: Arc<OnceLock<Transport>>,
    endpoints: Endpoints,
    unconfirmed: Unconfirmed,
    given_back: GivenBack,
}

impl fmt::Debug for Dispatcher {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Dispatcher")
            .field("backend", &self.backend)
            .field("lease", &self.lease)
            .field("batch", &self.batch)
            .field("poll", &self.poll)
            .field("policy", &self.policy)
            .field("disable_after", &self.disable_after)
            .field("store_timeout", &self.store_timeout)
            .finish()
    }
}

impl Dispatcher {
    pub(crate) fn new(backend: Backend) -> Self {
        Self {
            backend,
            lease: Duration::from_secs(60),
            batch: 16,
            poll: Duration::from_secs(1),
            policy: AddressPolicy::default(),
            disable_after: Duration::from_secs(5 * 24 * 3600),
            store_timeout: STORE_TIMEOUT,
            observer: None,
            transport: Arc::new(OnceLock::new()),
            endpoints: Arc::default(),
            unconfirmed: Arc::default(),
            given_back: Arc::default(),
        }
    }

    /// How long a claim lasts (default 60 s, at least 100 ms): a delivery whose dispatcher
    /// died is attempted again once it runs out. Attempts end within its first three
    /// quarters.
    pub fn lease(mut self, lease: Duration) -> Result<Self, OutboxError> {
        if lease < Duration::from_millis(100) {
            return Err(OutboxError::InvalidSetting(
                "a claim's lease is at least 100 ms",
            ));
        }
        self.lease = lease;
        Ok(self)
    }

    /// How many deliveries one claim takes, delivered concurrently (default 16, at least 1).
    #[must_use]
    pub fn batch(mut self, batch: usize) -> Self {
        self.batch = batch.max(1);
        self
    }

    /// How often it looks for due deliveries when nothing wakes it (default 1 s; retries come
    /// due this way).
    #[must_use]
    pub fn poll_interval(mut self, every: Duration) -> Self {
        self.poll = every.max(Duration::from_millis(1));
        self
    }

    /// Allows loopback addresses (tests, a receiver on the same host).
    #[must_use]
    pub fn allow_loopback(mut self, allow: bool) -> Self {
        self.policy.allow_loopback = allow;
        self.transport = Arc::new(OnceLock::new());
        self
    }

    /// Allows private and link-local addresses (receivers inside one network).
    #[must_use]
    pub fn allow_private(mut self, allow: bool) -> Self {
        self.policy.allow_private = allow;
        self.transport = Arc::new(OnceLock::new());
        self
    }

    /// How long an endpoint may fail every attempt before it is disabled (default 5 days).
    #[must_use]
    pub fn disable_after(mut self, after: Duration) -> Self {
        self.disable_after = after;
        self
    }

    /// The deadline of each of its database calls (default 10 s): a database that does not
    /// answer is an error (logged, the claim or the record tried again later), never a hang.
    #[must_use]
    pub fn store_timeout(mut self, deadline: Duration) -> Self {
        self.store_timeout = deadline.max(Duration::from_millis(1));
        self
    }

    /// Calls `observer` with each attempt's [`OutboxEvent`] (a dead delivery's included).
    #[must_use]
    pub fn on_event(mut self, observer: impl Fn(&OutboxEvent) + Send + Sync + 'static) -> Self {
        self.observer = Some(Arc::new(observer));
        self
    }

    fn transport(&self) -> Result<Transport, OutboxError> {
        if let Some(transport) = self.transport.get() {
            return Ok(transport.clone());
        }
        let transport =
            Transport::new(self.policy).map_err(|e| OutboxError::InvalidSetting(leak_free(&e)))?;
        Ok(self.transport.get_or_init(|| transport).clone())
    }

    /// Claims due deliveries once and delivers them: how many due deliveries it took (those
    /// it attempted or ended dead unattempted, and on PostgreSQL those of a disabled endpoint
    /// it set aside for a lease), not counting the claims it gave back unattempted (due again
    /// after a [`poll_interval`](Self::poll_interval)). What [`start`](Self::start) runs in a
    /// loop (a pass that took none waits the poll interval); for tests and tools.
    pub async fn dispatch_due(&self) -> Result<usize, OutboxError> {
        let transport = self.transport()?;
        self.confirm().await;
        let token = claim_token();
        let claimed_at = Instant::now();
        let taken = bounded(
            self.store_timeout,
            self.backend.claim(&token, self.lease, self.batch),
        )
        .await?;
        let count = taken.claimed.len() + taken.undecodable.len() + taken.set_aside;
        // Ends every attempt in the claim's first three quarters: the claim was taken after
        // `claimed_at`, so it outlives this deadline by a quarter of the lease at least.
        let deadline = claimed_at + self.lease.mul_f64(0.75);
        let (ready, unattempted) = self.sort_out(taken).await;
        let mut attempts = JoinSet::new();
        for (claim, endpoint) in ready {
            let this = self.clone();
            let transport = transport.clone();
            let token = token.clone();
            attempts.spawn(async move {
                this.attempt(&transport, endpoint, claim, &token, deadline)
                    .await
            });
        }
        let mut released = count_released(&unattempted);
        self.abandon(&token, unattempted).await;
        // One statement records the attempts that end within `RECORD_LINGER` of the first
        // unrecorded one (all of them when they end together), while the others go on.
        let (mut ended, mut unmade) = (Vec::new(), Vec::new());
        while let Some(first) = attempts.join_next().await {
            sort_ended(first, &mut ended, &mut unmade);
            let linger = tokio::time::sleep(RECORD_LINGER);
            tokio::pin!(linger);
            loop {
                tokio::select! {
                    next = attempts.join_next() => match next {
                        Some(next) => sort_ended(next, &mut ended, &mut unmade),
                        None => break,
                    },
                    () = &mut linger => break,
                }
            }
            self.record(std::mem::take(&mut ended)).await;
            released += count_released(&unmade);
            self.abandon(&token, std::mem::take(&mut unmade)).await;
        }
        Ok(count.saturating_sub(released))
    }

    /// The claimed deliveries that can be attempted, with their endpoints, and those that
    /// cannot: dead for an undecodable row, an endpoint gone or undecodable (C12); released
    /// for an endpoint the database cannot read now.
    async fn sort_out(&self, taken: Taken) -> (Vec<(Claimed, Endpoint)>, Vec<Unattempted>) {
        let mut unattempted: Vec<Unattempted> = taken
            .undecodable
            .into_iter()
            .map(Unattempted::undecodable)
            .collect();
        let mut endpoints: HashMap<String, Found> = HashMap::new();
        let mut ready = Vec::with_capacity(taken.claimed.len());
        for claim in taken.claimed {
            if !endpoints.contains_key(&claim.endpoint) {
                let found = self.endpoint(&claim.endpoint).await;
                endpoints.insert(claim.endpoint.clone(), found);
            }
            match endpoints
                .get(&claim.endpoint)
                .cloned()
                .unwrap_or(Found::Missing)
            {
                Found::Endpoint(endpoint) => ready.push((claim, endpoint)),
                Found::Missing => {
                    let error = format!("the endpoint {:?} is not registered", claim.endpoint);
                    unattempted.push(Unattempted::new(claim, DeadReason::NoEndpoint, error));
                }
                Found::Corrupt(error) => {
                    unattempted.push(Unattempted::new(claim, DeadReason::Undecodable, error));
                }
                // Not readable now: released, the delivery is tried again.
                Found::Unavailable(error) => {
                    tracing::warn!(message_id = %claim.message_id, endpoint = %claim.endpoint, %error, "outbox endpoint unreadable; attempt not made");
                    unattempted.push(Unattempted::released(claim.id));
                }
            }
        }
        (ready, unattempted)
    }

    /// Ends the claims of `token` in `unattempted`, each giving the attempt it counted back
    /// (the schedule counts attempts made; a released one is due again after the poll
    /// interval, so a claim given back is not claimed again at once), then reports the dead ones (fenced when the claim
    /// had run out). Not ended (the database failed): the claim runs out, the attempt stays
    /// counted, and the next claim ends a dead one; or the statement landed though its answer
    /// was lost, and [`confirm`](Self::confirm) reports the dead ones.
    async fn abandon(&self, token: &str, unattempted: Vec<Unattempted>) {
        if unattempted.is_empty() {
            return;
        }
        let ends: Vec<(i64, Option<String>)> = unattempted
            .iter()
            .map(|u| (u.delivery, u.dead.as_ref().map(|(error, _)| error.clone())))
            .collect();
        let ended = match bounded(
            self.store_timeout,
            self.backend.abandon(token, &ends, self.poll),
        )
        .await
        {
            Ok(ended) => ended,
            Err(error) => {
                tracing::warn!(%error, deliveries = ends.len(), "outbox claims without an attempt not ended");
                self.unconfirmed(unattempted);
                return;
            }
        };
        for (unattempted, ended) in unattempted.into_iter().zip(ended) {
            let Some((error, mut event)) = unattempted.dead else {
                continue;
            };
            if !ended {
                event.kind = OutboxEventKind::Fenced;
            }
            self.report_unattempted(&event, &error);
        }
    }

    /// Keeps the dead ends of `unattempted`, whose statement's answer was lost, for
    /// [`confirm`](Self::confirm).
    fn unconfirmed(&self, unattempted: Vec<Unattempted>) {
        let mut kept = self
            .unconfirmed
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        kept.extend(unattempted.into_iter().filter(|u| u.dead.is_some()));
        let over = kept.len().saturating_sub(MAX_UNCONFIRMED);
        if over > 0 {
            tracing::warn!(
                dropped = over,
                "outbox dead ends never confirmed; not reported"
            );
            kept.drain(..over);
        }
    }

    /// Reports each kept dead end ([`unconfirmed`](Self::unconfirmed)) seen to have landed,
    /// once; keeps those still undecided (the delivery pending at the claim's attempt, or not
    /// readable now), and drops those that never will (claimed again, ended otherwise). All
    /// of them are read in one statement, within one store timeout: a silent database costs
    /// a pass one wait, however many ends are kept.
    async fn confirm(&self) {
        let kept = std::mem::take(
            &mut *self
                .unconfirmed
                .lock()
                .unwrap_or_else(PoisonError::into_inner),
        );
        if kept.is_empty() {
            return;
        }
        let ids: Vec<i64> = kept.iter().map(|u| u.delivery).collect();
        let read = bounded(self.store_timeout, self.backend.deliveries_by_id(&ids));
        let found: HashMap<i64, Option<DeliveryInfo>> = match read.await {
            Ok(found) => found.into_iter().collect(),
            Err(_) => return self.unconfirmed(kept),
        };
        let mut undecided = Vec::new();
        for unattempted in kept {
            let Some((error, event)) = &unattempted.dead else {
                continue;
            };
            match landed_dead(found.get(&unattempted.delivery), error, event.attempt) {
                Some(true) => self.report_unattempted(event, error),
                Some(false) => {}
                None => undecided.push(unattempted),
            }
        }
        self.unconfirmed(undecided);
    }

    /// Reports the end of a claim that made no attempt: logged, counted (feature `metrics`,
    /// no duration) and observed, as a recorded attempt's.
    fn report_unattempted(&self, event: &OutboxEvent, error: &str) {
        report(event, Some(error));
        #[cfg(feature = "metrics")]
        crate::metrics::unattempted(event);
        if let Some(observer) = &self.observer {
            observer(event);
        }
    }

    /// Records `ended` under their claims, then reports each.
    async fn record(&self, ended: Vec<Attempted>) {
        if ended.is_empty() {
            return;
        }
        let (records, events): (Vec<Record>, Vec<OutboxEvent>) =
            ended.into_iter().map(|a| (a.record, a.event)).unzip();
        let (recorded, lost): (Vec<Option<bool>>, _) =
            match bounded(self.store_timeout, self.backend.record(&records)).await {
                Ok(recorded) => (recorded.into_iter().map(Some).collect(), None),
                // Only the statement's answer may be lost: the attempts found recorded are
                // reported as such (a dead delivery among them included).
                Err(error) => {
                    let landed = bounded(self.store_timeout, self.landed(&records, &events));
                    let landed = landed.await.unwrap_or_else(|_| vec![None; events.len()]);
                    (landed, Some(error))
                }
            };
        for ((mut event, record), recorded) in events.into_iter().zip(&records).zip(recorded) {
            let Some(recorded) = recorded else {
                // Unrecorded: the claim runs out and the delivery is attempted again (at least
                // once), with the same id.
                if let Some(error) = &lost {
                    tracing::warn!(message_id = %event.message_id, %error, "outbox attempt not recorded");
                }
                continue;
            };
            if !recorded {
                event.kind = OutboxEventKind::Fenced;
            }
            report(&event, record.error.as_deref());
            #[cfg(feature = "metrics")]
            crate::metrics::attempt(&event, record.duration);
            if let Some(observer) = &self.observer {
                observer(&event);
            }
        }
    }

    /// After a record whose answer was lost, which of its attempts the database holds:
    /// `Some(true)` for those it recorded as ended (delivered, dead), `None` for the others
    /// ([`Backend::landed`]: an attempt's number alone may be an earlier attempt's, from
    /// before an operator's retry).
    async fn landed(
        &self,
        records: &[Record],
        events: &[OutboxEvent],
    ) -> Result<Vec<Option<bool>>, OutboxError> {
        let mut landed = Vec::with_capacity(records.len());
        for (record, event) in records.iter().zip(events) {
            let found = self
                .backend
                .landed(record, &event.message_id, event.attempt)
                .await?;
            landed.push(found.then_some(true));
        }
        Ok(landed)
    }

    /// The endpoint `name`, read at most [`ENDPOINT_CACHE`] ago.
    async fn endpoint(&self, name: &str) -> Found {
        let cached = {
            let cache = self
                .endpoints
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            cache
                .get(name)
                .filter(|(read, _)| read.elapsed() < ENDPOINT_CACHE)
                .map(|(_, endpoint)| endpoint.clone())
        };
        if let Some(endpoint) = cached {
            return Found::Endpoint(endpoint);
        }
        match bounded(self.store_timeout, self.backend.endpoint(name)).await {
            Ok(Some(endpoint)) => {
                self.endpoints
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .insert(name.to_owned(), (Instant::now(), endpoint.clone()));
                Found::Endpoint(endpoint)
            }
            Ok(None) => Found::Missing,
            Err(error @ OutboxError::Corrupt(_)) => Found::Corrupt(error.to_string()),
            Err(error) => Found::Unavailable(error.to_string()),
        }
    }

    /// One attempt of `claim`, to be recorded under `token`; `Err` when it was not made (too
    /// little of the claim left: [`too_short`]), to be released.
    async fn attempt(
        &self,
        transport: &Transport,
        endpoint: Endpoint,
        claim: Claimed,
        token: &str,
        deadline: Instant,
    ) -> Result<Attempted, Unattempted> {
        let remaining = deadline.saturating_duration_since(Instant::now());
        let short = too_short(remaining, endpoint.timeout, self.lease);
        if remaining < MIN_ATTEMPT || self.gives_back(claim.id, short) {
            tracing::warn!(message_id = %claim.message_id, endpoint = %claim.endpoint, ?remaining, "outbox claim ran short; attempt not made");
            return Err(Unattempted::released(claim.id));
        }
        let timeout = endpoint.timeout.min(remaining);
        let sent = transport.send(&endpoint, &claim, timeout).await;
        let (state, delay, kind) = verdict(&sent, claim.attempt, &endpoint);
        Ok(Attempted {
            record: Record {
                delivery: claim.id,
                token: token.to_owned(),
                state,
                delay,
                status: sent.status,
                error: sent.error,
                response: sent.response,
                duration: sent.duration,
                ended: Instant::now(),
                endpoint: endpoint.name,
                disable_after: self.disable_after,
            },
            event: OutboxEvent {
                message_id: claim.message_id,
                endpoint: claim.endpoint,
                attempt: claim.attempt,
                status: sent.status,
                kind,
            },
        })
    }

    /// Starts dispatching on the current tokio runtime until [`Dispatching::stop`] (or the
    /// handle is dropped).
    pub fn start(self) -> Result<Dispatching, OutboxError> {
        self.transport()?;
        let (wake, listener) = self.backend.waker();
        let stop = Arc::new(Notify::new());
        let stopping = Arc::new(AtomicBool::new(false));
        let task = tokio::spawn(self.run(wake, Arc::clone(&stop), Arc::clone(&stopping)));
        Ok(Dispatching {
            stop,
            stopping,
            task: Some(task),
            listener,
        })
    }

    async fn run(self, wake: Arc<Notify>, stop: Arc<Notify>, stopping: Arc<AtomicBool>) {
        #[cfg(feature = "metrics")]
        let mut gauged = Instant::now() - self.poll;
        loop {
            #[cfg(feature = "metrics")]
            if gauged.elapsed() >= self.poll {
                gauged = Instant::now();
                match bounded(self.store_timeout, self.backend.oldest_pending_age()).await {
                    Ok(age) => crate::metrics::oldest_pending(age),
                    Err(error) => tracing::warn!(%error, "outbox oldest pending age not read"),
                }
            }
            let notified = wake.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            let pause = match self.dispatch_due().await {
                Ok(0) => self.poll,
                Ok(_) => Duration::ZERO,
                Err(error) => {
                    tracing::warn!(%error, "outbox claim failed");
                    self.poll
                }
            };
            if stopping.load(Ordering::Acquire) {
                return;
            }
            if pause.is_zero() {
                tokio::task::yield_now().await;
                continue;
            }
            tokio::select! {
                () = &mut notified => {}
                () = tokio::time::sleep(pause) => {}
                () = stop.notified() => return,
            }
        }
    }
}

/// An attempt made: what it records, and the event it reports once recorded.
struct Attempted {
    record: Record,
    event: OutboxEvent,
}

/// An endpoint as a dispatcher read it.
#[derive(Debug, Clone)]
enum Found {
    Endpoint(Endpoint),
    /// Not registered (its row deleted by hand).
    Missing,
    /// Its row is not what the outbox writes.
    Corrupt(String),
    /// Not readable now (the database failed).
    Unavailable(String),
}

/// A claim that made no attempt: dead (why, and the event it reports), or released.
struct Unattempted {
    delivery: i64,
    dead: Option<(String, OutboxEvent)>,
}

impl Unattempted {
    /// Released: due again after the poll interval, its attempt given back.
    fn released(delivery: i64) -> Self {
        Self {
            delivery,
            dead: None,
        }
    }

    fn new(claim: Claimed, reason: DeadReason, error: String) -> Self {
        let event = OutboxEvent {
            message_id: claim.message_id,
            endpoint: claim.endpoint,
            attempt: claim.attempt,
            status: None,
            kind: OutboxEventKind::Dead(reason),
        };
        Self {
            delivery: claim.id,
            dead: Some((error, event)),
        }
    }

    fn undecodable(row: Undecodable) -> Self {
        let event = OutboxEvent {
            message_id: row.message_id,
            endpoint: row.endpoint,
            attempt: row.attempt,
            status: None,
            kind: OutboxEventKind::Dead(DeadReason::Undecodable),
        };
        Self {
            delivery: row.id,
            dead: Some((row.error, event)),
        }
    }
}

/// Whether `remaining` of a claim is too short for an attempt to an endpoint of `timeout`
/// under claims of `lease`: less than half of what a fresh claim gives one (the endpoint's
/// timeout, or the claim's first three quarters when they are shorter), or than 5 ms.
///
/// An attempt cut that short (a slow database held the claim up) fails against a receiver that
/// answers in time, and uses up an attempt of the schedule for the database's slowness (a
/// one-attempt schedule ends dead though the receiver got the message); given back, it costs a
/// poll interval. Half, not all of it: every claim loses a little to its own statement, so
/// asking for all would give back every claim whose lease, not the endpoint, bounds it; half is
/// far beyond an ordinary claim's latency, and an attempt still ends inside its claim.
fn too_short(remaining: Duration, timeout: Duration, lease: Duration) -> bool {
    let full = timeout.min(lease.mul_f64(0.75));
    remaining < (full / 2).max(MIN_ATTEMPT)
}

/// Less of a claim than this left, no attempt is made at all.
const MIN_ATTEMPT: Duration = Duration::from_millis(5);

impl Dispatcher {
    /// Whether a claim of `delivery` left `short` is given back: not twice in a row here.
    fn gives_back(&self, delivery: i64, short: bool) -> bool {
        let mut given = self
            .given_back
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if !short {
            given.remove(&delivery);
            return false;
        }
        if given.remove(&delivery) {
            return false;
        }
        if given.len() >= MAX_SHORT {
            given.clear();
        }
        given.insert(delivery)
    }
}

/// How many of `unattempted` are released (given back, not ended).
fn count_released(unattempted: &[Unattempted]) -> usize {
    unattempted.iter().filter(|u| u.dead.is_none()).count()
}

/// An attempt task's end, sorted: made (to record) or not (to release). A task that panicked
/// leaves its claim to run out.
fn sort_ended(
    joined: Result<Result<Attempted, Unattempted>, tokio::task::JoinError>,
    ended: &mut Vec<Attempted>,
    unmade: &mut Vec<Unattempted>,
) {
    match joined {
        Ok(Ok(attempted)) => ended.push(attempted),
        Ok(Err(unattempted)) => unmade.push(unattempted),
        Err(_) => {}
    }
}

/// A running dispatcher. Dropping it stops it at once; [`stop`](Self::stop) lets the running
/// attempts end and be recorded first.
#[derive(Debug)]
pub struct Dispatching {
    stop: Arc<Notify>,
    stopping: Arc<AtomicBool>,
    task: Option<JoinHandle<()>>,
    listener: Option<JoinHandle<()>>,
}

impl Dispatching {
    /// Stops once the running attempts are recorded (their timeouts bound the wait).
    pub async fn stop(mut self) {
        self.stopping.store(true, Ordering::Release);
        self.stop.notify_one();
        if let Some(task) = self.task.take() {
            let _ = task.await;
        }
    }
}

impl Drop for Dispatching {
    fn drop(&mut self) {
        if let Some(task) = self.task.take() {
            task.abort();
        }
        if let Some(listener) = self.listener.take() {
            listener.abort();
        }
    }
}

/// What an attempt's result makes of the delivery: its state, the delay until it is due
/// again, the event.
fn verdict(
    sent: &Sent,
    attempt: u32,
    endpoint: &Endpoint,
) -> (DeliveryState, Duration, OutboxEventKind) {
    let dead = |reason| {
        (
            DeliveryState::Dead,
            Duration::ZERO,
            OutboxEventKind::Dead(reason),
        )
    };
    match sent.status {
        Some(status) if (200..300).contains(&status) => {
            return (
                DeliveryState::Delivered,
                Duration::ZERO,
                OutboxEventKind::Delivered,
            )
        }
        Some(410) => return dead(DeadReason::Gone),
        _ if sent.abort => return dead(DeadReason::Aborted),
        _ => {}
    }
    match endpoint.schedule.delay_after(attempt) {
        Some(delay) => {
            let delay = sent
                .retry_after
                .map_or(delay, |asked| delay.max(asked.min(MAX_RETRY_AFTER)));
            (
                DeliveryState::Pending,
                delay,
                OutboxEventKind::Retrying(delay),
            )
        }
        None => dead(DeadReason::Exhausted),
    }
}

fn report(event: &OutboxEvent, error: Option<&str>) {
    let (id, endpoint, attempt, status) = (
        event.message_id.as_str(),
        event.endpoint.as_str(),
        event.attempt,
        event.status,
    );
    match &event.kind {
        OutboxEventKind::Delivered => {
            tracing::debug!(
                message_id = id,
                endpoint,
                attempt,
                ?status,
                "outbox message delivered"
            );
        }
        OutboxEventKind::Retrying(delay) => {
            tracing::info!(
                message_id = id,
                endpoint,
                attempt,
                ?status,
                ?error,
                ?delay,
                "outbox attempt failed; retrying"
            );
        }
        OutboxEventKind::Dead(reason) => {
            tracing::error!(
                message_id = id,
                endpoint,
                attempt,
                ?status,
                ?error,
                ?reason,
                "outbox delivery dead"
            );
        }
        OutboxEventKind::Fenced => {
            tracing::warn!(
                message_id = id,
                endpoint,
                attempt,
                "outbox attempt fenced out: its claim had run out"
            );
        }
    }
}

/// A fresh claim token.
fn claim_token() -> String {
    crate::id::random_bytes::<16>()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// A static description of a client that could not be built (its cause is logged).
fn leak_free(error: &str) -> &'static str {
    tracing::error!(%error, "outbox HTTP client could not be built");
    "the HTTP client could not be built (TLS backend)"
}

/// Whether a dead end written with `error`, by a claim whose attempt was numbered `attempt`,
/// landed, given its delivery as read (`found`: absent, undecodable, or read): `Some(true)`
/// when the delivery is dead as that end writes it (its error, the attempt given back),
/// `None` while it is still pending at that attempt (the statement may land yet),
/// `Some(false)` otherwise (gone, undecodable, or another claim took it: that one reports its
/// end).
fn landed_dead(found: Option<&Option<DeliveryInfo>>, error: &str, attempt: u32) -> Option<bool> {
    let Some(Some(delivery)) = found else {
        return Some(false);
    };
    let ended = delivery.state == DeliveryState::Dead
        && delivery.attempts == attempt.saturating_sub(1)
        && delivery.last_error.as_deref() == Some(error);
    let pending = delivery.state == DeliveryState::Pending && delivery.attempts == attempt;
    match (ended, pending) {
        (true, _) => Some(true),
        (false, true) => None,
        (false, false) => Some(false),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sent(status: Option<u16>, retry_after: Option<u64>, abort: bool) -> Sent {
        Sent {
            status,
            error: None,
            response: Vec::new(),
            retry_after: retry_after.map(Duration::from_secs),
            abort,
            duration: Duration::ZERO,
        }
    }

    #[test]
    fn c17_a_claim_left_less_than_half_an_attempt_gives_it_back() {
        let ms = Duration::from_millis;
        let (timeout, lease) = (ms(2000), ms(1000));
        // A fresh claim gives 750 ms (the lease bounds it): half of it is enough.
        assert!(!too_short(ms(740), timeout, lease));
        assert!(!too_short(ms(375), timeout, lease));
        assert!(too_short(ms(90), timeout, lease));
        // The endpoint's timeout bounds it; 5 ms at least.
        assert!(!too_short(ms(60), ms(100), ms(60_000)));
        assert!(too_short(ms(40), ms(100), ms(60_000)));
        assert!(too_short(ms(4), ms(1), ms(60_000)));
    }

    #[test]
    fn c17_any_non_2xx_fails_410_and_abort_stop_exhausted_is_dead() -> Result<(), OutboxError> {
        let schedule = crate::Schedule::new([Duration::from_secs(5)])?.jitter(0.0)?;
        let endpoint = Endpoint::new(
            "m",
            "https://m.example/",
            ["whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"],
        )?
        .schedule(schedule);
        let five = Duration::from_secs(5);
        assert_eq!(
            verdict(&sent(Some(204), None, false), 1, &endpoint).0,
            DeliveryState::Delivered
        );
        for status in [301, 302, 400, 429, 500, 503] {
            assert_eq!(
                verdict(&sent(Some(status), None, false), 1, &endpoint),
                (
                    DeliveryState::Pending,
                    five,
                    OutboxEventKind::Retrying(five)
                )
            );
        }
        assert_eq!(
            verdict(&sent(None, None, false), 1, &endpoint).0,
            DeliveryState::Pending
        );
        assert_eq!(
            verdict(&sent(Some(410), None, false), 1, &endpoint).2,
            OutboxEventKind::Dead(DeadReason::Gone)
        );
        assert_eq!(
            verdict(&sent(Some(500), None, true), 1, &endpoint).2,
            OutboxEventKind::Dead(DeadReason::Aborted)
        );
        assert_eq!(
            verdict(&sent(Some(500), None, false), 2, &endpoint).2,
            OutboxEventKind::Dead(DeadReason::Exhausted)
        );
        // Retry-After stretches a delay, never shortens it, and is capped.
        assert_eq!(
            verdict(&sent(Some(503), Some(60), false), 1, &endpoint).1,
            Duration::from_secs(60)
        );
        assert_eq!(
            verdict(&sent(Some(503), Some(1), false), 1, &endpoint).1,
            five
        );
        assert_eq!(
            verdict(&sent(Some(503), Some(10_000_000), false), 1, &endpoint).1,
            MAX_RETRY_AFTER
        );
        Ok(())
    }
}
