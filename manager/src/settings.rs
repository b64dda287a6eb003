//! The typed settings of the control loop, built once from the global flags
//! ([`GlobalArgs::settings`](crate::cli::GlobalArgs::settings)).

use std::time::Duration;

/// What the control loop needs besides the policy configuration and the backend.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Settings {
    /// URL of the CodaLab server.
    pub server: String,
    /// Time between two ticks (at least a second).
    pub sleep_time: Duration,
    /// Restart the manager after this long.
    pub restart_after: Option<Duration>,
    /// The flags every worker gets.
    pub worker: WorkerFlags,
}

/// The `--worker-*` flags: what the worker command line is made of.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkerFlags {
    /// The worker program.
    pub executable: String,
    pub server: String,
    /// `--idle-seconds` (always with `--exit-when-idle`).
    pub idle_seconds: u64,
    pub tag: Option<String>,
    pub group: Option<String>,
    pub exit_after_num_runs: Option<i64>,
    pub download_dependencies_max_retries: u32,
    pub max_work_dir_size: Option<String>,
    pub delete_work_dir_on_exit: bool,
    pub exit_on_exception: bool,
    pub tag_exclusive: bool,
    pub pass_down_termination: bool,
    pub checkin_frequency_seconds: Option<u64>,
    pub shared_memory_size_gb: Option<u64>,
    pub preemptible: bool,
    /// `--worker-preemption-notice` as given (`None`: not given, the backend's default;
    /// `none`: off).
    pub preemption_notice: Option<String>,
    /// `--run-as-user` of the workers (`None`: the flag is not passed).
    pub run_as_user: Option<String>,
    /// Environment every worker gets: [`sentry_env`] of the manager's.
    pub env: Vec<(String, String)>,
    /// Tell each new worker the images and dependencies of the staged bundles it is launched
    /// for (`--prefetch-image`, `--prefetch-dependency`; `control::prefetch`).
    pub prefetch: bool,
}

/// The Sentry variables that Python's manager passes on to its workers
/// (`CODALAB_SENTRY_INGEST_URL`, `CODALAB_SENTRY_ENVIRONMENT`), read with `var`: both when the
/// ingest URL is set and not empty, none otherwise (Python also passes them on when it is set
/// to an empty string, which turns Sentry on with no place to report to).
pub fn sentry_env(var: impl Fn(&str) -> Option<String>) -> Vec<(String, String)> {
    let Some(url) = var("CODALAB_SENTRY_INGEST_URL").filter(|u| !u.is_empty()) else {
        return Vec::new();
    };
    let mut env = vec![("CODALAB_SENTRY_INGEST_URL".to_string(), url)];
    if let Some(e) = var("CODALAB_SENTRY_ENVIRONMENT") {
        env.push(("CODALAB_SENTRY_ENVIRONMENT".into(), e));
    }
    env
}

impl WorkerFlags {
    /// The worker command line, in the Python manager's exact order: the fixed part, then the
    /// optional flags. Values that Python drops when falsy are dropped the same way.
    /// `network_prefix` replaces Python's per-worker `cl_worker_<id>_network` (workers sharing one
    /// Docker engine share its networks).
    pub fn command(
        &self,
        worker_id: &str,
        work_dir: &str,
        network_prefix: Option<&str>,
    ) -> Vec<String> {
        let mut cmd: Vec<String> = vec![
            self.executable.clone(),
            "--server".into(),
            self.server.clone(),
            "--verbose".into(),
            "--exit-when-idle".into(),
            "--idle-seconds".into(),
            self.idle_seconds.to_string(),
            "--work-dir".into(),
            work_dir.into(),
            "--id".into(),
            format!("host-{worker_id}"),
            "--network-prefix".into(),
            network_prefix.map_or_else(|| format!("cl_worker_{worker_id}_network"), str::to_string),
        ];
        let mut opt = |flag: &str, value: Option<String>| {
            if let Some(v) = value {
                cmd.push(flag.into());
                cmd.push(v);
            }
        };
        opt("--tag", self.tag.clone());
        opt("--group", self.group.clone());
        opt(
            "--exit-after-num-runs",
            self.exit_after_num_runs
                .filter(|n| *n > 0)
                .map(|n| n.to_string()),
        );
        opt(
            "--download-dependencies-max-retries",
            Some(self.download_dependencies_max_retries)
                .filter(|n| *n > 0)
                .map(|n| n.to_string()),
        );
        opt("--max-work-dir-size", self.max_work_dir_size.clone());
        let flags = [
            (self.delete_work_dir_on_exit, "--delete-work-dir-on-exit"),
            (self.exit_on_exception, "--exit-on-exception"),
            (self.tag_exclusive, "--tag-exclusive"),
            (self.pass_down_termination, "--pass-down-termination"),
        ];
        for (on, flag) in flags {
            if on {
                cmd.push(flag.into());
            }
        }
        if let Some(n) = self.checkin_frequency_seconds.filter(|n| *n > 0) {
            cmd.extend(["--checkin-frequency-seconds".into(), n.to_string()]);
        }
        if let Some(n) = self.shared_memory_size_gb.filter(|n| *n > 0) {
            cmd.extend(["--shared-memory-size-gb".into(), n.to_string()]);
        }
        if self.preemptible {
            cmd.push("--preemptible".into());
        }
        if let Some(n) = self.preemption_notice.as_ref().filter(|n| *n != "none") {
            cmd.extend(["--preemption-notice".into(), n.clone()]);
        }
        if let Some(u) = &self.run_as_user {
            cmd.extend(["--run-as-user".into(), u.clone()]);
        }
        cmd
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sentry_variables_are_passed_on_only_with_an_ingest_url() {
        let vars = |pairs: &'static [(&'static str, &'static str)]| {
            move |k: &str| {
                pairs
                    .iter()
                    .find(|(n, _)| *n == k)
                    .map(|(_, v)| v.to_string())
            }
        };
        assert!(sentry_env(vars(&[])).is_empty());
        assert!(sentry_env(vars(&[
            ("CODALAB_SENTRY_INGEST_URL", ""),
            ("CODALAB_SENTRY_ENVIRONMENT", "prod")
        ]))
        .is_empty());
        assert_eq!(
            sentry_env(vars(&[
                ("CODALAB_SENTRY_INGEST_URL", "https://k@sentry.example/1"),
                ("CODALAB_SENTRY_ENVIRONMENT", "prod")
            ])),
            vec![
                (
                    "CODALAB_SENTRY_INGEST_URL".to_string(),
                    "https://k@sentry.example/1".to_string()
                ),
                ("CODALAB_SENTRY_ENVIRONMENT".into(), "prod".into())
            ]
        );
    }
}
