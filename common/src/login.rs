//! Logging in to the CodaLab server at start-up.

use std::future::Future;
use std::time::Duration;

use backon::{ExponentialBuilder, Retryable};
use protocol::RestClient;

/// Logs in, retrying an unreachable or failing server with back-off (1 s doubling to 60 s, one
/// log line per attempt). Bad credentials and other permanent errors end it at once. Returns
/// `Ok(false)` when `stop` resolves first.
pub async fn login_until_success(
    client: &RestClient,
    stop: impl Future<Output = ()>,
) -> anyhow::Result<bool> {
    let backoff = ExponentialBuilder::default()
        .with_min_delay(Duration::from_secs(1))
        .with_max_delay(Duration::from_secs(60))
        .without_max_times();
    let login = (|| client.login())
        .retry(backoff)
        .sleep(tokio::time::sleep)
        .when(|e| e.is_retryable() && !matches!(e, protocol::Error::Auth { .. }))
        .notify(|e, delay| {
            tracing::warn!("cannot log in, retrying in {}s: {e}", delay.as_secs());
        });
    tokio::select! {
        r = login => r.map(|()| true).map_err(Into::into),
        _ = stop => Ok(false),
    }
}
