//! Logging in to the CodaLab server at start-up.

use std::future::Future;
use std::time::Duration;

use protocol::RestClient;

/// Logs in, retrying an unreachable or failing server with back-off (1 s doubling to 60 s, one
/// log line per attempt). Bad credentials and other permanent errors end it at once. Returns
/// `Ok(false)` when `stop` resolves first.
pub async fn login_until_success(
    client: &RestClient,
    stop: impl Future<Output = ()>,
) -> anyhow::Result<bool> {
    tokio::pin!(stop);
    let mut delay = Duration::from_secs(1);
    loop {
        match client.login().await {
            Ok(()) => return Ok(true),
            Err(e @ protocol::Error::Auth { .. }) => return Err(e.into()),
            Err(e) if e.is_retryable() => {
                tracing::warn!("cannot log in, retrying in {}s: {e}", delay.as_secs());
                tokio::select! {
                    _ = tokio::time::sleep(delay) => {}
                    _ = &mut stop => return Ok(false),
                }
                delay = (delay * 2).min(Duration::from_secs(60));
            }
            Err(e) => return Err(e.into()),
        }
    }
}
