//! The `aws-batch` flags and the builder of an [`AwsBatchBackend`]: its pre-flight look-up of
//! the job definition, and the credentials that reach the workers through it.

use clap::Args;

use super::{AwsBatchBackend, AwsBatchConfig};
use crate::{BackendArgs, BuildContext, BuildError, ShapeArgs, WorkerProfile};

/// Flags of the `aws-batch` backend (Python's, plus the image and the password secret).
#[derive(Debug, Clone, Args)]
pub struct AwsBatchArgs {
    /// AWS region of the Batch client.
    #[arg(long, default_value = "us-east-1")]
    pub region: String,
    /// Name of the job definition (registered if no equal ACTIVE revision exists); also the
    /// prefix of the job names.
    #[arg(long, default_value = "codalab-worker")]
    pub job_definition_name: String,
    #[command(flatten)]
    pub shape: ShapeArgs,
    /// User the worker container runs as.
    #[arg(long, default_value = "root")]
    pub user: String,
    /// Job queue to submit to and list.
    #[arg(long, default_value = "codalab-batch-cpu")]
    pub job_queue: String,
    /// Regex a job name must fully match to count as this manager's.
    #[arg(long)]
    pub job_filter: Option<String>,
    /// Worker image (default `codalab/worker:$CODALAB_VERSION`, `latest` without it).
    #[arg(long)]
    pub worker_image: Option<String>,
    /// ARN of a Secrets Manager secret or SSM parameter holding the CodaLab password; it
    /// reaches the worker as `CODALAB_PASSWORD` through the job definition's `secrets`.
    #[arg(long, env = "CL_WORKER_MANAGER_PASSWORD_SECRET_ARN")]
    pub password_secret_arn: Option<String>,
    /// Put the password in the job definition's plain environment instead (Python's way;
    /// visible to anyone who can describe the definition).
    #[arg(long)]
    pub allow_plaintext_password: bool,
    /// IAM role ECS uses to start the worker container and to read `--password-secret-arn`
    /// (the job definition's `executionRoleArn`; AWS needs one to resolve secrets).
    #[arg(long)]
    pub execution_role_arn: Option<String>,
    /// IAM role the worker container runs with (the job definition's `jobRoleArn`).
    #[arg(long)]
    pub job_role_arn: Option<String>,
}

impl BackendArgs for AwsBatchArgs {
    type Backend = AwsBatchBackend;

    fn shape(&self) -> &ShapeArgs {
        &self.shape
    }

    /// Workers in `<prefix>/cl_worker_<id>_work_dir` (Python's), handing their runs back on
    /// SIGTERM (spot reclaims, TerminateJob); credentials through the job definition.
    async fn build(
        &self,
        cx: &BuildContext<'_>,
    ) -> Result<(AwsBatchBackend, WorkerProfile), BuildError> {
        let image = crate::profile::worker_image(self.worker_image.as_deref());
        let plaintext = self.password_secret_arn.is_none() && self.allow_plaintext_password;
        if self.password_secret_arn.is_some() && self.execution_role_arn.is_none() {
            tracing::warn!(
                "--password-secret-arn without --execution-role-arn: AWS Batch resolves a job \
                 definition's secrets with its execution role, so on AWS the workers cannot \
                 start without one"
            );
        }
        if plaintext {
            tracing::warn!(
                "--allow-plaintext-password: the CodaLab password goes into the job definition's \
                 plain environment, readable by anyone allowed to describe it; prefer \
                 --password-secret-arn"
            );
        }
        let cfg = AwsBatchConfig {
            job_queue: self.job_queue.clone(),
            job_definition_name: self.job_definition_name.clone(),
            image,
            user: self.user.clone(),
            cpus: self.shape.cpus,
            gpus: self.shape.gpus,
            memory_mb: self.shape.memory_mb,
            job_filter: self.job_filter.clone(),
            work_dir_prefix: cx.work_dir_prefix.map(str::to_string),
            bundle_mount: crate::profile::shared_bundle_mount(),
            username: cx.username.to_string(),
            password_secret_arn: self.password_secret_arn.clone(),
            plaintext_password: plaintext.then(|| cx.password.to_string()),
            execution_role_arn: self.execution_role_arn.clone(),
            job_role_arn: self.job_role_arn.clone(),
        };
        let backend = AwsBatchBackend::new(cfg, &self.region).await?;
        // Early, so that a permission or configuration problem shows at start-up; a failure
        // here is retried at the first submission.
        if let Err(e) = backend.ensure_job_definition().await {
            tracing::warn!("job definition {}: {e}", self.job_definition_name);
        }
        let prefix = cx.work_dir_prefix.unwrap_or("/tmp").to_string();
        let cache_prefix = prefix.clone();
        let mut profile = WorkerProfile::new(Box::new(move |id| {
            format!("{prefix}/cl_worker_{id}_work_dir")
        }));
        // On the work dirs' parent, which the job definition mounts (the Terraform module's
        // EFS with a prefix): the next worker finds what an earlier one downloaded.
        profile.dependency_cache_dir = Some(format!("{cache_prefix}/cl_worker_dependency_cache"));
        profile.extra_args = vec!["--pass-down-termination".into()];
        // A reclaimed spot worker hands its runs back, as with CodaLab's job command (its
        // spot-interruption watcher runs in every worker job).
        profile.default_preemption_notice = Some("aws");
        if std::env::var("CODALAB_SHARED_FILE_SYSTEM").is_ok_and(|v| v == "true") {
            profile.extra_args.push("--shared-file-system".into());
        }
        // Bundles asking for GPUs get GPU jobs where the queue can launch GPU instances (the
        // workers of a shape without GPUs offer none: `--gpuset NONE`).
        match backend.queue_instance_types().await {
            Ok(types) => {
                if let Some(t) = types.iter().find(|t| super::queue::gpu_instance_type(t)) {
                    let why = format!(
                        "job queue {}'s compute environments launch GPU instances ({t})",
                        self.job_queue
                    );
                    profile.extra_shapes = crate::profile::gpu_shape(cx.shapes, &why)
                        .into_iter()
                        .collect();
                }
            }
            Err(e) => tracing::warn!(
                "cannot tell whether job queue {} launches GPU instances ({e}): bundles asking \
                 for GPUs are served only by the shapes with GPUs",
                self.job_queue
            ),
        }
        Ok((backend, profile))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::parse_args;

    #[test]
    fn pythons_defaults() {
        let a: AwsBatchArgs = parse_args(&[]).unwrap();
        assert_eq!(
            (
                a.region.as_str(),
                a.job_definition_name.as_str(),
                a.job_queue.as_str()
            ),
            ("us-east-1", "codalab-worker", "codalab-batch-cpu")
        );
        assert_eq!(
            (
                a.shape.cpus,
                a.shape.gpus,
                a.shape.memory_mb,
                a.user.as_str()
            ),
            (1, 0, 2048, "root")
        );
    }
}
