//! An execution that outlives its caller (C8): polled in the caller's task, handed to the
//! runtime only if the caller's future is dropped first. An answer costs no spawn; an abandoned
//! execution still completes or releases its key.

use std::future::Future;
use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};
use std::pin::Pin;
use std::task::{Context, Poll};
use tokio::runtime::Handle;
use tracing::Instrument;

/// Boxed where made: never copied again, and movable to a task after its first poll.
pub(crate) type Boxed<T> = Pin<Box<dyn Future<Output = T> + Send>>;

/// A future that finishes even when dropped. `G` (the gate's count) lives as long, wherever.
pub(crate) struct Detach<T: Send + 'static, G: Send + 'static> {
    /// `None` once it ended (or panicked): nothing is left to hand over.
    future: Option<Boxed<T>>,
    guard: Option<G>,
    runtime: Handle,
    /// The caller's span, for the events of an execution that goes on without it.
    span: tracing::Span,
}

impl<T: Send + 'static, G: Send + 'static> Detach<T, G> {
    /// Wraps `future`, finished on `runtime` with `guard` if dropped before it ends.
    pub(crate) fn new(future: Boxed<T>, guard: G, runtime: Handle) -> Self {
        Self {
            future: Some(future),
            guard: Some(guard),
            runtime,
            span: tracing::Span::current(),
        }
    }
}

impl<T: Send + 'static, G: Send + 'static + Unpin> Future for Detach<T, G> {
    type Output = T;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<T> {
        let Some(future) = self.future.as_mut() else {
            panic!("an idempotent execution was polled after it ended");
        };
        // A panic inside ends the execution here: it must not be resumed on another task.
        match catch_unwind(AssertUnwindSafe(|| future.as_mut().poll(cx))) {
            Ok(Poll::Pending) => Poll::Pending,
            Ok(Poll::Ready(output)) => {
                self.future = None;
                self.guard = None;
                Poll::Ready(output)
            }
            Err(panic) => {
                self.future = None;
                self.guard = None;
                resume_unwind(panic)
            }
        }
    }
}

impl<T: Send + 'static, G: Send + 'static> Drop for Detach<T, G> {
    fn drop(&mut self) {
        if let Some(future) = self.future.take() {
            // A runtime shutting down cancels it at once (`drain` was for that); the lease
            // remains (C9).
            let span = std::mem::replace(&mut self.span, tracing::Span::none());
            let guard = self.guard.take();
            let rest = async move {
                let _guard = guard;
                drop(future.await);
            };
            drop(self.runtime.spawn(rest.instrument(span)));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Detach;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    use std::time::Duration;

    #[tokio::test]
    async fn a_dropped_execution_finishes_on_the_runtime() {
        let finished = Arc::new(AtomicBool::new(false));
        let (started_tx, started_rx) = tokio::sync::oneshot::channel();
        let (go_tx, go_rx) = tokio::sync::oneshot::channel::<()>();
        let flag = Arc::clone(&finished);
        let execution = Detach::new(
            Box::pin(async move {
                let _ = started_tx.send(());
                let _ = go_rx.await;
                flag.store(true, Ordering::SeqCst);
            }),
            (),
            tokio::runtime::Handle::current(),
        );
        let caller = tokio::spawn(execution);
        started_rx
            .await
            .expect("the execution started in the caller's task");
        caller.abort();
        let _ = caller.await;
        assert!(!finished.load(Ordering::SeqCst));
        go_tx
            .send(())
            .expect("the execution still waits: it was handed over, not dropped");
        for _ in 0..200 {
            if finished.load(Ordering::SeqCst) {
                return;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        panic!("the execution whose caller went away never finished");
    }

    #[tokio::test]
    async fn a_finished_execution_is_not_run_again() {
        let runs = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let counted = Arc::clone(&runs);
        let execution = Detach::new(
            Box::pin(async move {
                counted.fetch_add(1, Ordering::SeqCst);
                7
            }),
            (),
            tokio::runtime::Handle::current(),
        );
        assert_eq!(execution.await, 7);
        tokio::task::yield_now().await;
        assert_eq!(runs.load(Ordering::SeqCst), 1);
    }

    #[tokio::test]
    async fn a_panic_resumes_in_the_caller_and_is_not_handed_over() {
        let execution = Detach::new(
            Box::pin(async {
                panic!("the effect panicked");
            }),
            (),
            tokio::runtime::Handle::current(),
        );
        let caller = tokio::spawn(execution);
        let join = caller.await.expect_err("the panic reached the caller");
        assert!(join.is_panic());
    }
}
