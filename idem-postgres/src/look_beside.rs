//! A one-commit reservation waiting for a connection for its transaction while effects hold
//! them all (C5, C15): past a short wait it looks for a duplicate's answer on one of the
//! store's own connections (`sql/look.sql`), the wait going on beside the look.

use crate::effect_connection::{Acquiring, EffectConnection};
use crate::store::PgStore;
use idem_core::store::Execution;
use idem_core::{Answer, Error, Operation, Request};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::Poll;
use std::time::Duration;

/// How long a one-commit reservation waits for a connection for its transaction before it
/// looks for a duplicate's answer beside the effects that hold them all (C5): a few times what
/// a short transaction holds one for under load. Fresh keys at more callers than connections
/// take their turns without a look (a look reads the server's lock table: one per fresh key
/// halved their rate at 32 callers on 16 connections), and a duplicate behind long effects is
/// still answered within it.
const LOOK_AFTER: Duration = Duration::from_millis(10);

/// What waiting for a one-commit transaction's connection ended with.
pub(crate) enum Waited<'a> {
    Connection(EffectConnection<'a>),
    /// A duplicate's answer, looked up while every connection stayed taken.
    Answered(Answer),
}

impl PgStore {
    /// A connection for a one-commit transaction (the first try), or a duplicate's answer
    /// while every connection the store runs effects on stays taken (by effects, perhaps long
    /// ones): past [`LOOK_AFTER`] (at once if less than twice that is left of the budget, so
    /// that the look has most of a short budget, as before the wait) the answer is
    /// asked on a connection no effect holds, as its reservation would answer it, one-commit
    /// holders of the key included (C5, `sql/look.sql`), while the wait goes on (a connection
    /// that comes first ends the look), and goes on after it if there is none (the record is
    /// absent or would be taken over, or the look failed: the reservation in the transaction
    /// decides).
    pub(crate) async fn connection_or_answer<'a>(
        &'a self,
        request: &Request,
        acquire: Acquiring<'a>,
        execution: &Execution,
    ) -> Result<Waited<'a>, Error> {
        let id = request.id();
        let mut acquire = acquire;
        let soon = execution
            .bounded(Operation::Transaction, id, |deadline| {
                // A budget too short to wait and still look (the look's answer must come
                // within it) looks at once, unless a connection is free now.
                let patience = if deadline.remaining() >= LOOK_AFTER * 2 {
                    LOOK_AFTER
                } else {
                    Duration::ZERO
                };
                let acquire = &mut acquire;
                async move {
                    if patience.is_zero() {
                        // Polled once, without a timer (which would fire at its next tick).
                        return std::future::poll_fn(|cx| {
                            Poll::Ready(match acquire.as_mut().poll(cx) {
                                Poll::Ready(conn) => conn.map(Some),
                                Poll::Pending => Ok(None),
                            })
                        })
                        .await;
                    }
                    match tokio::time::timeout(patience, acquire).await {
                        Ok(conn) => conn.map(Some),
                        Err(_) => Ok(None),
                    }
                }
            })
            .await?;
        if let Some(conn) = soon {
            return Ok(Waited::Connection(conn));
        }
        // The look, while the connection's turn is still waited for: a connection that comes
        // first is taken, the look dropped (it writes nothing), so that a turn never idles
        // through a look that waits, say for a connection of the store's own. Only the call
        // that ends is charged to the budget and reported; the other, dropped, is neither. A
        // wait that fails (no connection can be opened) leaves the look to answer, if it can.
        // Set as the look is given up for a connection: cut off so, on purpose, its connection
        // settles without its host being checked (under load that is every few milliseconds).
        let overtaken = Arc::new(AtomicBool::new(false));
        let found = {
            let mut look = std::pin::pin!(execution.bounded(Operation::Reserve, id, |deadline| {
                self.look(request, deadline, &overtaken)
            }));
            let wait = execution.bounded(Operation::Transaction, id, |_| &mut acquire);
            tokio::select! {
                biased;
                found = &mut look => found,
                conn = wait => {
                    let error = match conn {
                        Ok(conn) => {
                            overtaken.store(true, Ordering::Release);
                            return Ok(Waited::Connection(conn));
                        }
                        Err(error) => error,
                    };
                    let found = look.await.and_then(|found| found.answer(request));
                    return match found {
                        Ok(Some(answer)) => Ok(Waited::Answered(answer)),
                        _ => Err(error),
                    };
                }
            }
        };
        // A look that spent the rest of the budget ends the reservation with its error (and
        // its one report of the spent budget): a wait started with nothing left would fail at
        // once, reported a second time, with a timeout of nothing.
        let found = match found {
            Err(error) if execution.store_timeout().is_zero() => return Err(error),
            found => found,
        };
        if let Some(answer) = found.and_then(|found| found.answer(request)).ok().flatten() {
            return Ok(Waited::Answered(answer));
        }
        execution
            .bounded(Operation::Transaction, id, |_| acquire)
            .await
            .map(Waited::Connection)
    }
}
