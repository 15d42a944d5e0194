//! [`shutdown_signal`]: what a service waits for before its graceful shutdown.

/// Resolves at Ctrl-C or, on Unix, SIGTERM (what an orchestrator sends before it kills). Give
/// it to `axum::serve(..).with_graceful_shutdown`, then call
/// [`Idempotency::shutdown`](crate::Idempotency::shutdown): the relay finishes its in-flight
/// batches and the cleanup job stops.
///
/// A signal that cannot be listened to is logged and waited for no longer (the other one
/// still ends the wait).
///
/// ```no_run
/// # #[cfg(feature = "sqlite")]
/// # async fn demo(idempotency: idempotency::Idempotency<idempotency::sqlx::SqlitePool>) -> std::io::Result<()> {
/// let listener = tokio::net::TcpListener::bind("127.0.0.1:3000").await?;
/// axum::serve(listener, axum::Router::new())
///     .with_graceful_shutdown(idempotency::shutdown_signal())
///     .await?;
/// idempotency.shutdown().await;
/// # Ok(()) }
/// ```
pub async fn shutdown_signal() {
    let ctrl_c = async {
        if let Err(error) = tokio::signal::ctrl_c().await {
            tracing::warn!(%error, "cannot listen for Ctrl-C");
            std::future::pending::<()>().await;
        }
    };
    #[cfg(unix)]
    let terminate = async {
        use tokio::signal::unix::{SignalKind, signal};
        match signal(SignalKind::terminate()) {
            Ok(mut terminate) => {
                terminate.recv().await;
            }
            Err(error) => {
                tracing::warn!(%error, "cannot listen for SIGTERM");
                std::future::pending::<()>().await;
            }
        }
    };
    #[cfg(not(unix))]
    let terminate = std::future::pending::<()>();
    tokio::select! {
        () = ctrl_c => tracing::info!("Ctrl-C: shutting down"),
        () = terminate => tracing::info!("SIGTERM: shutting down"),
    }
}
