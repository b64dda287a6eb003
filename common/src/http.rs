//! The small HTTP server both binaries run on `--metrics-addr`: bound at start-up (a taken port
//! fails start-up), served until shutdown, and the Prometheus text answer.

use std::net::SocketAddr;

use axum::http::header;
use axum::response::IntoResponse;
use tokio_util::sync::CancellationToken;

/// The content type of the Prometheus/OpenMetrics text exposition.
pub const OPENMETRICS: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// Binds `addr` now and serves `app` until `shutdown`; logs `serving <what> on http://<addr>`
/// with the bound address (port 0 becomes the chosen port).
pub async fn serve(
    addr: SocketAddr,
    app: axum::Router,
    what: &str,
    shutdown: CancellationToken,
) -> anyhow::Result<tokio::task::JoinHandle<()>> {
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|e| anyhow::anyhow!("--metrics-addr {addr}: {e}"))?;
    let local = listener.local_addr()?;
    tracing::info!("serving {what} on http://{local}");
    Ok(tokio::spawn(async move {
        let r = axum::serve(listener, app)
            .with_graceful_shutdown(async move { shutdown.cancelled().await })
            .await;
        if let Err(e) = r {
            tracing::warn!("metrics server stopped: {e}");
        }
    }))
}

/// A `/metrics` answer: the text exposition with its content type.
pub fn metrics_response(text: String) -> impl IntoResponse {
    ([(header::CONTENT_TYPE, OPENMETRICS)], text)
}

/// The text exposition of a registry.
pub fn encode(registry: &prometheus_client::registry::Registry) -> String {
    let mut out = String::new();
    // Writing into a String cannot fail.
    let _ = prometheus_client::encoding::text::encode(&mut out, registry);
    out
}
