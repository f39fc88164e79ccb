//! A transaction of yours on one of the store's connections for transactions: the guard form's
//! counterpart of what `run_in_transaction` runs on, taken and given back without the ping
//! sqlx's pool sends when a connection comes back (a round trip more per fresh key).

use crate::connections::Held;
use crate::error::{is_broken_link, store_error};
use crate::session;
use crate::store::PgStore;
use idem_core::Error;
use sqlx::{AssertSqlSafe, PgConnection};
use std::ops::{Deref, DerefMut};

/// An open transaction on one of the store's connections; see [`PgStore::transaction`].
///
/// It dereferences to the [`PgConnection`] it runs on (`&mut *tx` for sqlx's queries, `&mut tx`
/// for [`PgStore::complete_in`]). [`commit`](Self::commit) or [`rollback`](Self::rollback) end
/// it and give the connection back; dropped without either (a cancelled request, a panic), its
/// connection is closed and the server rolls the transaction back.
pub struct PgTransaction<'s> {
    held: Held<'s>,
}

impl std::fmt::Debug for PgTransaction<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgTransaction").finish_non_exhaustive()
    }
}

/// Runs `statement` (no rows) in one simple-query message.
async fn simple(conn: &mut PgConnection, statement: String) -> Result<(), Error> {
    sqlx::raw_sql(AssertSqlSafe(statement))
        .execute(conn)
        .await
        .map(drop)
        .map_err(store_error)
}

impl PgStore {
    /// Opens a transaction at the store's [`Isolation`](crate::Isolation) on one of the
    /// connections the store keeps for transactions (up to
    /// [`max_connections`](crate::PgStoreBuilder::max_connections)), with the same idle
    /// deadline as the transactions of `run_in_transaction`
    /// ([`idle_in_transaction_timeout`](crate::PgStoreBuilder::idle_in_transaction_timeout)).
    /// Its `BEGIN` is one round trip, and its connection comes back to the store without one:
    /// with [`complete_in`](Self::complete_in), a fresh key in the guard form costs what it
    /// costs in `run_in_transaction`, five round trips. A `BEGIN` that fails on a connection
    /// that died idle is sent again, once, on a new one.
    ///
    /// ```no_run
    /// # use idem_core::{Begin, Idempotency, StoredResponse};
    /// # use idem_postgres::PgStore;
    /// # async fn demo(idem: Idempotency<PgStore>, request: idem_core::Request) -> Result<(), Box<dyn std::error::Error>> {
    /// if let Begin::Acquired(lease) = idem.begin(&request).await? {
    ///     let mut tx = idem.store().transaction().await?;
    ///     sqlx::query("INSERT INTO charges (cents) VALUES (2500)").execute(&mut *tx).await?;
    ///     let completion = idem.completion(&lease, StoredResponse::new(201, "charged"));
    ///     idem.store().complete_in(&mut tx, &completion).await?; // on error: dropped, rolled back
    ///     tx.commit().await?;
    /// }
    /// # Ok(())
    /// # }
    /// ```
    pub async fn transaction(&self) -> Result<PgTransaction<'_>, Error> {
        let begin = session::effect_begin(
            self.isolation().begin_statement(),
            &self.inner.config.deadlines,
        );
        let conns = &self.inner.tx_conns;
        let mut held = conns.get().await?;
        let mut began = simple(held.conn(), begin.clone()).await;
        if !held.fresh && matches!(&began, Err(e) if is_broken_link(e)) {
            held.finish(&began);
            held = conns.get_fresh().await?;
            began = simple(held.conn(), begin).await;
        }
        match began {
            Ok(()) => Ok(PgTransaction { held }),
            Err(error) => {
                let result = Err(error);
                held.finish(&result);
                result
            }
        }
    }
}

impl PgTransaction<'_> {
    /// Commits; the connection goes back to the store unless the link broke (then whether the
    /// COMMIT reached the server is unknown: read the record to tell).
    pub async fn commit(self) -> Result<(), Error> {
        self.end("COMMIT").await
    }

    /// Rolls back; the connection goes back to the store unless the link broke.
    pub async fn rollback(self) -> Result<(), Error> {
        self.end("ROLLBACK").await
    }

    async fn end(mut self, statement: &str) -> Result<(), Error> {
        let result = simple(self.held.conn(), statement.to_owned()).await;
        self.held.finish(&result);
        result
    }
}

impl Deref for PgTransaction<'_> {
    type Target = PgConnection;

    fn deref(&self) -> &PgConnection {
        self.held.conn_ref()
    }
}

impl DerefMut for PgTransaction<'_> {
    fn deref_mut(&mut self) -> &mut PgConnection {
        self.held.conn()
    }
}
