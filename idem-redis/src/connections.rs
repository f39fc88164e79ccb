//! Which connection a call uses: the store's, or on the engine's heartbeat thread one opened
//! there (C9).
//!
//! The store's connection is driven by a task of the runtime it was opened on, usually the
//! application's. Handlers that block every worker of that runtime would leave the engine's
//! renewals, made on the heartbeat thread's own runtime, waiting on a socket nobody reads, and
//! another instance would take over a live execution. So calls made on the heartbeat thread
//! use a connection opened lazily by that thread, with the same client and settings, which its
//! runtime drives.

use crate::conn::{Conn, Node, Opener};
use idem_core::{Error, StoreErrorKind};
use redis::{Cmd, Pipeline, ScriptInvocation, Value};
use std::future::Future;
use std::sync::{Arc, Mutex, PoisonError};

pub(crate) struct Connections {
    /// The store's connection, for every call but the heartbeat thread's.
    conn: Conn,
    /// What opened it, to open the heartbeat's.
    opener: Opener,
    /// The heartbeat's connection once a call made it; emptied when it fails unavailable, so
    /// the next call there opens another.
    beat: Mutex<Option<Arc<Conn>>>,
}

impl Connections {
    pub(crate) fn new(conn: Conn, opener: Opener) -> Self {
        Self {
            conn,
            opener,
            beat: Mutex::new(None),
        }
    }

    pub(crate) fn is_cluster(&self) -> bool {
        matches!(self.conn, Conn::Cluster(_))
    }

    /// Runs `op` on the connection for a call made here: the heartbeat's on the engine's
    /// heartbeat thread (opened now if there is none), the store's everywhere else.
    async fn on<T, F, Fut>(&self, op: F) -> Result<T, Error>
    where
        F: FnOnce(Conn) -> Fut,
        Fut: Future<Output = Result<T, Error>>,
    {
        if !idem_core::store::on_heartbeat_thread() {
            return op(self.conn.clone()).await;
        }
        let beat = self.beat().await?;
        let result = op(Conn::clone(&beat)).await;
        if matches!(&result, Err(Error::Store(e)) if e.kind() == StoreErrorKind::Unavailable) {
            self.forget(&beat);
        }
        result
    }

    /// The heartbeat's connection, opened on first use. Two first calls may both open one:
    /// the first one kept wins, the other is dropped.
    async fn beat(&self) -> Result<Arc<Conn>, Error> {
        let kept = self.slot().clone();
        if let Some(conn) = kept {
            return Ok(conn);
        }
        let opened = Arc::new(self.opener.open().await?);
        Ok(Arc::clone(self.slot().get_or_insert(opened)))
    }

    /// Drops the heartbeat's connection `failed`, unless another call has replaced it already.
    fn forget(&self, failed: &Arc<Conn>) {
        let mut slot = self.slot();
        if slot.as_ref().is_some_and(|kept| Arc::ptr_eq(kept, failed)) {
            *slot = None;
        }
    }

    fn slot(&self) -> std::sync::MutexGuard<'_, Option<Arc<Conn>>> {
        self.beat.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// See [`Conn::invoke`].
    pub(crate) async fn invoke(&self, invocation: &ScriptInvocation<'_>) -> Result<Value, Error> {
        self.on(|conn| async move { conn.invoke(invocation).await })
            .await
    }

    /// See [`Conn::nodes`].
    pub(crate) async fn nodes(&self) -> Result<Vec<Node>, Error> {
        self.on(|conn| async move { conn.nodes().await }).await
    }

    /// See [`Conn::query_on`].
    pub(crate) async fn query_on(&self, node: &Node, cmd: &Cmd) -> Result<Value, Error> {
        self.on(|conn| async move { conn.query_on(node, cmd).await })
            .await
    }

    /// See [`Conn::pipeline_on`].
    pub(crate) async fn pipeline_on(
        &self,
        node: &Node,
        pipe: Pipeline,
    ) -> Result<Vec<Value>, Error> {
        self.on(|conn| async move { conn.pipeline_on(node, pipe).await })
            .await
    }
}
