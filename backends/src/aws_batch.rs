//! The `aws-batch` backend: one AWS Batch job per worker, on the AWS SDK for Rust.
//!
//! - **Job definition** registered idempotently: an ACTIVE revision of `--job-definition-name`
//!   whose container properties equal ours is reused, else a new revision is registered; jobs
//!   are submitted **by its ARN** (never by name, which races between managers).
//! - **Credentials** reach the worker through the definition's `secrets` (`CODALAB_PASSWORD`
//!   from a Secrets Manager or SSM parameter ARN); only with an explicit opt-in does the
//!   password go into plain `environment`, with a warning.
//! - **Own jobs**: named `<job-definition-name>-<worker id>` and tagged; listed with one
//!   paginated `ListJobs` per active status per tick and filtered on the name prefix (and
//!   `--job-filter`); a job that left the active states is described once (batched) to log how
//!   it ended.
//! - **Submissions** are paced under the SubmitJob quota; throttling and transient errors are
//!   retried by the SDK's standard retry mode; what remains goes to the manager's breaker.

use std::collections::{BTreeSet, HashMap};
use std::time::Duration;

use aws_sdk_batch::error::ProvideErrorMetadata;
use aws_sdk_batch::types::{
    ContainerOverrides, ContainerProperties, Host, JobDefinitionType, JobStatus as AwsStatus,
    KeyValuePair, MountPoint, ResourceRequirement, ResourceType, Secret, Volume,
};
use tokio::sync::Mutex;
use tokio::time::Instant;

use crate::{Backend, BackendError, JobSpec, JobState, JobStatus};

/// Tag naming the manager (the job definition name) on every job.
pub const TAG_MANAGER: &str = "codalab-worker-manager";
/// Tag naming the worker shape.
pub const TAG_SHAPE: &str = "codalab-worker-shape";
/// Submissions per second at most (the SubmitJob quota is 50 TPS per account and region).
pub const SUBMITS_PER_SECOND: f64 = 40.0;
/// Statuses of a live job: pending ones, then running.
const ACTIVE: [AwsStatus; 5] = [
    AwsStatus::Submitted,
    AwsStatus::Pending,
    AwsStatus::Runnable,
    AwsStatus::Starting,
    AwsStatus::Running,
];

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
    /// Host path mounted at the same path (the workers' work dirs), if any.
    pub work_dir_prefix: Option<String>,
    /// CodaLab user of the workers (plain environment; not a secret).
    pub username: String,
    /// ARN of the secret holding the CodaLab password.
    pub password_secret_arn: Option<String>,
    /// The password, only with the explicit plaintext opt-in.
    pub plaintext_password: Option<String>,
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

    fn resources(cpus: u32, gpus: u32, memory_mb: u64) -> Vec<ResourceRequirement> {
        let mut r = vec![
            ResourceRequirement::builder()
                .r#type(ResourceType::Vcpu)
                .value(cpus.max(1).to_string())
                .build(),
            ResourceRequirement::builder()
                .r#type(ResourceType::Memory)
                .value(memory_mb.max(4).to_string())
                .build(),
        ];
        if gpus > 0 {
            r.push(
                ResourceRequirement::builder()
                    .r#type(ResourceType::Gpu)
                    .value(gpus.to_string())
                    .build(),
            );
        }
        r
    }

    /// The container properties of the job definition.
    pub fn container_properties(&self) -> ContainerProperties {
        let mut volumes = vec![Volume::builder()
            .name("docker-socket")
            .host(Host::builder().source_path("/var/run/docker.sock").build())
            .build()];
        let mut mounts = vec![MountPoint::builder()
            .source_volume("docker-socket")
            .container_path("/var/run/docker.sock")
            .read_only(false)
            .build()];
        if let Some(p) = &self.work_dir_prefix {
            // Same path inside and outside: the worker hands it to Docker for bundle mounts.
            volumes.push(
                Volume::builder()
                    .name("work-dir")
                    .host(Host::builder().source_path(p).build())
                    .build(),
            );
            mounts.push(
                MountPoint::builder()
                    .source_volume("work-dir")
                    .container_path(p)
                    .read_only(false)
                    .build(),
            );
        }
        let mut env = vec![KeyValuePair::builder()
            .name("CODALAB_USERNAME")
            .value(&self.username)
            .build()];
        let mut secrets = Vec::new();
        match (&self.password_secret_arn, &self.plaintext_password) {
            (Some(arn), _) => secrets.push(
                Secret::builder()
                    .name("CODALAB_PASSWORD")
                    .value_from(arn)
                    .build(),
            ),
            (None, Some(pw)) => env.push(
                KeyValuePair::builder()
                    .name("CODALAB_PASSWORD")
                    .value(pw)
                    .build(),
            ),
            (None, None) => {}
        }
        ContainerProperties::builder()
            .image(&self.image)
            .user(&self.user)
            .set_resource_requirements(Some(Self::resources(self.cpus, self.gpus, self.memory_mb)))
            .set_volumes(Some(volumes))
            .set_mount_points(Some(mounts))
            .set_environment(Some(env))
            .set_secrets(Some(secrets))
            .build()
    }
}

/// The parts of container properties that decide whether a revision can be reused, in a
/// comparable form (order-insensitive where AWS does not care about order).
fn fingerprint(p: &ContainerProperties) -> String {
    let set = |v: Vec<String>| v.into_iter().collect::<BTreeSet<_>>();
    let res = set(p
        .resource_requirements()
        .iter()
        .map(|r| {
            format!(
                "{}={}",
                r.r#type().map_or("", |t| t.as_str()),
                r.value().unwrap_or("")
            )
        })
        .collect());
    let env = set(p
        .environment()
        .iter()
        .map(|e| format!("{}={}", e.name().unwrap_or(""), e.value().unwrap_or("")))
        .collect());
    let secrets = set(p
        .secrets()
        .iter()
        .map(|s| {
            format!(
                "{}={}",
                s.name().unwrap_or(""),
                s.value_from().unwrap_or("")
            )
        })
        .collect());
    let volumes = set(p
        .volumes()
        .iter()
        .map(|v| {
            format!(
                "{}={}",
                v.name().unwrap_or(""),
                v.host().and_then(|h| h.source_path()).unwrap_or("")
            )
        })
        .collect());
    let mounts = set(p
        .mount_points()
        .iter()
        .map(|m| {
            // An unset readOnly is AWS's default, false.
            format!(
                "{}={}:{}",
                m.source_volume().unwrap_or(""),
                m.container_path().unwrap_or(""),
                if m.read_only().unwrap_or(false) {
                    "ro"
                } else {
                    "rw"
                }
            )
        })
        .collect());
    format!(
        "image={:?} user={:?} res={res:?} env={env:?} secrets={secrets:?} volumes={volumes:?} mounts={mounts:?}",
        p.image().unwrap_or(""),
        p.user().unwrap_or(""),
    )
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

#[derive(Debug, Default)]
struct Tracking {
    /// Live jobs by id: (worker id, shape).
    known: HashMap<String, (String, String)>,
}

/// Runs workers as AWS Batch jobs.
pub struct AwsBatchBackend {
    client: aws_sdk_batch::Client,
    cfg: AwsBatchConfig,
    filter: Option<regex::Regex>,
    definition_arn: Mutex<Option<String>>,
    tracking: Mutex<Tracking>,
    next_submit: Mutex<Instant>,
}

impl AwsBatchBackend {
    /// A backend with the standard AWS configuration chain (environment, profile, instance
    /// role; `AWS_ENDPOINT_URL[_BATCH]` for custom endpoints) in `region`.
    pub async fn new(cfg: AwsBatchConfig, region: &str) -> Result<Self, BackendError> {
        let filter = cfg.validate()?;
        let conf = aws_config::defaults(aws_config::BehaviorVersion::latest())
            .region(aws_config::Region::new(region.to_string()))
            .retry_config(aws_config::retry::RetryConfig::standard().with_max_attempts(4))
            .load()
            .await;
        Ok(Self {
            client: aws_sdk_batch::Client::new(&conf),
            cfg,
            filter,
            definition_arn: Mutex::new(None),
            tracking: Mutex::default(),
            next_submit: Mutex::new(Instant::now()),
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
                spec.cpus,
                spec.gpus,
                spec.memory_bytes >> 20,
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
        self.tracking.lock().await.known.insert(
            id.clone(),
            (spec.worker_id.clone(), spec.shape_name.clone()),
        );
        Ok(id)
    }

    async fn list(&self) -> Result<Vec<JobStatus>, BackendError> {
        let prefix = self.cfg.job_prefix();
        let mut live = Vec::new();
        for status in ACTIVE {
            let mut pages = self
                .client
                .list_jobs()
                .job_queue(&self.cfg.job_queue)
                .job_status(status.clone())
                .into_paginator()
                .send();
            while let Some(page) = pages.next().await {
                let page = page.map_err(|e| sdk_error("ListJobs", e))?;
                for j in page.job_summary_list() {
                    let (Some(id), Some(name)) = (j.job_id(), j.job_name()) else {
                        continue;
                    };
                    if self.is_ours(name) {
                        let status = j.status().cloned().unwrap_or(status.clone());
                        live.push((id.to_string(), name.to_string(), status));
                    }
                }
            }
        }
        let mut tracking = self.tracking.lock().await;
        // Shapes of jobs this process has not seen yet (adopted): one DescribeJobs call.
        let unknown: Vec<String> = live
            .iter()
            .filter(|(id, _, _)| !tracking.known.contains_key(id))
            .map(|(id, _, _)| id.clone())
            .collect();
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
                let name = d.job_name().unwrap_or_default();
                let worker = name.strip_prefix(&prefix).unwrap_or(name).to_string();
                tracking
                    .known
                    .insert(d.job_id().unwrap_or_default().to_string(), (worker, shape));
            }
        }
        let mut statuses = Vec::new();
        let live_ids: BTreeSet<&str> = live.iter().map(|(id, _, _)| id.as_str()).collect();
        for (id, name, status) in &live {
            let (worker, shape) = tracking.known.get(id).cloned().unwrap_or_else(|| {
                (
                    name.strip_prefix(&prefix).unwrap_or(name).to_string(),
                    String::new(),
                )
            });
            statuses.push(JobStatus {
                id: id.clone(),
                worker_id: worker,
                shape_name: shape,
                state: state_of(status),
            });
        }
        // Jobs that left the active states: how did they end?
        let gone: Vec<String> = tracking
            .known
            .keys()
            .filter(|id| !live_ids.contains(id.as_str()))
            .cloned()
            .collect();
        for chunk in gone.chunks(100) {
            let ended: HashMap<String, (JobState, String)> = match self
                .client
                .describe_jobs()
                .set_jobs(Some(chunk.to_vec()))
                .send()
                .await
            {
                Ok(out) => out
                    .jobs()
                    .iter()
                    .map(|d| {
                        (
                            d.job_id().unwrap_or_default().to_string(),
                            (
                                d.status()
                                    .map_or(JobState::Finished { success: false }, state_of),
                                d.status_reason().unwrap_or("").to_string(),
                            ),
                        )
                    })
                    .collect(),
                Err(e) => {
                    tracing::info!(
                        "cannot describe ended jobs: {}",
                        sdk_error("DescribeJobs", e)
                    );
                    HashMap::new()
                }
            };
            for id in chunk {
                if let Some((worker, shape)) = tracking.known.remove(id) {
                    let (state, reason) = ended
                        .get(id)
                        .cloned()
                        .unwrap_or((JobState::Finished { success: false }, String::new()));
                    let state = match state {
                        f @ JobState::Finished { .. } => f,
                        // Described as live but not listed: it left our queue.
                        _ => JobState::Finished { success: false },
                    };
                    if !reason.is_empty() {
                        tracing::info!("job {id} ended: {reason}");
                    }
                    statuses.push(JobStatus {
                        id: id.clone(),
                        worker_id: worker,
                        shape_name: shape,
                        state,
                    });
                }
            }
        }
        Ok(statuses)
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
    use super::*;

    fn cfg() -> AwsBatchConfig {
        AwsBatchConfig {
            job_queue: "q".into(),
            job_definition_name: "codalab-worker".into(),
            image: "codalab/worker:latest".into(),
            user: "root".into(),
            cpus: 2,
            gpus: 1,
            memory_mb: 4096,
            job_filter: None,
            work_dir_prefix: Some("/efs/cl".into()),
            username: "codalab".into(),
            password_secret_arn: Some("arn:aws:secretsmanager:us-east-1:1:secret:pw".into()),
            plaintext_password: None,
        }
    }

    #[test]
    fn definition_uses_secrets_and_mounts() {
        let p = cfg().container_properties();
        assert_eq!(p.secrets().len(), 1);
        assert_eq!(p.secrets()[0].name(), Some("CODALAB_PASSWORD"));
        assert!(p
            .environment()
            .iter()
            .all(|e| e.name() != Some("CODALAB_PASSWORD")));
        let mounts: Vec<_> = p
            .mount_points()
            .iter()
            .map(|m| m.container_path().unwrap())
            .collect();
        assert_eq!(mounts, ["/var/run/docker.sock", "/efs/cl"]);
        let f = fingerprint(&p);
        assert!(
            f.contains("GPU=1") && f.contains("VCPU=2") && f.contains("MEMORY=4096"),
            "{f}"
        );
        // Order-insensitive: the same properties in another order are the same revision.
        let mut q = p.clone();
        q.resource_requirements = q.resource_requirements.map(|mut r| {
            r.reverse();
            r
        });
        assert_eq!(fingerprint(&q), f);
        let mut c = cfg();
        c.image = "other".into();
        assert_ne!(fingerprint(&c.container_properties()), f);
        // Mounts say readOnly=false outright (moto needs the field); a definition registered
        // without it is the same, a read-only mount is not.
        assert!(p
            .mount_points()
            .iter()
            .all(|m| m.read_only() == Some(false)));
        let with_ro = |ro: Option<bool>| {
            let mut q = p.clone();
            q.mount_points = q.mount_points.map(|ms| {
                ms.into_iter()
                    .map(|mut m| {
                        m.read_only = ro;
                        m
                    })
                    .collect()
            });
            fingerprint(&q)
        };
        assert_eq!(with_ro(None), f);
        assert_ne!(with_ro(Some(true)), f);
    }

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
    fn statuses_map_to_job_states() {
        assert_eq!(state_of(&AwsStatus::Runnable), JobState::Pending);
        assert_eq!(state_of(&AwsStatus::Running), JobState::Running);
        assert_eq!(
            state_of(&AwsStatus::Failed),
            JobState::Finished { success: false }
        );
    }
}
