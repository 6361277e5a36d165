//! Accepting connections and serving HTTP/1.1 on them, with hyper directly
//! rather than `axum::serve`: that one gives hyper no timer, so a client
//! could take as long as it liked to send its headers. Here the headers must
//! arrive within `--read-timeout` (the body's deadline is the extractors',
//! extract.rs), and shutdown is graceful as with `axum::serve`.

use axum::serve::Listener;
use axum::Router;
use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use std::future::Future;
use std::time::Duration;
use tokio::net::TcpListener;

/// Serves `app` until `shutdown` resolves; then stops accepting (the
/// listener is closed), lets the requests in flight finish, and returns
/// once every connection is closed.
pub async fn serve(mut listener: TcpListener, app: Router, read_timeout: Duration, shutdown: impl Future<Output = ()>) {
    let mut http = http1::Builder::new();
    // hyper closes a connection whose next request's headers are late
    // (an idle keep-alive connection too) without an answer: it has no
    // request to answer yet.
    http.timer(TokioTimer::new()).header_read_timeout(read_timeout);
    let connections = GracefulShutdown::new();
    tokio::pin!(shutdown);
    loop {
        let (stream, peer) = tokio::select! {
            // Accept errors (out of file descriptors, …) are logged and
            // retried by axum's `Listener` for `TcpListener`.
            accepted = Listener::accept(&mut listener) => accepted,
            () = &mut shutdown => break,
        };
        let connection = http.serve_connection(TokioIo::new(stream), TowerToHyperService::new(app.clone()));
        let connection = connections.watch(connection);
        tokio::spawn(async move {
            if let Err(err) = connection.await {
                tracing::debug!(%peer, error = %err, "connection ended with an error");
            }
        });
    }
    drop(listener);
    connections.shutdown().await;
}
