//! The `azure-batch` flags and the builder of an [`AzureBatchBackend`]: how it authenticates
//! (SharedKey from a file, the environment or the command line; else Microsoft Entra ID), where
//! the workers' credentials file is, and the pre-flight look-up of the job.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use azure_core::credentials::{Secret, TokenCredential};
use clap::Args;

use super::client::{transport, Auth, BatchClient, FileTokenCredential};
use super::{redact_url, AzureBatchBackend, AzureBatchConfig};
use crate::{write_password_file, BackendArgs, BuildContext, BuildError, ShapeArgs, WorkerProfile};

/// Environment variable holding the account key (keeps it out of argv).
pub const KEY_ENV: &str = "AZURE_BATCH_ACCOUNT_KEY";

/// Flags of the `azure-batch` backend: Python's, plus safer ways to pass the key, Microsoft
/// Entra ID, the image, the pool to report and the credentials file.
#[derive(Debug, Clone, Args)]
pub struct AzureBatchArgs {
    /// Batch account name (SharedKey authentication).
    #[arg(long, env = "AZURE_BATCH_ACCOUNT_NAME")]
    pub account_name: Option<String>,
    /// Batch account key. Visible to every user of the machine in `ps`: prefer
    /// --account-key-file or AZURE_BATCH_ACCOUNT_KEY. Without any key, Microsoft Entra ID is
    /// used.
    #[arg(long)]
    pub account_key: Option<String>,
    /// File holding the Batch account key (mode 600: refused when group or others may read
    /// it).
    #[arg(long)]
    pub account_key_file: Option<PathBuf>,
    /// Batch account URL (`https://<account>.<region>.batch.azure.com`).
    #[arg(long, env = "AZURE_BATCH_ACCOUNT_URL")]
    pub service_url: String,
    /// Blob container URL with a SAS allowing writes, where each task's stdout.txt and
    /// stderr.txt are uploaded under `<task id>/` (the SAS is never logged).
    #[arg(long, env = "AZURE_BATCH_LOG_CONTAINER_URL", hide_env_values = true)]
    pub log_container_url: String,
    /// Resource id of a user-assigned identity of the pool that may write to the log container
    /// (then --log-container-url needs no SAS).
    #[arg(long)]
    pub log_container_identity: Option<String>,
    /// The Batch job (bound to a pool) that tasks are added to.
    #[arg(long)]
    pub job_id: String,
    /// The job's pool: its allocation state and node counts are reported in /status and
    /// /metrics.
    #[arg(long)]
    pub pool_id: Option<String>,
    /// Remove the pool's nodes that stay `unusable` or `starttaskfailed` for this many seconds
    /// (`terminate`: what runs on them ends, new workers start elsewhere), with --pool-id; 0:
    /// report them only.
    #[arg(
        long,
        default_value_t = 600,
        value_name = "SECONDS",
        requires = "pool_id"
    )]
    pub remove_unhealthy_nodes_after: u64,
    #[command(flatten)]
    pub shape: ShapeArgs,
    /// User the worker container runs as (`docker run --user`).
    #[arg(long, default_value = "root")]
    pub user: String,
    /// Worker image (default `codalab/worker:$CODALAB_VERSION`, `latest` without it).
    #[arg(long)]
    pub worker_image: Option<String>,
    /// Start of every task id; managers sharing one job need different ones.
    #[arg(long, default_value = "cl_worker_")]
    pub task_id_prefix: String,
    /// CodaLab credentials file (username, password; mode 600) at the same path on this
    /// machine and on the pool's nodes, best on each machine's own disk. Default: written to
    /// `<--worker-work-dir-prefix>/.worker-password`, on the share (with a warning).
    #[arg(long)]
    pub password_file: Option<PathBuf>,
    /// Put the password in every task's environment settings instead (visible to anyone who
    /// can read the job's tasks).
    #[arg(long)]
    pub allow_plaintext_password: bool,
    /// Microsoft Entra ID: read a Batch access token from this file before every request
    /// (refreshed by another process). Default without a key: workload identity, a client
    /// secret from the environment, the Azure CLI or a managed identity.
    #[arg(long)]
    pub access_token_file: Option<PathBuf>,
}

impl AzureBatchArgs {
    /// The account key: `--account-key-file`, `--account-key` (warned about), then the
    /// environment; `None` for Entra ID.
    pub(super) fn account_key(&self) -> Result<Option<Secret>, BuildError> {
        if let Some(path) = &self.account_key_file {
            return read_account_key_file(path).map(Some);
        }
        if let Some(key) = &self.account_key {
            tracing::warn!(
                "--account-key on the command line is visible to every user of this machine \
                 (ps, /proc); prefer --account-key-file or {KEY_ENV}"
            );
            return Ok(Some(Secret::new(key.clone())));
        }
        Ok(std::env::var(KEY_ENV)
            .ok()
            .filter(|k| !k.trim().is_empty())
            .map(|k| Secret::new(k.trim().to_string())))
    }

    /// How requests are authorized, and a line naming it for the log.
    fn auth(&self, transport: &reqwest::Client) -> Result<(Auth, String), BuildError> {
        if let Some(key) = self.account_key()? {
            let account = self.account_name.clone().ok_or_else(|| {
                BuildError::Preflight("--account-name is needed with an account key".into())
            })?;
            let what = format!("SharedKey of account {account}");
            return Ok((Auth::SharedKey { account, key }, what));
        }
        let (credential, what) = entra_credential(self.access_token_file.as_deref(), transport)?;
        Ok((
            Auth::Token(credential),
            format!("Microsoft Entra ID ({what})"),
        ))
    }
}

/// Reads `--account-key-file`: a key is a credential like the CodaLab password, so the file is
/// refused, as a password file is, when any group or other permission bit is set, and when it
/// holds no key. No message shows the file's content.
pub(super) fn read_account_key_file(path: &Path) -> Result<Secret, BuildError> {
    let shown = path.display();
    let unreadable =
        |e: std::io::Error| BuildError::Preflight(format!("--account-key-file {shown}: {e}"));
    if let Some(mode) = protocol::auth::permissive_mode(path).map_err(unreadable)? {
        return Err(BuildError::Preflight(format!(
            "--account-key-file {shown} is readable by group or others (mode {mode:o}); run \
             `chmod 600 {shown}`"
        )));
    }
    let key = std::fs::read_to_string(path).map_err(unreadable)?;
    let key = key.trim();
    if key.is_empty() {
        return Err(BuildError::Preflight(format!(
            "--account-key-file {shown} is empty: it must hold the Batch account key"
        )));
    }
    Ok(Secret::new(key.to_string()))
}

/// The Entra ID credential: a token file, else what the environment provides, in the order
/// of Azure's default chain (workload identity, client secret, Azure CLI, managed identity).
fn entra_credential(
    token_file: Option<&Path>,
    transport: &reqwest::Client,
) -> Result<(Arc<dyn TokenCredential>, &'static str), BuildError> {
    let options = || BatchClient::options(transport.clone());
    let err = |what: &str, e: azure_core::Error| {
        BuildError::Preflight(format!("Microsoft Entra ID ({what}): {e}"))
    };
    let env = |k: &str| std::env::var(k).ok().filter(|v| !v.is_empty());
    if let Some(path) = token_file {
        return Ok((
            Arc::new(FileTokenCredential {
                path: path.to_path_buf(),
            }),
            "token file",
        ));
    }
    if env("AZURE_FEDERATED_TOKEN_FILE").is_some() {
        let mut o = azure_identity::WorkloadIdentityCredentialOptions::default();
        o.credential_options.client_options = options();
        let c = azure_identity::WorkloadIdentityCredential::new(Some(o))
            .map_err(|e| err("workload identity", e))?;
        return Ok((c, "workload identity"));
    }
    if let (Some(tenant), Some(client), Some(secret)) = (
        env("AZURE_TENANT_ID"),
        env("AZURE_CLIENT_ID"),
        env("AZURE_CLIENT_SECRET"),
    ) {
        let o = azure_identity::ClientSecretCredentialOptions {
            client_options: options(),
        };
        let c = azure_identity::ClientSecretCredential::new(
            &tenant,
            client,
            Secret::new(secret),
            Some(o),
        )
        .map_err(|e| err("client secret", e))?;
        return Ok((c, "client secret"));
    }
    let on_path = |prog: &str| {
        std::env::var_os("PATH")
            .is_some_and(|p| std::env::split_paths(&p).any(|d| d.join(prog).is_file()))
    };
    if env("IDENTITY_ENDPOINT").is_none() && on_path("az") {
        let c = azure_identity::AzureCliCredential::new(None).map_err(|e| err("Azure CLI", e))?;
        return Ok((c, "Azure CLI"));
    }
    let o = azure_identity::ManagedIdentityCredentialOptions {
        user_assigned_id: env("AZURE_CLIENT_ID").map(azure_identity::UserAssignedId::ClientId),
        client_options: options(),
    };
    let c = azure_identity::ManagedIdentityCredential::new(Some(o))
        .map_err(|e| err("managed identity", e))?;
    Ok((c, "managed identity"))
}

impl BackendArgs for AzureBatchArgs {
    type Backend = AzureBatchBackend;

    fn shape(&self) -> &ShapeArgs {
        &self.shape
    }

    fn password_file(&self) -> Option<&Path> {
        self.password_file.as_deref()
    }

    /// Workers in `<prefix>/cl_worker_<id>_work_dir` on the shared prefix, handing their runs
    /// back on SIGTERM (task terminated, low-priority node pre-empted).
    async fn build(
        &self,
        cx: &BuildContext<'_>,
    ) -> Result<(AzureBatchBackend, WorkerProfile), BuildError> {
        let image = crate::profile::worker_image(self.worker_image.as_deref());
        let prefix = cx.work_dir_prefix.map(str::to_string);
        let password_file =
            match (&self.password_file, self.allow_plaintext_password, &prefix) {
                (Some(p), _, _) => Some(p.clone()),
                (None, true, _) => None,
                (None, false, Some(dir)) => {
                    let path = write_password_file(Path::new(dir), cx.username, cx.password)?;
                    tracing::warn!(
                        "the workers' credentials file is {} on the shared work dir: every \
                         machine that mounts the share can read it; prefer --password-file \
                         with a file on each node's own disk (as terraform/azure-batch's start \
                         task writes from Key Vault)",
                        path.display()
                    );
                    Some(path)
                }
                (None, false, None) => return Err(BuildError::Preflight(
                    "azure-batch: the workers read their CodaLab credentials from a file, never \
                     from the tasks' settings: add --password-file FILE (mode 600, the username \
                     on line 1 and the password on line 2, at the same path on the nodes), or \
                     give --worker-work-dir-prefix on a file system the nodes share (the file is \
                     written there)"
                        .into(),
                )),
            };
        if password_file.is_none() {
            tracing::warn!(
                "--allow-plaintext-password: the CodaLab password goes into every task's \
                 environment settings, readable by anyone allowed to read the job's tasks"
            );
        }
        let shared_fs = std::env::var("CODALAB_SHARED_FILE_SYSTEM").is_ok_and(|v| v == "true");
        let cfg = AzureBatchConfig {
            job_id: self.job_id.clone(),
            task_prefix: self.task_id_prefix.clone(),
            image,
            user: self.user.clone(),
            log_container_url: self.log_container_url.clone(),
            log_identity: self.log_container_identity.clone(),
            work_dir_prefix: prefix.clone(),
            bundle_mount: crate::profile::shared_bundle_mount(),
            password_file: password_file.map(|p| p.display().to_string()),
            plaintext_credentials: self
                .allow_plaintext_password
                .then(|| (cx.username.to_string(), cx.password.to_string()))
                .filter(|_| self.password_file.is_none()),
            pool_id: self.pool_id.clone(),
            remove_unhealthy_after: (self.remove_unhealthy_nodes_after > 0)
                .then(|| std::time::Duration::from_secs(self.remove_unhealthy_nodes_after)),
        };
        let http = transport()?;
        let (auth, how) = self.auth(&http)?;
        let client = BatchClient::new(&self.service_url, auth, BatchClient::options(http))?;
        let backend = AzureBatchBackend::new(client, cfg)?;
        tracing::info!(
            "Azure Batch account {} ({how}); logs to {}",
            self.service_url,
            redact_url(&self.log_container_url)
        );
        // Wrong keys and missing jobs stop the manager here, with the service's message;
        // a service that cannot be reached now is retried every tick.
        if let Err(e) = backend.check_job().await {
            if !e.is_retryable() {
                return Err(BuildError::Backend(e));
            }
            tracing::warn!("{e}");
        }
        // One work dir for every worker of the pool (of the job when no pool is named), as
        // CodaLab's Azure manager shares its prefix: the nodes' workers share one dependency
        // cache, which the worker's lock keeps safe over NFS.
        let shared_dir = shared_work_dir(
            prefix.as_deref(),
            self.pool_id.as_deref().unwrap_or(&self.job_id),
        );
        let mut profile = WorkerProfile::new(Box::new(move |_| shared_dir.clone()));
        // Workers sharing a node's Docker engine share its networks.
        profile.network_prefix = Some("codalab_worker_network".into());
        profile.extra_args = vec!["--pass-down-termination".into()];
        if shared_fs {
            profile.extra_args.push("--shared-file-system".into());
        }
        profile.pool = backend
            .pool_source()
            .map(|p| std::sync::Arc::new(p) as std::sync::Arc<dyn crate::PoolSource>);
        Ok((backend, profile))
    }
}

/// `<prefix>/cl_worker_<pool>_work_dir` (`/tmp` without a prefix), the pool's name made safe
/// for a path.
pub(super) fn shared_work_dir(prefix: Option<&str>, pool: &str) -> String {
    let safe = common::fs::safe_name(pool, "-_.");
    format!(
        "{}/cl_worker_{safe}_work_dir",
        prefix.unwrap_or("/tmp").trim_end_matches('/')
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::parse_args;

    #[test]
    fn pythons_flags_and_defaults() {
        let base = [
            "--account-name",
            "acct",
            "--service-url",
            "https://acct.westus2.batch.azure.com",
            "--job-id",
            "codalab",
            "--log-container-url",
            "https://logs.blob.core.windows.net/w?sig=x",
        ];
        let a: AzureBatchArgs = parse_args(&base).unwrap();
        assert_eq!(
            (
                a.shape.cpus,
                a.shape.gpus,
                a.shape.memory_mb,
                a.user.as_str()
            ),
            (1, 0, 2048, "root")
        );
        assert_eq!(a.account_name.as_deref(), Some("acct"));
        assert_eq!(a.task_id_prefix, "cl_worker_");
        assert!(a.account_key.is_none() && a.pool_id.is_none() && !a.allow_plaintext_password);
        // --service-url and --job-id are required, as in Python.
        for missing in ["--service-url", "--job-id"] {
            let i = base.iter().position(|f| *f == missing).unwrap();
            let mut args = base.to_vec();
            args.drain(i..i + 2);
            assert!(parse_args::<AzureBatchArgs>(&args).is_err(), "{missing}");
        }
        let mut with_key = base.to_vec();
        with_key.extend(["--account-key", "a2V5", "--pool-id", "p"]);
        let a: AzureBatchArgs = parse_args(&with_key).unwrap();
        assert_eq!(
            (a.account_key.as_deref(), a.pool_id.as_deref()),
            (Some("a2V5"), Some("p"))
        );
    }
}
