//! `netcat`: a message to a port of the run's container and the answer.

use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::runtime::BundleRuntime;

use super::{Failure, Target, NETCAT_CONNECT, NETCAT_DEADLINE, NETCAT_IDLE, NETCAT_MAX_REPLY};

pub(super) async fn container_ip<R: BundleRuntime>(
    runtime: &R,
    t: &Target,
) -> Result<String, Failure> {
    let id = t.container_id.as_deref().ok_or_else(|| {
        Failure::internal(format!("The container of bundle {} is not running", t.uuid))
    })?;
    runtime
        .address(&t.uuid, id)
        .await
        .map_err(|e| Failure::internal(e.to_string()))
}

/// Sends `message` to `port` of the run's container and returns what comes back until the
/// connection closes (or goes quiet, or the deadline passes).
pub(super) async fn netcat<R: BundleRuntime>(
    runtime: &R,
    t: &Target,
    port: u16,
    message: &[u8],
) -> Result<Vec<u8>, Failure> {
    let deadline = tokio::time::Instant::now() + NETCAT_DEADLINE;
    let ip = container_ip(runtime, t).await?;
    exchange(&ip, port, message, deadline, NETCAT_IDLE).await
}

pub(super) async fn exchange(
    host: &str,
    port: u16,
    message: &[u8],
    deadline: tokio::time::Instant,
    idle: Duration,
) -> Result<Vec<u8>, Failure> {
    let addr = format!("{host}:{port}");
    let connect = tokio::net::TcpStream::connect(addr.as_str());
    let mut sock = match tokio::time::timeout(NETCAT_CONNECT, connect).await {
        Ok(Ok(s)) => s,
        Ok(Err(e)) => return Err(Failure::internal(format!("{e} (connecting to {addr})"))),
        Err(_) => return Err(Failure::internal(format!("timed out connecting to {addr}"))),
    };
    tokio::time::timeout_at(deadline, sock.write_all(message))
        .await
        .map_err(|_| Failure::internal(format!("timed out sending to {addr}")))?
        .map_err(|e| Failure::internal(format!("{e} (sending to {addr})")))?;
    let mut out = Vec::new();
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let until = if out.is_empty() {
            deadline
        } else {
            deadline.min(tokio::time::Instant::now() + idle)
        };
        match tokio::time::timeout_at(until, sock.read(&mut buf)).await {
            Ok(Ok(0)) => break,
            Ok(Ok(n)) if out.len() + n > NETCAT_MAX_REPLY => {
                // A 4xx: CodaLab's server hands its text to the client (a 5xx becomes a bare
                // internal error).
                return Err(Failure::new(
                    413,
                    format!(
                        "The answer from port {port} is larger than {} MiB; netcat answers are \
                         capped at that size",
                        NETCAT_MAX_REPLY >> 20
                    ),
                ));
            }
            Ok(Ok(n)) => out.extend_from_slice(&buf[..n]),
            Ok(Err(e)) => {
                if out.is_empty() {
                    return Err(Failure::internal(format!("{e} (reading from {addr})")));
                }
                break;
            }
            Err(_) if out.is_empty() => {
                return Err(Failure::new(
                    504,
                    format!(
                        "No response from port {port} within {} s",
                        NETCAT_DEADLINE.as_secs()
                    ),
                ))
            }
            Err(_) => {
                tracing::debug!(
                    "netcat {addr}: connection still open, replying with {} bytes",
                    out.len()
                );
                break;
            }
        }
    }
    Ok(out)
}
