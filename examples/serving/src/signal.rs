//! When a server is asked to stop: Ctrl-C, or SIGTERM on Unix.

/// Resolves on Ctrl-C or SIGTERM (on Unix; elsewhere Ctrl-C only). If SIGTERM cannot be
/// listened for, it never resolves.
pub async fn shutdown_signal() {
    let interrupt = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut term =
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(term) => term,
                Err(_) => return std::future::pending().await,
            };
        tokio::select! {
            _ = interrupt => {}
            _ = term.recv() => {}
        }
    }
    #[cfg(not(unix))]
    let _ = interrupt.await;
}
