//! A piece of work repeated on a task of its own until stopped.

use std::future::Future;
use std::time::Duration;
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// A periodic task ([`purge_every`](crate::purge_every),
/// [`reconcile_every`](crate::reconcile_every)). Dropping it leaves the task running; stop
/// it with [`stop`](Self::stop).
#[derive(Debug)]
pub struct Periodic {
    stop: watch::Sender<bool>,
    task: JoinHandle<()>,
}

impl Periodic {
    /// Runs `pass` now, then `period` after each pass ends, until stopped. A pass is
    /// abandoned at a stop; `pass` is told when a stop was asked (its argument) so that a long
    /// pass can end between two steps.
    pub(crate) fn spawn<F, Fut>(period: Duration, mut pass: F) -> Self
    where
        F: FnMut(watch::Receiver<bool>) -> Fut + Send + 'static,
        Fut: Future<Output = ()> + Send,
    {
        let (stop, mut stopped) = watch::channel(false);
        let task = tokio::spawn(async move {
            loop {
                let this_pass = pass(stopped.clone());
                tokio::select! {
                    biased;
                    _ = stopped.changed() => return,
                    () = this_pass => {}
                }
                tokio::select! {
                    _ = tokio::time::sleep(period) => {}
                    _ = stopped.changed() => return,
                }
            }
        });
        Self { stop, task }
    }

    /// Stops the task and waits for it to end.
    pub async fn stop(self) {
        let _ = self.stop.send(true);
        let _ = self.task.await;
    }
}
