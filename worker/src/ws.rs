//! The websocket nudge: the server pings `<ws>/worker/<id>` when it has a message for this
//! worker, and the worker checks in at once. Best effort: polling works without it.

use std::time::Duration;

use backon::Retryable;
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

/// The back-off between failed connects: 1 s doubling to 60 s, with jitter, forever (polling
/// goes on meanwhile).
fn reconnect_backoff() -> backon::ExponentialBuilder {
    backon::ExponentialBuilder::default()
        .with_min_delay(Duration::from_secs(1))
        .with_max_delay(Duration::from_secs(60))
        .with_jitter()
        .without_max_times()
}

/// Connects, and reconnects forever with back-off, calling `nudge` on every message.
pub async fn listen(
    base: String,
    worker_id: String,
    nudge: impl Fn() + Send + Sync + 'static,
    stop: CancellationToken,
) {
    let url = worker_url(&base, &worker_id);
    loop {
        let mut failures = 0u32;
        let connect = (|| tokio_tungstenite::connect_async(url.as_str()))
            .retry(reconnect_backoff())
            .sleep(tokio::time::sleep)
            .notify(|e, _| {
                failures += 1;
                if failures == 1 {
                    tracing::warn!(
                        "websocket {url} unavailable ({e}); checkins go on by polling, retrying"
                    );
                } else {
                    tracing::debug!("websocket {url} still unavailable: {e}");
                }
            });
        let mut ws = tokio::select! {
            _ = stop.cancelled() => return,
            r = connect => match r {
                Ok((ws, _)) => ws,
                // (Unreachable: the back-off never gives up.)
                Err(_) => continue,
            },
        };
        tracing::debug!("websocket connected to {url}");
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
        // A server that accepts and closes at once is not retried in a tight loop.
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(Duration::from_secs(1)) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reconnects_back_off_from_1_s_to_60_s_and_never_give_up() {
        let no_jitter = backon::ExponentialBuilder::default()
            .with_min_delay(Duration::from_secs(1))
            .with_max_delay(Duration::from_secs(60))
            .without_max_times();
        let delays: Vec<_> = backon::BackoffBuilder::build(no_jitter).take(9).collect();
        let secs: Vec<u64> = delays.iter().map(Duration::as_secs).collect();
        assert_eq!(secs, [1, 2, 4, 8, 16, 32, 60, 60, 60]);
        // With jitter, every delay stays within [d, 2d) of the plain one, forever.
        let mut jittered = backon::BackoffBuilder::build(reconnect_backoff());
        for d in delays {
            let j = jittered.next().expect("never gives up");
            assert!(j >= d && j < 2 * d, "{j:?} for {d:?}");
        }
        assert!(backon::BackoffBuilder::build(reconnect_backoff())
            .nth(1000)
            .is_some());
    }

    #[test]
    fn url_keeps_the_raw_id() {
        assert_eq!(
            worker_url("ws://h:2901/", "host(12)"),
            "ws://h:2901/worker/host(12)"
        );
    }
}
