//! How a waiting duplicate (C5) learns its original ended: it parks on its record's [`Notify`].

use std::collections::HashMap;
use std::fmt;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError, Weak};
use tokio::sync::futures::OwnedNotified;
use tokio::sync::Notify;

/// The waiters of one store in this process, by [`RecordId::digest`](crate::RecordId::digest).
#[derive(Debug, Default)]
pub(crate) struct Wakeups {
    /// How many subscriptions are open: a wake-up with none costs one atomic read.
    waiting: AtomicUsize,
    records: Mutex<HashMap<[u8; 32], Entry>>,
}

/// A record's wake-up and how many subscriptions it has.
type Entry = (Arc<Notify>, usize);

impl Wakeups {
    /// Registers interest in the record `digest` until the subscription is dropped.
    pub(crate) fn subscribe(self: &Arc<Self>, digest: [u8; 32]) -> Subscription {
        let notify = {
            let mut records = self.records.lock().unwrap_or_else(PoisonError::into_inner);
            let entry = records.entry(digest).or_default();
            entry.1 += 1;
            Arc::clone(&entry.0)
        };
        self.waiting.fetch_add(1, Ordering::AcqRel);
        Subscription {
            wakeups: Arc::clone(self),
            digest,
            armed: None,
            notify,
        }
    }

    pub(crate) fn wake(&self, digest: &[u8; 32]) {
        if self.waiting.load(Ordering::Acquire) == 0 {
            return;
        }
        let records = self.records.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some((notify, _)) = records.get(digest) {
            notify.notify_waiters();
        }
    }

    /// Wakes every waiter (a change feed that may have missed announcements).
    pub(crate) fn wake_all(&self) {
        if self.waiting.load(Ordering::Acquire) == 0 {
            return;
        }
        let records = self.records.lock().unwrap_or_else(PoisonError::into_inner);
        for (notify, _) in records.values() {
            notify.notify_waiters();
        }
    }

    pub(crate) fn waiting(&self) -> usize {
        self.waiting.load(Ordering::Acquire)
    }
}

pub(crate) struct Subscription {
    wakeups: Arc<Wakeups>,
    digest: [u8; 32],
    notify: Arc<Notify>,
    armed: Option<Pin<Box<OwnedNotified>>>,
}

impl Subscription {
    /// Keeps any wake-up from now for the next [`woken`](Self::woken). Arm, read, then wait:
    /// no change in between is missed.
    pub(crate) fn arm(&mut self) {
        let mut notified = Box::pin(Arc::clone(&self.notify).notified_owned());
        notified.as_mut().enable();
        self.armed = Some(notified);
    }

    /// Resolves at the first wake-up since [`arm`](Self::arm) (never, if not armed).
    pub(crate) async fn woken(&mut self) {
        match self.armed.as_mut() {
            Some(notified) => notified.as_mut().await,
            None => std::future::pending().await,
        }
        self.armed = None;
    }
}

impl Drop for Subscription {
    fn drop(&mut self) {
        self.armed = None;
        let mut records = self
            .wakeups
            .records
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        // Under the lock: the last subscription removes the entry.
        if let Some(entry) = records.get_mut(&self.digest) {
            entry.1 -= 1;
            if entry.1 == 0 {
                records.remove(&self.digest);
            }
        }
        drop(records);
        self.wakeups.waiting.fetch_sub(1, Ordering::AcqRel);
    }
}

impl fmt::Debug for Subscription {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Subscription")
            .field("armed", &self.armed.is_some())
            .finish()
    }
}

/// Where a [change feed](crate::Store::watch) delivers announcements; does not keep engines alive.
///
/// ```
/// use idem_core::store::Changes;
/// fn deliver(changes: &Changes, payload: &str) {
///     match idem_core::store::digest_from_hex(payload) {
///         Some(digest) => changes.changed(&digest),
///         None => changes.missed(), // damaged: wake everyone rather than miss one
///     }
/// }
/// let closed = Changes::closed();
/// deliver(&closed, "00");
/// assert!(closed.is_closed());
/// ```
#[derive(Clone)]
pub struct Changes(Weak<Wakeups>);

impl Changes {
    pub(crate) fn of(wakeups: &Arc<Wakeups>) -> Self {
        Changes(Arc::downgrade(wakeups))
    }

    /// A handle whose engines are gone (calls do nothing), for tests and examples.
    pub fn closed() -> Self {
        Changes(Weak::new())
    }

    /// The record with this [`digest`](crate::RecordId::digest) changed: its waiters reread it.
    pub fn changed(&self, digest: &[u8; 32]) {
        if let Some(wakeups) = self.0.upgrade() {
            wakeups.wake(digest);
        }
    }

    /// The feed may have missed announcements: every waiter reads its record again.
    pub fn missed(&self) {
        if let Some(wakeups) = self.0.upgrade() {
            wakeups.wake_all();
        }
    }

    /// Whether every engine of the store is gone: the feed may stop.
    pub fn is_closed(&self) -> bool {
        self.0.strong_count() == 0
    }
}

impl fmt::Debug for Changes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Changes")
            .field("closed", &self.is_closed())
            .finish()
    }
}

/// The form of a record's digest in an announcement: 64 lower-case hexadecimal digits.
///
/// ```
/// use idem_core::store::{digest_from_hex, digest_to_hex};
/// let digest = [7u8; 32];
/// assert_eq!(digest_from_hex(&digest_to_hex(&digest)), Some(digest));
/// assert_eq!(digest_from_hex("not hex"), None);
/// ```
pub fn digest_to_hex(digest: &[u8; 32]) -> String {
    crate::hex::lower(digest)
}

/// Reads [`digest_to_hex`]'s form back; `None` for anything else.
pub fn digest_from_hex(text: &str) -> Option<[u8; 32]> {
    let bytes = text.as_bytes();
    if bytes.len() != 64 {
        return None;
    }
    let nibble = |c: u8| {
        char::from(c)
            .to_digit(16)
            .and_then(|d| u8::try_from(d).ok())
    };
    let mut digest = [0u8; 32];
    for (i, pair) in bytes.chunks_exact(2).enumerate() {
        digest[i] = (nibble(pair[0])? << 4) | nibble(pair[1])?;
    }
    Some(digest)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test]
    async fn c05_a_wake_between_the_read_and_the_wait_is_not_missed() {
        let wakeups = Arc::new(Wakeups::default());
        let mut subscription = wakeups.subscribe([1; 32]);
        subscription.arm();
        // The original ends after the waiter armed and before it awaits.
        Changes::of(&wakeups).changed(&[1; 32]);
        tokio::time::timeout(Duration::from_secs(1), subscription.woken())
            .await
            .expect("the wake-up before the await is kept");
    }

    #[tokio::test]
    async fn c05_a_wake_of_another_record_wakes_nobody() {
        let wakeups = Arc::new(Wakeups::default());
        let mut subscription = wakeups.subscribe([1; 32]);
        subscription.arm();
        wakeups.wake(&[2; 32]);
        let woken = tokio::time::timeout(Duration::from_millis(50), subscription.woken()).await;
        assert!(woken.is_err(), "woken by another record's change");
        wakeups.wake_all();
        subscription.arm();
        wakeups.wake_all();
        tokio::time::timeout(Duration::from_secs(1), subscription.woken())
            .await
            .expect("a missed feed wakes everyone");
    }

    #[test]
    fn c05_waiters_that_leave_together_leave_no_entry_behind() {
        let wakeups = Arc::new(Wakeups::default());
        for round in 0..2000u32 {
            let mut digest = [0u8; 32];
            digest[..4].copy_from_slice(&round.to_le_bytes());
            let pair = [wakeups.subscribe(digest), wakeups.subscribe(digest)];
            let barrier = Arc::new(std::sync::Barrier::new(2));
            let handles: Vec<_> = pair
                .into_iter()
                .map(|subscription| {
                    let barrier = Arc::clone(&barrier);
                    std::thread::spawn(move || {
                        barrier.wait();
                        drop(subscription);
                    })
                })
                .collect();
            for handle in handles {
                handle.join().expect("a subscription dropped");
            }
        }
        assert_eq!(wakeups.waiting(), 0);
        assert_eq!(wakeups.records.lock().map(|r| r.len()).unwrap_or(1), 0);
    }

    #[test]
    fn c05_the_last_waiter_of_a_record_removes_its_entry() {
        let wakeups = Arc::new(Wakeups::default());
        let first = wakeups.subscribe([1; 32]);
        let second = wakeups.subscribe([1; 32]);
        assert_eq!(wakeups.waiting(), 2);
        drop(first);
        assert_eq!(wakeups.records.lock().map(|r| r.len()).unwrap_or(0), 1);
        drop(second);
        assert_eq!(wakeups.waiting(), 0);
        assert_eq!(wakeups.records.lock().map(|r| r.len()).unwrap_or(1), 0);
        let changes = Changes::of(&wakeups);
        assert!(!changes.is_closed());
        drop(wakeups);
        assert!(changes.is_closed());
    }
}
