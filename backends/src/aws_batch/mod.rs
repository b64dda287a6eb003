//! The `aws-batch` backend: one AWS Batch job per worker, on the AWS SDK for Rust.
//!
//! - **Job definition** registered idempotently: an ACTIVE revision of `--job-definition-name`
//!   whose container properties equal ours is reused, else a new revision is registered; jobs
//!   are submitted **by its ARN** (never by name, which races between managers).
//! - **Credentials** reach the worker through the definition's `secrets` (`CODALAB_PASSWORD`
//!   from a Secrets Manager or SSM parameter ARN); only with an explicit opt-in does the
//!   password go into plain `environment`, with a warning.
//! - **Own jobs**: named `<job-definition-name>-<worker id>` and tagged; listed with one
//!   `ListJobs` per tick, filtered on the name prefix (`JOB_NAME`, every status, newest first,
//!   1000 a page, read back only to before the oldest live job), and on `--job-filter`; a job
//!   that left the active states ended as that listing says. Only jobs this process has not
//!   seen yet (adopted) are described, for their shape.
//! - **Submissions** are paced under the SubmitJob quota; throttling and transient errors are
//!   retried by the SDK's standard retry mode; what remains goes to the manager's breaker.

use std::collections::HashMap;
use std::time::Duration;

use aws_sdk_batch::error::ProvideErrorMetadata;
use aws_sdk_batch::types::{
    ContainerOverrides, JobDefinitionType, JobStatus as AwsStatus, KeyValuePair, KeyValuesPair,
};
use tokio::sync::Mutex;
use tokio::time::Instant;

use crate::{Backend, BackendError, JobSpec, JobState, JobStatus, Ledger};

mod args;
mod definition;
mod queue;
pub use args::AwsBatchArgs;
use definition::fingerprint;

/// Tag naming the manager (the job definition name) on every job.
pub const TAG_MANAGER: &str = "codalab-worker-manager";
/// Tag naming the worker shape.
pub const TAG_SHAPE: &str = "codalab-worker-shape";
/// Submissions per second at most (the SubmitJob quota is 50 TPS per account and region).
pub const SUBMITS_PER_SECOND: f64 = 40.0;
/// Statuses of a live job: pending ones, then running.
/// Jobs per ListJobs page asked for. With a filter (ours: `JOB_NAME`) the service returns at
/// most 100 a page whatever is asked (1000 without one); moto returns them all in one.
const LIST_PAGE: i32 = 1000;
/// How far before the oldest live job (or the last listing) a listing reads, for the clocks of
/// this machine and of AWS (milliseconds).
const LIST_MARGIN_MS: i64 = 10 * 60 * 1000;

fn unix_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

/// Where the next listing may stop (`createdAt`, ms): every job live then was live at this
/// listing or is newer than it, and so is every job whose end the next listing must report.
fn next_cutoff(oldest_live: Option<i64>, listed_at: i64) -> i64 {
    oldest_live.map_or(listed_at, |o| o.min(listed_at)) - LIST_MARGIN_MS
}

/// Whether a page whose last (oldest) job was created at `last` ends the listing: the pages
/// come newest first, so every later job is older than the cutoff. The first listing (no
/// cutoff: adoption) reads every page.
fn listed_past(last: Option<i64>, cutoff: Option<i64>) -> bool {
    matches!((last, cutoff), (Some(l), Some(c)) if l < c)
}

/// Settings of the backend (the `aws-batch` flags).
#[derive(Debug, Clone, PartialEq)]
pub struct AwsBatchConfig {
    pub job_queue: String,
    pub job_definition_name: String,
    /// Worker image (`--worker-image`).
    pub image: String,
    /// `containerProperties.user`.
    pub user: String,
    /// Default shape of the definition (each job overrides its own).
    pub cpus: u32,
    pub gpus: u32,
    pub memory_mb: u64,
    /// Regex a job name must fully match to count (`--job-filter`).
    pub job_filter: Option<String>,
    /// `--worker-work-dir-prefix`: the parent of the workers' work dirs, mounted at the same
    /// path (`/tmp` when unset).
    pub work_dir_prefix: Option<String>,
    /// `CODALAB_BUNDLE_MOUNT` with `CODALAB_SHARED_FILE_SYSTEM=true`: the bundle store, mounted
    /// at the same path.
    pub bundle_mount: Option<String>,
    /// CodaLab user of the workers (plain environment; not a secret).
    pub username: String,
    /// ARN of the secret holding the CodaLab password.
    pub password_secret_arn: Option<String>,
    /// The password, only with the explicit plaintext opt-in.
    pub plaintext_password: Option<String>,
    /// IAM role with which ECS starts the worker container and resolves its `secrets`
    /// (`containerProperties.executionRoleArn`).
    pub execution_role_arn: Option<String>,
    /// IAM role the worker container runs with (`containerProperties.jobRoleArn`).
    pub job_role_arn: Option<String>,
}

impl AwsBatchConfig {
    pub fn job_prefix(&self) -> String {
        format!("{}-", self.job_definition_name)
    }

    fn validate(&self) -> Result<Option<regex::Regex>, BackendError> {
        let ok = |s: &str| {
            !s.is_empty()
                && s.chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
        };
        if !ok(&self.job_definition_name) {
            return Err(BackendError::permanent(format!(
                "--job-definition-name {:?}: letters, digits, '-' and '_' only",
                self.job_definition_name
            )));
        }
        // Job names are `<definition>-<16 hex digits>`, at most 128 characters.
        if self.job_definition_name.len() > 128 - 17 {
            return Err(BackendError::permanent(format!(
                "--job-definition-name is {} characters; at most 111 leave room for the job names",
                self.job_definition_name.len()
            )));
        }
        if self.password_secret_arn.is_none() && self.plaintext_password.is_none() {
            return Err(BackendError::permanent(
                "aws-batch needs --password-secret-arn (a Secrets Manager or SSM parameter ARN \
                 holding the CodaLab password), or --allow-plaintext-password",
            ));
        }
        self.job_filter
            .as_deref()
            .map(|f| {
                regex::Regex::new(&format!("^(?:{f})$"))
                    .map_err(|e| BackendError::permanent(format!("--job-filter {f:?}: {e}")))
            })
            .transpose()
    }
}

fn sdk_error<E, R>(what: &str, e: aws_sdk_batch::error::SdkError<E, R>) -> BackendError
where
    E: ProvideErrorMetadata + std::error::Error + Send + Sync + 'static,
    R: std::fmt::Debug + Send + Sync + 'static,
{
    use aws_sdk_batch::error::SdkError;
    let retryable = match &e {
        SdkError::ServiceError(s) => {
            let code = s.err().code().unwrap_or("");
            // ClientException: a request AWS will keep refusing (missing queue, bad input).
            code != "ClientException" && code != "ValidationError"
        }
        _ => true,
    };
    let detail = match &e {
        SdkError::ServiceError(s) => format!(
            "{}: {}",
            s.err().code().unwrap_or("error"),
            s.err().message().unwrap_or("")
        ),
        other => format!("{}", aws_sdk_batch::error::DisplayErrorContext(other)),
    };
    let msg = format!("{what}: {detail}");
    if retryable {
        BackendError::retryable(msg)
    } else {
        BackendError::permanent(msg)
    }
}

/// Runs workers as AWS Batch jobs.
pub struct AwsBatchBackend {
    client: aws_sdk_batch::Client,
    cfg: AwsBatchConfig,
    filter: Option<regex::Regex>,
    definition_arn: Mutex<Option<String>>,
    ledger: Mutex<Ledger>,
    next_submit: Mutex<Instant>,
    /// The `createdAt` (ms) before which the next listing may stop ([`next_cutoff`]).
    listed_after: Mutex<Option<i64>>,
}

/// The SDK's HTTPS client: what its default client is (hyper 1, rustls, the proxy of
/// `HTTPS_PROXY`/`NO_PROXY`), with ring as the crypto provider like the rest of the process.
fn https_client() -> aws_sdk_batch::config::SharedHttpClient {
    use aws_smithy_http_client::proxy::ProxyConfig;
    use aws_smithy_http_client::tls::{rustls_provider::CryptoMode, Provider};
    use aws_smithy_http_client::{Builder, ConnectorBuilder};
    Builder::new().build_with_connector_fn(|settings, components| {
        let mut conn = ConnectorBuilder::default().tls_provider(Provider::Rustls(CryptoMode::Ring));
        conn.set_connector_settings(settings.cloned());
        if let Some(components) = components {
            conn.set_sleep_impl(components.sleep_impl());
        }
        conn.set_proxy_config(Some(ProxyConfig::from_env()));
        conn.build()
    })
}

impl AwsBatchBackend {
    /// A backend with the standard AWS configuration chain (environment, profile, instance
    /// role; `AWS_ENDPOINT_URL[_BATCH]` for custom endpoints) in `region`.
    pub async fn new(cfg: AwsBatchConfig, region: &str) -> Result<Self, BackendError> {
        let filter = cfg.validate()?;
        let conf = aws_config::defaults(aws_config::BehaviorVersion::latest())
            .http_client(https_client())
            .region(aws_config::Region::new(region.to_string()))
            .retry_config(aws_config::retry::RetryConfig::standard().with_max_attempts(4))
            .load()
            .await;
        Ok(Self {
            client: aws_sdk_batch::Client::new(&conf),
            cfg,
            filter,
            definition_arn: Mutex::new(None),
            ledger: Mutex::default(),
            next_submit: Mutex::new(Instant::now()),
            listed_after: Mutex::new(None),
        })
    }

    /// The ARN of an ACTIVE revision equal to ours, registering one if none is.
    pub async fn ensure_job_definition(&self) -> Result<String, BackendError> {
        let mut cached = self.definition_arn.lock().await;
        if let Some(arn) = cached.as_ref() {
            return Ok(arn.clone());
        }
        let ours = self.cfg.container_properties();
        let want = fingerprint(&ours);
        let mut pages = self
            .client
            .describe_job_definitions()
            .job_definition_name(&self.cfg.job_definition_name)
            .status("ACTIVE")
            .into_paginator()
            .send();
        let mut reuse = None;
        while let Some(page) = pages.next().await {
            let page = page.map_err(|e| sdk_error("DescribeJobDefinitions", e))?;
            for d in page.job_definitions() {
                if d.container_properties().map(fingerprint).as_deref() == Some(want.as_str()) {
                    // The newest matching revision.
                    if reuse
                        .as_ref()
                        .is_none_or(|(rev, _)| d.revision().unwrap_or(0) > *rev)
                    {
                        reuse = Some((
                            d.revision().unwrap_or(0),
                            d.job_definition_arn().unwrap_or_default().to_string(),
                        ));
                    }
                }
            }
        }
        let arn = match reuse {
            Some((rev, arn)) => {
                tracing::info!(
                    "reusing job definition {} revision {rev}",
                    self.cfg.job_definition_name
                );
                arn
            }
            None => {
                let out = self
                    .client
                    .register_job_definition()
                    .job_definition_name(&self.cfg.job_definition_name)
                    .r#type(JobDefinitionType::Container)
                    .container_properties(ours)
                    .tags(TAG_MANAGER, &self.cfg.job_definition_name)
                    .send()
                    .await
                    .map_err(|e| sdk_error("RegisterJobDefinition", e))?;
                tracing::info!(
                    "registered job definition {} revision {}",
                    out.job_definition_name().unwrap_or_default(),
                    out.revision().unwrap_or(0)
                );
                out.job_definition_arn().unwrap_or_default().to_string()
            }
        };
        *cached = Some(arn.clone());
        Ok(arn)
    }

    fn is_ours(&self, name: &str) -> bool {
        name.starts_with(&self.cfg.job_prefix())
            && self.filter.as_ref().is_none_or(|f| f.is_match(name))
    }

    /// Waits for this submission's slot under [`SUBMITS_PER_SECOND`]. A hand-written pacer of
    /// a few lines: the only rate limit needed, so no rate-limiting crate is pulled in.
    async fn pace(&self) {
        let slot = {
            let mut next = self.next_submit.lock().await;
            let now = Instant::now();
            let slot = (*next).max(now);
            *next = slot + Duration::from_secs_f64(1.0 / SUBMITS_PER_SECOND);
            slot
        };
        tokio::time::sleep_until(slot).await;
    }
}

fn state_of(s: &AwsStatus) -> JobState {
    match s {
        AwsStatus::Running => JobState::Running,
        AwsStatus::Succeeded => JobState::Finished { success: true },
        AwsStatus::Failed => JobState::Finished { success: false },
        _ => JobState::Pending,
    }
}

impl Backend for AwsBatchBackend {
    fn name(&self) -> &str {
        "aws-batch"
    }

    async fn submit(&self, spec: &JobSpec) -> Result<String, BackendError> {
        let definition = self.ensure_job_definition().await?;
        let name = format!("{}{}", self.cfg.job_prefix(), spec.worker_id);
        let overrides = ContainerOverrides::builder()
            .set_command(Some(spec.command.clone()))
            .set_resource_requirements(Some(AwsBatchConfig::resources(
                spec.resources.cpus,
                spec.resources.gpus,
                spec.resources.memory_bytes >> 20,
            )))
            .set_environment(Some(
                spec.env
                    .iter()
                    .map(|(k, v)| KeyValuePair::builder().name(k).value(v).build())
                    .collect(),
            ))
            .build();
        self.pace().await;
        let out = self
            .client
            .submit_job()
            .job_name(&name)
            .job_queue(&self.cfg.job_queue)
            .job_definition(&definition)
            .container_overrides(overrides)
            .tags(TAG_MANAGER, &self.cfg.job_definition_name)
            .tags(TAG_SHAPE, &spec.shape_name)
            .send()
            .await
            .map_err(|e| sdk_error("SubmitJob", e));
        let out = match out {
            Ok(out) => out,
            Err(e) => {
                if e.to_string().contains("definition") {
                    // Deregistered or deleted behind our back: look it up (or register it)
                    // again at the next submission.
                    *self.definition_arn.lock().await = None;
                }
                return Err(e);
            }
        };
        let id = out.job_id().unwrap_or_default().to_string();
        if id.is_empty() {
            return Err(BackendError::retryable("SubmitJob returned no job id"));
        }
        self.ledger
            .lock()
            .await
            .submitted(&id, &spec.worker_id, &spec.shape_name);
        Ok(id)
    }

    async fn list(&self) -> Result<Vec<JobStatus>, BackendError> {
        let prefix = self.cfg.job_prefix();
        let started = unix_ms();
        let cutoff = *self.listed_after.lock().await;
        // One listing of every status: with a filter, ListJobs ignores jobStatus and gives
        // the queue's jobs of that name newest first, the ended ones with their reason.
        let mut pages = self
            .client
            .list_jobs()
            .job_queue(&self.cfg.job_queue)
            .filters(
                KeyValuesPair::builder()
                    .name("JOB_NAME")
                    .values(format!("{prefix}*"))
                    .build(),
            )
            .max_results(LIST_PAGE)
            .into_paginator()
            .send();
        let mut live = Vec::new();
        let mut ended: HashMap<String, (JobState, String)> = HashMap::new();
        let mut oldest_live: Option<i64> = None;
        while let Some(page) = pages.next().await {
            let page = page.map_err(|e| sdk_error("ListJobs", e))?;
            let jobs = page.job_summary_list();
            for j in jobs {
                let (Some(id), Some(name), Some(status)) = (j.job_id(), j.job_name(), j.status())
                else {
                    continue;
                };
                if !self.is_ours(name) {
                    continue;
                }
                match state_of(status) {
                    state @ JobState::Finished { .. } => {
                        let reason = j.status_reason().unwrap_or("").to_string();
                        ended.insert(id.to_string(), (state, reason));
                    }
                    _ => {
                        let created = j.created_at().unwrap_or(started);
                        oldest_live = Some(oldest_live.map_or(created, |o| o.min(created)));
                        live.push((id.to_string(), name.to_string(), status.clone()));
                    }
                }
            }
            if listed_past(jobs.last().and_then(|j| j.created_at()), cutoff) {
                break;
            }
        }
        *self.listed_after.lock().await = Some(next_cutoff(oldest_live, started));
        let mut ledger = self.ledger.lock().await;
        // Shapes of live jobs this process has not seen yet (adopted): DescribeJobs, 100 each.
        let unknown: Vec<String> = live
            .iter()
            .filter(|(id, _, _)| !ledger.is_known(id))
            .map(|(id, _, _)| id.clone())
            .collect();
        let mut shapes = HashMap::new();
        for chunk in unknown.chunks(100) {
            let out = self
                .client
                .describe_jobs()
                .set_jobs(Some(chunk.to_vec()))
                .send()
                .await
                .map_err(|e| sdk_error("DescribeJobs", e))?;
            for d in out.jobs() {
                let shape = d
                    .tags()
                    .and_then(|t| t.get(TAG_SHAPE))
                    .cloned()
                    .unwrap_or_default();
                shapes.insert(d.job_id().unwrap_or_default().to_string(), shape);
            }
        }
        let listing = live
            .into_iter()
            .map(|(id, name, status)| JobStatus {
                worker_id: name.strip_prefix(&prefix).unwrap_or(&name).to_string(),
                shape_name: shapes.remove(&id).unwrap_or_default(),
                state: state_of(&status),
                detail: None,
                id,
            })
            .collect();
        // Jobs that left the active states ended as the same listing says; one it no longer
        // holds (deleted, expired) ended unknown.
        Ok(ledger.observe(listing).resolve(|id| {
            let (state, reason) = ended.get(id)?;
            if !reason.is_empty() {
                tracing::info!("job {id} ended: {reason}");
            }
            Some(*state)
        }))
    }

    async fn cancel(&self, id: &str) -> Result<(), BackendError> {
        self.client
            .terminate_job()
            .job_id(id)
            .reason("cl-worker-manager: no staged bundle needs this worker")
            .send()
            .await
            .map_err(|e| sdk_error("TerminateJob", e))?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::definition::tests::cfg;
    use super::*;

    #[test]
    fn credentials_are_required_and_filters_checked() {
        let mut c = cfg();
        c.password_secret_arn = None;
        assert!(c.validate().is_err());
        c.plaintext_password = Some("pw".into());
        assert!(c.validate().is_ok());
        let p = c.container_properties();
        assert!(p.secrets().is_empty());
        let mut c = cfg();
        c.job_filter = Some("codalab-worker-[a-f0-9]+".into());
        let re = c.validate().unwrap().unwrap();
        assert!(re.is_match("codalab-worker-abc1"));
        assert!(!re.is_match("xcodalab-worker-abc1"));
        c.job_filter = Some("(".into());
        assert!(c.validate().is_err());
        c.job_filter = None;
        c.job_definition_name = "bad name".into();
        assert!(c.validate().is_err());
        // Room for `-<16 hex digits>` in a 128-character job name.
        c.job_definition_name = "a".repeat(111);
        assert!(c.validate().is_ok());
        c.job_definition_name = "a".repeat(112);
        assert!(c.validate().is_err());
    }

    #[test]
    fn a_listing_reads_back_to_before_the_oldest_live_job() {
        // The first listing (adoption) reads every page.
        assert!(!listed_past(Some(0), None));
        let cut = next_cutoff(Some(1_000_000), 2_000_000);
        assert_eq!(cut, 1_000_000 - LIST_MARGIN_MS);
        // No live job: back to the last listing.
        assert_eq!(next_cutoff(None, 2_000_000), 2_000_000 - LIST_MARGIN_MS);
        assert!(!listed_past(Some(cut), Some(cut)));
        assert!(listed_past(Some(cut - 1), Some(cut)));
        // A page without times goes on.
        assert!(!listed_past(None, Some(cut)));
    }

    #[test]
    fn statuses_map_to_job_states() {
        assert_eq!(state_of(&AwsStatus::Runnable), JobState::Pending);
        assert_eq!(state_of(&AwsStatus::Running), JobState::Running);
        assert_eq!(
            state_of(&AwsStatus::Failed),
            JobState::Finished { success: false }
        );
    }
}
