//! The websocket nudge: the server pings `<ws>/worker/<id>` when it has a message for this
//! worker, and the worker checks in at once. Best effort: polling works without it.

use std::time::Duration;

use futures::{SinkExt, StreamExt};
use tokio_tungstenite::tungstenite::Message;
use tokio_util::sync::CancellationToken;

/// How often the worker speaks on the socket (the ws-server drops sockets silent for 60 s).
const KEEPALIVE: Duration = Duration::from_secs(10);

/// The worker's websocket URL. The id is not percent-encoded: the ws-server compares the raw
/// path tail with the worker id.
pub fn worker_url(base: &str, worker_id: &str) -> String {
    format!("{}/worker/{worker_id}", base.trim_end_matches('/'))
}

/// Connects, and reconnects forever with backoff, calling `nudge` on every message.
pub async fn listen(
    base: String,
    worker_id: String,
    nudge: impl Fn() + Send + Sync + 'static,
    stop: CancellationToken,
) {
    let url = worker_url(&base, &worker_id);
    let mut delay = Duration::from_secs(1);
    let mut failures = 0u32;
    loop {
        let connected = tokio::select! {
            _ = stop.cancelled() => return,
            r = tokio_tungstenite::connect_async(url.as_str()) => r,
        };
        match connected {
            Ok((mut ws, _)) => {
                tracing::debug!("websocket connected to {url}");
                failures = 0;
                delay = Duration::from_secs(1);
                let mut keepalive = tokio::time::interval(KEEPALIVE);
                loop {
                    tokio::select! {
                        _ = stop.cancelled() => {
                            let _ = ws.close(None).await;
                            return;
                        }
                        _ = keepalive.tick() => {
                            if ws.send(Message::text("a")).await.is_err() {
                                break;
                            }
                        }
                        m = ws.next() => match m {
                            Some(Ok(Message::Text(_) | Message::Binary(_))) => nudge(),
                            Some(Ok(Message::Close(_))) | None | Some(Err(_)) => break,
                            Some(Ok(_)) => {}
                        },
                    }
                }
                tracing::debug!("websocket to {url} closed; reconnecting");
            }
            Err(e) => {
                failures += 1;
                if failures == 1 {
                    tracing::warn!(
                        "websocket {url} unavailable ({e}); checkins go on by polling, retrying"
                    );
                } else {
                    tracing::debug!("websocket {url} still unavailable: {e}");
                }
            }
        }
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(delay) => {}
        }
        delay = (delay * 2).min(Duration::from_secs(60));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn url_keeps_the_raw_id() {
        assert_eq!(
            worker_url("ws://h:2901/", "host(12)"),
            "ws://h:2901/worker/host(12)"
        );
    }
}
