//! Requests run on tasks of their own, so that a request runs to its end (and writes its log
//! line) whether or not its client waits for the answer, and shutdown can wait for them.

use std::future::Future;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

/// Spawns request tasks and tells when all of them have ended.
#[derive(Debug, Clone)]
pub struct Tasks {
    alive: mpsc::Sender<()>,
}

/// The other end of [`Tasks`]: resolves once every task has ended and every [`Tasks`] handle
/// is dropped.
#[derive(Debug)]
pub struct Drained(mpsc::Receiver<()>);

impl Tasks {
    /// A spawner, and what tells when its tasks have all ended.
    pub fn new() -> (Self, Drained) {
        let (alive, ended) = mpsc::channel(1);
        (Self { alive }, Drained(ended))
    }

    /// Runs `work` on a task of its own.
    pub fn spawn<T: Send + 'static>(
        &self,
        work: impl Future<Output = T> + Send + 'static,
    ) -> JoinHandle<T> {
        let alive = self.alive.clone();
        tokio::spawn(async move {
            let out = work.await;
            drop(alive);
            out
        })
    }
}

impl Drained {
    /// Waits until every task has ended (once the handles are dropped).
    pub async fn wait(mut self) {
        // Nothing is ever sent: `recv` returns `None` when the last sender is gone.
        let _ = self.0.recv().await;
    }
}
