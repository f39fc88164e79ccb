//! Catching a panic of a future, so that the engine can record its outcome (C8).

use std::any::Any;
use std::future::Future;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::pin::Pin;
use std::task::{Context, Poll};

/// A future whose panic becomes `Err(payload)`: a store's effect then ends as `TxEnd::Panicked`.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// let caught = idem_core::store::CatchUnwind::new(async { panic!("boom") }).await;
/// assert!(caught.is_err());
/// # }
/// ```
#[derive(Debug)]
pub struct CatchUnwind<F>(Option<Pin<Box<F>>>);

impl<F: Future> CatchUnwind<F> {
    /// Catches the panics of `future`.
    pub fn new(future: F) -> Self {
        Self(Some(Box::pin(future)))
    }
}

impl<F: Future> Future for CatchUnwind<F> {
    type Output = Result<F::Output, Box<dyn Any + Send>>;

    /// Catches panics while polling and while dropping the finished future (C8).
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let Some(inner) = self.0.as_mut() else {
            panic!("CatchUnwind polled after it finished");
        };
        let polled = catch_unwind(AssertUnwindSafe(|| inner.as_mut().poll(cx)));
        match polled {
            Ok(Poll::Pending) => Poll::Pending,
            Ok(Poll::Ready(value)) => {
                let finished = self.0.take();
                match catch_unwind(AssertUnwindSafe(move || drop(finished))) {
                    Ok(()) => Poll::Ready(Ok(value)),
                    Err(panic) => Poll::Ready(Err(panic)),
                }
            }
            Err(panic) => {
                // Dropping what is left of a future that panicked may panic again: caught.
                let broken = self.0.take();
                let _ = catch_unwind(AssertUnwindSafe(move || drop(broken)));
                Poll::Ready(Err(panic))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::CatchUnwind;

    struct PanicsOnDrop;

    impl Drop for PanicsOnDrop {
        fn drop(&mut self) {
            panic!("dropped");
        }
    }

    /// A finished future that still owns a value whose `Drop` panics.
    struct Charged(PanicsOnDrop);

    impl std::future::Future for Charged {
        type Output = u16;
        fn poll(
            self: std::pin::Pin<&mut Self>,
            _: &mut std::task::Context<'_>,
        ) -> std::task::Poll<u16> {
            std::task::Poll::Ready(201)
        }
    }

    #[tokio::test]
    async fn c08_a_future_whose_drop_panics_after_it_finished_is_caught() {
        let caught = CatchUnwind::new(Charged(PanicsOnDrop)).await;
        assert!(caught.is_err(), "the panic in drop is the outcome");
    }
}
