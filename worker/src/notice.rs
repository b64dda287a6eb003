//! Notice of a reclaim before it happens: the clouds' instance metadata services say when a spot
//! or low-priority machine is about to be taken back (EC2's interruption notice, two minutes
//! ahead, and its rebalance recommendation; Azure's Scheduled Events `Preempt`, 30 seconds
//! ahead; GCE's `preempted`). `--preemption-notice` polls the one named (or the one that
//! answers, `auto`) once a second from the worker's own network path (the worker's process, not
//! a run's container) and tells the agent:
//! - [`Kind::Reclaim`]: the machine goes soon; the worker hands its runs back to the server, as
//!   on SIGTERM with `--pass-down-termination`, and exits;
//! - [`Kind::Rebalance`]: the machine is at raised risk; the worker takes no new runs, finishes
//!   those it has and exits.
//!
//! The formats are the clouds' documented ones; the parsers are pure and tested on them, the
//! poller against small local stand-ins of the endpoints (`worker/tests/notice.rs`).

use std::time::Duration;

use tokio_util::sync::CancellationToken;

/// Which cloud's notice to poll.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Source {
    /// The first metadata service that answers (AWS, then Azure, then GCP); none: no polling.
    Auto,
    /// EC2's instance metadata (IMDSv2): spot instance-action and rebalance recommendation.
    Aws,
    /// Azure's Scheduled Events: `Preempt` and `Terminate` of this VM.
    Azure,
    /// GCE's metadata server: `instance/preempted` and `instance/maintenance-event`.
    Gcp,
    /// No polling (the default, as the Python worker).
    None,
}

/// The metadata services' base URLs: the clouds' fixed addresses, or the variables their own
/// SDKs read (`AWS_EC2_METADATA_SERVICE_ENDPOINT`, `GCE_METADATA_HOST`) and, for Azure,
/// `CL_WORKER_AZURE_METADATA_ENDPOINT`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Endpoints {
    pub aws: String,
    pub azure: String,
    pub gcp: String,
}

impl Endpoints {
    pub fn from_env() -> Self {
        let var = |k: &str| std::env::var(k).ok().filter(|v| !v.trim().is_empty());
        let trim = |s: String| s.trim_end_matches('/').to_string();
        Endpoints {
            aws: trim(var("AWS_EC2_METADATA_SERVICE_ENDPOINT").unwrap_or(IMDS.into())),
            azure: trim(var("CL_WORKER_AZURE_METADATA_ENDPOINT").unwrap_or(IMDS.into())),
            gcp: trim(
                var("GCE_METADATA_HOST")
                    .map(|h| {
                        if h.contains("://") {
                            h
                        } else {
                            format!("http://{h}")
                        }
                    })
                    .unwrap_or_else(|| "http://metadata.google.internal".into()),
            ),
        }
    }
}

const IMDS: &str = "http://169.254.169.254";
const AZURE_EVENTS_API: &str = "2020-07-01";
const AZURE_INSTANCE_API: &str = "2021-02-01";

/// What to poll, and where.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Watch {
    pub source: Source,
    pub endpoints: Endpoints,
    pub period: Duration,
}

impl Watch {
    /// `None` for `--preemption-notice none`.
    pub fn new(source: Source) -> Option<Watch> {
        (source != Source::None).then(|| Watch {
            source,
            endpoints: Endpoints::from_env(),
            period: Duration::from_secs(1),
        })
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// The machine is taken back soon: hand the runs back now.
    Reclaim,
    /// The machine is at raised risk: take no new runs.
    Rebalance,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Notice {
    pub kind: Kind,
    pub cloud: &'static str,
    /// What the service said, for the log.
    pub detail: String,
}

// --- the documented formats ---------------------------------------------------------------

/// `GET /latest/meta-data/spot/instance-action`: 404 until a stop, hibernate or terminate is
/// scheduled, then `{"action": "terminate", "time": "2017-09-18T08:22:00Z"}`.
pub fn aws_instance_action(status: u16, body: &str) -> Option<Notice> {
    if status != 200 {
        return None;
    }
    let v: serde_json::Value = serde_json::from_str(body).ok()?;
    let action = v.get("action")?.as_str()?;
    matches!(action, "terminate" | "stop" | "hibernate").then(|| Notice {
        kind: Kind::Reclaim,
        cloud: "aws",
        detail: format!(
            "spot instance-action {action} at {}",
            v.get("time").and_then(|t| t.as_str()).unwrap_or("?")
        ),
    })
}

/// `GET /latest/meta-data/events/recommendations/rebalance`: 404 until EC2 recommends it,
/// then `{"noticeTime": "2020-10-27T08:22:00Z"}`.
pub fn aws_rebalance(status: u16, body: &str) -> Option<Notice> {
    if status != 200 {
        return None;
    }
    let v: serde_json::Value = serde_json::from_str(body).ok()?;
    let t = v.get("noticeTime")?.as_str()?;
    Some(Notice {
        kind: Kind::Rebalance,
        cloud: "aws",
        detail: format!("rebalance recommendation at {t}"),
    })
}

/// `GET /metadata/scheduledevents`: `{"DocumentIncarnation": n, "Events": [{"EventId",
/// "EventType", "ResourceType", "Resources": [vm names], "EventStatus": "Scheduled" |
/// "Started", "NotBefore", ...}]}`. A `Preempt` (spot eviction) or `Terminate` of this VM
/// (`vm_name`; when it is unknown, of any VM the document lists) is a reclaim.
pub fn azure_events(body: &str, vm_name: Option<&str>) -> Option<Notice> {
    let v: serde_json::Value = serde_json::from_str(body).ok()?;
    v.get("Events")?.as_array()?.iter().find_map(|e| {
        let kind = e.get("EventType")?.as_str()?;
        if !matches!(kind, "Preempt" | "Terminate") {
            return None;
        }
        let status = e.get("EventStatus").and_then(|s| s.as_str()).unwrap_or("");
        if !matches!(status, "Scheduled" | "Started") {
            return None;
        }
        let mine = match vm_name {
            None => true,
            Some(name) => e
                .get("Resources")
                .and_then(|r| r.as_array())
                .is_none_or(|r| r.is_empty() || r.iter().any(|x| x.as_str() == Some(name))),
        };
        mine.then(|| Notice {
            kind: Kind::Reclaim,
            cloud: "azure",
            detail: format!(
                "scheduled event {kind} ({status}, not before {})",
                e.get("NotBefore").and_then(|t| t.as_str()).unwrap_or("?")
            ),
        })
    })
}

/// `GET /computeMetadata/v1/instance/preempted`: `TRUE` once the instance is being preempted.
pub fn gcp_preempted(body: &str) -> Option<Notice> {
    (body.trim() == "TRUE").then(|| Notice {
        kind: Kind::Reclaim,
        cloud: "gcp",
        detail: "instance/preempted TRUE".into(),
    })
}

/// `GET /computeMetadata/v1/instance/maintenance-event`: `NONE`, or
/// `TERMINATE_ON_HOST_MAINTENANCE` when the host goes down with the instance on it.
pub fn gcp_maintenance(body: &str) -> Option<Notice> {
    (body.trim() == "TERMINATE_ON_HOST_MAINTENANCE").then(|| Notice {
        kind: Kind::Reclaim,
        cloud: "gcp",
        detail: "maintenance-event TERMINATE_ON_HOST_MAINTENANCE".into(),
    })
}

// --- polling ------------------------------------------------------------------------------

/// Why a poll of the metadata service failed.
#[derive(Debug, thiserror::Error)]
enum NoticeError {
    #[error(transparent)]
    Http(#[from] reqwest::Error),
    #[error("IMDSv2 token: HTTP {0}")]
    TokenStatus(reqwest::StatusCode),
    #[error("IMDSv2 token refused (401)")]
    TokenRefused,
    /// Azure's scheduled events did not answer 200.
    #[error("scheduled events: HTTP {0}")]
    ScheduledEvents(u16),
    /// A GCE metadata entry did not answer 200.
    #[error("{path}: HTTP {status}")]
    Gcp { path: &'static str, status: u16 },
}

/// One cloud's poller with what it keeps between polls.
struct Poller {
    http: reqwest::Client,
    cloud: Source,
    base: String,
    /// IMDSv2's session token.
    aws_token: Option<String>,
    /// This VM's name in Azure's event documents, read once.
    azure_vm: Option<Option<String>>,
    /// EC2's rebalance recommendation is still of use (not told yet).
    want_rebalance: bool,
}

impl Poller {
    async fn get(
        &self,
        url: &str,
        header: Option<(&str, &str)>,
    ) -> Result<(u16, String), NoticeError> {
        let mut req = self.http.get(url);
        if let Some((k, v)) = header {
            req = req.header(k, v);
        }
        let resp = req.send().await?;
        let status = resp.status().as_u16();
        let body = resp.text().await?;
        Ok((status, body))
    }

    async fn aws_token(&mut self) -> Result<String, NoticeError> {
        if let Some(t) = &self.aws_token {
            return Ok(t.clone());
        }
        let resp = self
            .http
            .put(format!("{}/latest/api/token", self.base))
            .header("X-aws-ec2-metadata-token-ttl-seconds", "21600")
            .send()
            .await?;
        if !resp.status().is_success() {
            return Err(NoticeError::TokenStatus(resp.status()));
        }
        let t = resp.text().await?;
        self.aws_token = Some(t.clone());
        Ok(t)
    }

    /// `GET /latest/meta-data/<path>` with IMDSv2's token; a refused token is dropped, so that
    /// the next poll gets a new one.
    async fn aws_get(&mut self, path: &str) -> Result<(u16, String), NoticeError> {
        let token = self.aws_token().await?;
        let url = format!("{}/latest/meta-data/{path}", self.base);
        let (status, body) = self
            .get(&url, Some(("X-aws-ec2-metadata-token", token.as_str())))
            .await?;
        if status == 401 {
            self.aws_token = None;
            return Err(NoticeError::TokenRefused);
        }
        Ok((status, body))
    }

    /// One poll: the notices the service gives now.
    async fn poll(&mut self) -> Result<Vec<Notice>, NoticeError> {
        match self.cloud {
            Source::Aws => {
                let mut out = Vec::new();
                let (status, body) = self.aws_get("spot/instance-action").await?;
                out.extend(aws_instance_action(status, &body));
                if self.want_rebalance {
                    let (status, body) = self.aws_get("events/recommendations/rebalance").await?;
                    out.extend(aws_rebalance(status, &body));
                }
                Ok(out)
            }
            Source::Azure => {
                if self.azure_vm.is_none() {
                    let url = format!(
                        "{}/metadata/instance/compute/name?api-version={AZURE_INSTANCE_API}&format=text",
                        self.base
                    );
                    let name = match self.get(&url, Some(("Metadata", "true"))).await {
                        Ok((200, n)) if !n.trim().is_empty() => Some(n.trim().to_string()),
                        _ => None,
                    };
                    self.azure_vm = Some(name);
                }
                let url = format!(
                    "{}/metadata/scheduledevents?api-version={AZURE_EVENTS_API}",
                    self.base
                );
                let (status, body) = self.get(&url, Some(("Metadata", "true"))).await?;
                if status != 200 {
                    return Err(NoticeError::ScheduledEvents(status));
                }
                let vm = self.azure_vm.clone().flatten();
                Ok(azure_events(&body, vm.as_deref()).into_iter().collect())
            }
            Source::Gcp => {
                let mut out = Vec::new();
                for (path, parse) in [
                    ("preempted", gcp_preempted as fn(&str) -> Option<Notice>),
                    ("maintenance-event", gcp_maintenance),
                ] {
                    let url = format!("{}/computeMetadata/v1/instance/{path}", self.base);
                    let (status, body) =
                        self.get(&url, Some(("Metadata-Flavor", "Google"))).await?;
                    if status != 200 {
                        return Err(NoticeError::Gcp { path, status });
                    }
                    out.extend(parse(&body));
                }
                Ok(out)
            }
            Source::Auto | Source::None => Ok(Vec::new()),
        }
    }
}

fn client() -> reqwest::Client {
    common::install_crypto_provider();
    // Straight to the link-local service: never through an HTTP proxy of the environment.
    reqwest::Client::builder()
        .no_proxy()
        .connect_timeout(Duration::from_secs(1))
        .timeout(Duration::from_secs(2))
        .build()
        .expect("a plain HTTP client")
}

/// Which service answers, for `auto`: an IMDSv2 token (AWS), Azure's instance document, a
/// response that carries `Metadata-Flavor: Google` (GCP).
async fn detect(http: &reqwest::Client, e: &Endpoints) -> Option<Source> {
    let aws = http
        .put(format!("{}/latest/api/token", e.aws))
        .header("X-aws-ec2-metadata-token-ttl-seconds", "60")
        .send()
        .await;
    if aws.is_ok_and(|r| r.status().is_success()) {
        return Some(Source::Aws);
    }
    let azure = http
        .get(format!(
            "{}/metadata/instance?api-version={AZURE_INSTANCE_API}",
            e.azure
        ))
        .header("Metadata", "true")
        .send()
        .await;
    if let Ok(r) = azure {
        if r.status().is_success()
            && r.json::<serde_json::Value>()
                .await
                .is_ok_and(|v| v.get("compute").is_some())
        {
            return Some(Source::Azure);
        }
    }
    let gcp = http
        .get(format!("{}/computeMetadata/v1/", e.gcp))
        .header("Metadata-Flavor", "Google")
        .send()
        .await;
    if gcp.is_ok_and(|r| {
        r.headers()
            .get("Metadata-Flavor")
            .is_some_and(|v| v == "Google")
    }) {
        return Some(Source::Gcp);
    }
    None
}

/// Polls until `stop`, telling `tell` each kind of notice once.
pub async fn watch(w: Watch, tell: impl Fn(Notice) + Send + 'static, stop: CancellationToken) {
    let http = client();
    let cloud = match w.source {
        Source::None => return,
        Source::Auto => {
            let found = tokio::select! {
                f = detect(&http, &w.endpoints) => f,
                _ = stop.cancelled() => return,
            };
            match found {
                Some(c) => {
                    tracing::info!("preemption notice: polling {c:?}'s metadata service");
                    c
                }
                None => {
                    tracing::info!(
                        "preemption notice: no cloud metadata service answered; not polling"
                    );
                    return;
                }
            }
        }
        c => c,
    };
    let base = match cloud {
        Source::Aws => w.endpoints.aws.clone(),
        Source::Azure => w.endpoints.azure.clone(),
        _ => w.endpoints.gcp.clone(),
    };
    let mut p = Poller {
        http,
        cloud,
        base,
        aws_token: None,
        azure_vm: None,
        want_rebalance: true,
    };
    let (mut told_reclaim, mut failing) = (false, false);
    let mut tick = tokio::time::interval(w.period);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    while !told_reclaim {
        tokio::select! {
            _ = tick.tick() => {}
            _ = stop.cancelled() => return,
        }
        match p.poll().await {
            Ok(notices) => {
                if failing {
                    tracing::info!("preemption notice: {cloud:?}'s metadata service answers again");
                    failing = false;
                }
                for n in notices {
                    let first = match n.kind {
                        Kind::Reclaim => !std::mem::replace(&mut told_reclaim, true),
                        Kind::Rebalance => std::mem::replace(&mut p.want_rebalance, false),
                    };
                    if first {
                        tell(n);
                    }
                }
            }
            Err(e) if !failing => {
                tracing::warn!("preemption notice: cannot read {cloud:?}'s metadata service: {e}");
                failing = true;
            }
            Err(e) => tracing::debug!("preemption notice: {e}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn aws_interruption_notice_and_rebalance_recommendation() {
        assert_eq!(aws_instance_action(404, "Not Found"), None);
        let n = aws_instance_action(
            200,
            r#"{"action": "terminate", "time": "2017-09-18T08:22:00Z"}"#,
        )
        .unwrap();
        assert_eq!(n.kind, Kind::Reclaim);
        assert!(n.detail.contains("terminate at 2017-09-18T08:22:00Z"));
        assert!(aws_instance_action(200, r#"{"action":"stop","time":"x"}"#).is_some());
        assert!(aws_instance_action(200, r#"{"action":"hibernate","time":"x"}"#).is_some());
        assert_eq!(aws_instance_action(200, "not json"), None);
        assert_eq!(aws_instance_action(200, r#"{"action":"none"}"#), None);
        assert_eq!(aws_rebalance(404, ""), None);
        let r = aws_rebalance(200, r#"{"noticeTime": "2020-10-27T08:22:00Z"}"#).unwrap();
        assert_eq!(r.kind, Kind::Rebalance);
    }

    const AZURE: &str = r#"{
      "DocumentIncarnation": 2,
      "Events": [
        {"EventId": "A", "EventType": "Freeze", "ResourceType": "VirtualMachine",
         "Resources": ["vm-1"], "EventStatus": "Scheduled", "NotBefore": "Mon, 19 Sep 2016 18:29:47 GMT",
         "Description": "", "EventSource": "Platform", "DurationInSeconds": 5},
        {"EventId": "B", "EventType": "Preempt", "ResourceType": "VirtualMachine",
         "Resources": ["vm-2"], "EventStatus": "Scheduled", "NotBefore": "Mon, 19 Sep 2016 18:30:17 GMT",
         "Description": "", "EventSource": "Platform", "DurationInSeconds": -1}
      ]
    }"#;

    #[test]
    fn azure_preempt_of_this_vm_only() {
        assert_eq!(azure_events(AZURE, Some("vm-1")), None);
        let n = azure_events(AZURE, Some("vm-2")).unwrap();
        assert_eq!(n.kind, Kind::Reclaim);
        assert!(n.detail.contains("Preempt"), "{}", n.detail);
        // Name unknown: any VM's preemption counts.
        assert!(azure_events(AZURE, None).is_some());
        assert_eq!(
            azure_events(r#"{"DocumentIncarnation": 0, "Events": []}"#, None),
            None
        );
        let done = AZURE.replace(
            r#""EventStatus": "Scheduled", "NotBefore": "Mon, 19 Sep 2016 18:30:17"#,
            r#""EventStatus": "Completed", "NotBefore": "Mon, 19 Sep 2016 18:30:17"#,
        );
        assert_eq!(azure_events(&done, Some("vm-2")), None);
        let terminate = AZURE.replace("Preempt", "Terminate");
        assert!(azure_events(&terminate, Some("vm-2")).is_some());
    }

    #[test]
    fn gcp_preempted_and_host_maintenance() {
        assert!(gcp_preempted("TRUE").is_some());
        assert!(gcp_preempted("FALSE").is_none());
        assert!(gcp_maintenance("NONE").is_none());
        assert!(gcp_maintenance("TERMINATE_ON_HOST_MAINTENANCE").is_some());
        assert!(gcp_maintenance("MIGRATE_ON_HOST_MAINTENANCE").is_none());
    }
}
