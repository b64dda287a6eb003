//! The batch script of a Slurm worker job: `#SBATCH` lines from the settings and the job's
//! shape, then the worker run through `srun` with its GPUs and its SIGTERM forwarding.

use super::{SlurmConfig, COMMENT_PREFIX};
use crate::{BackendError, JobSpec};

pub(super) fn check_sbatch_value(flag: &str, v: &str) -> Result<(), BackendError> {
    if v.chars()
        .any(|c| c.is_whitespace() || c.is_control() || matches!(c, '"' | '\'' | '\\'))
    {
        return Err(BackendError::permanent(format!(
            "{flag} {v:?}: whitespace, quotes and backslashes cannot be passed to sbatch"
        )));
    }
    Ok(())
}

/// The batch script of one worker. `command` is the full `cl-worker` argv (program first); the
/// script adds `--gpuset` from the GPUs Slurm gave the job, or `NONE`.
pub fn render_script(cfg: &SlurmConfig, spec: &JobSpec) -> Result<String, BackendError> {
    cfg.validate()?;
    let id = &spec.worker_id;
    check_sbatch_value("worker id", id)?;
    check_sbatch_value("shape", &spec.shape_name)?;
    if spec.command.is_empty() {
        return Err(BackendError::permanent("empty worker command"));
    }
    let dir = cfg.work_dir.join(id);
    let mut opts: Vec<(&str, String)> = Vec::new();
    if let Some(a) = &cfg.account {
        opts.push(("account", a.clone()));
    }
    opts.push(("comment", format!("{COMMENT_PREFIX}{}", spec.shape_name)));
    if let Some(c) = &cfg.constraint {
        opts.push(("constraint", c.clone()));
    }
    opts.push(("cpus-per-task", spec.cpus.max(1).to_string()));
    if let Some(e) = &cfg.exclude {
        opts.push(("exclude", e.clone()));
    }
    if spec.gpus > 0 {
        let gres = match &cfg.gpu_type {
            Some(t) => format!("gpu:{t}:{}", spec.gpus),
            None => format!("gpu:{}", spec.gpus),
        };
        opts.push(("gres", gres));
    }
    opts.push(("job-name", id.clone()));
    opts.push(("mem", format!("{}M", (spec.memory_bytes >> 20).max(1))));
    if let Some(n) = &cfg.nodelist {
        opts.push(("nodelist", n.clone()));
    }
    opts.push(("ntasks-per-node", "1".into()));
    opts.push(("open-mode", "append".into()));
    opts.push((
        "output",
        dir.join(format!("{id}.out")).to_string_lossy().into_owned(),
    ));
    opts.push(("partition", cfg.partition.clone()));
    if cfg.signal_secs > 0 {
        opts.push(("signal", format!("B:TERM@{}", cfg.signal_secs)));
    }
    opts.push(("time", cfg.time.clone()));

    let mut argv = spec.command.clone();
    if let Some(p) = &spec.password_file {
        argv.push("--password-file".into());
        argv.push(p.to_string_lossy().into_owned());
    }
    let quoted = shlex::try_join(argv.iter().map(String::as_str))
        .map_err(|e| BackendError::permanent(format!("cannot quote the worker command: {e}")))?;

    let mut s = String::from("#!/usr/bin/env bash\n");
    for (k, v) in &opts {
        s.push_str(&format!("#SBATCH --{k}={v}\n"));
    }
    s.push_str(&format!(
        r#"
echo "Worker is executing on host: $(hostname)"
# GPU isolation: Docker would otherwise see every GPU of the node.
GPUSET=NONE
if [ {gpus} -gt 0 ] && command -v nvidia-smi >/dev/null 2>&1; then
  ALL=$(nvidia-smi -L | grep -o 'GPU-[0-9a-fA-F-]*' | paste -sd, -)
  COUNT=$(printf '%s' "$ALL" | tr ',' '\n' | grep -c . || true)
  if [ -n "${{CUDA_VISIBLE_DEVICES:-}}" ] && [ "$COUNT" -gt {gpus} ]; then
    GPUSET=$CUDA_VISIBLE_DEVICES  # no device cgroup: the node shows all its GPUs
  elif [ -n "$ALL" ]; then
    GPUSET=$ALL
  fi
fi
# SIGTERM (scancel, preemption, --signal before the time limit) goes to the worker, which hands
# its runs back to the server.
srun --unbuffered {quoted} --gpuset "$GPUSET" &
child=$!
trap 'kill -TERM "$child" 2>/dev/null' TERM INT
status=0
wait "$child" || status=$?
while kill -0 "$child" 2>/dev/null; do
  wait "$child" || status=$?
done
exit "$status"
"#,
        gpus = spec.gpus,
    ));
    Ok(s)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::slurm::SlurmBackend;
    use std::path::PathBuf;

    fn cfg() -> SlurmConfig {
        SlurmConfig {
            partition: "debug".into(),
            job_name: "codalab-slurm-worker".into(),
            user: "alice".into(),
            nodelist: None,
            exclude: None,
            gpu_type: None,
            constraint: None,
            time: "10-0".into(),
            account: None,
            work_dir: PathBuf::from("/scratch/slurm"),
            signal_secs: 300,
            dry_run: false,
        }
    }

    fn spec(gpus: u32) -> JobSpec {
        JobSpec {
            worker_id: "alice-codalab-slurm-worker-ab12".into(),
            shape_name: "default".into(),
            cpus: 2,
            gpus,
            memory_bytes: 4096 << 20,
            command: vec![
                "cl-worker".into(),
                "--server".into(),
                "https://x".into(),
                "--tag".into(),
                "it's; rm -rf /".into(),
            ],
            env: vec![],
            password_file: Some(PathBuf::from("/home/alice/.pw")),
        }
    }

    #[test]
    fn script_has_sorted_sbatch_lines_and_quoted_command() {
        let s = render_script(&cfg(), &spec(0)).unwrap();
        let sbatch: Vec<&str> = s.lines().filter(|l| l.starts_with("#SBATCH")).collect();
        assert_eq!(
            sbatch,
            [
                "#SBATCH --comment=clwm:default",
                "#SBATCH --cpus-per-task=2",
                "#SBATCH --job-name=alice-codalab-slurm-worker-ab12",
                "#SBATCH --mem=4096M",
                "#SBATCH --ntasks-per-node=1",
                "#SBATCH --open-mode=append",
                "#SBATCH --output=/scratch/slurm/alice-codalab-slurm-worker-ab12/alice-codalab-slurm-worker-ab12.out",
                "#SBATCH --partition=debug",
                "#SBATCH --signal=B:TERM@300",
                "#SBATCH --time=10-0",
            ]
        );
        assert!(!s.contains("gres"), "a CPU-only job has no gres");
        // The argv survives bash word splitting exactly.
        let srun = s.lines().find(|l| l.starts_with("srun ")).unwrap();
        let probe = srun
            .replace("srun --unbuffered ", "printf '%s\\n' ")
            .replace(" &", "");
        let out = std::process::Command::new("bash")
            .args(["-c", &format!("GPUSET=NONE; {probe}")])
            .output()
            .unwrap();
        let mut expected = spec(0).command;
        expected
            .extend(["--password-file", "/home/alice/.pw", "--gpuset", "NONE"].map(String::from));
        assert_eq!(
            String::from_utf8(out.stdout)
                .unwrap()
                .lines()
                .collect::<Vec<_>>(),
            expected
        );
        // The whole script is valid bash.
        let check = std::process::Command::new("bash")
            .args(["-n", "-c", &s])
            .status()
            .unwrap();
        assert!(check.success());
    }

    #[test]
    fn gres_only_with_gpus_and_with_type() {
        let s = render_script(&cfg(), &spec(2)).unwrap();
        assert!(s.contains("#SBATCH --gres=gpu:2\n"));
        let mut c = cfg();
        c.gpu_type = Some("a100".into());
        c.account = Some("nlp".into());
        c.signal_secs = 0;
        let s = render_script(&c, &spec(1)).unwrap();
        assert!(s.contains("#SBATCH --gres=gpu:a100:1\n"));
        assert!(s.starts_with("#!/usr/bin/env bash\n#SBATCH --account=nlp\n"));
        assert!(!s.contains("#SBATCH --signal"));
    }

    #[test]
    fn sbatch_values_with_spaces_are_refused() {
        let mut c = cfg();
        c.partition = "debug --wrap=x".into();
        assert!(render_script(&c, &spec(0)).is_err());
        let mut c = cfg();
        c.work_dir = PathBuf::from("/my scratch");
        let e = SlurmBackend::new(c).err().unwrap();
        assert!(e.to_string().contains("--slurm-work-dir"), "{e}");
    }
}
