//! The batch script of a Slurm worker job: `#SBATCH` lines from the settings and the job's
//! shape, then the worker run through `srun` with its GPUs and its SIGTERM forwarding.

use super::{ContainerEngine, PodmanSettings, SlurmConfig, COMMENT_PREFIX};
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
    opts.push(("cpus-per-task", spec.resources.cpus.max(1).to_string()));
    if let Some(e) = &cfg.exclude {
        opts.push(("exclude", e.clone()));
    }
    if spec.resources.gpus > 0 {
        let gres = match &cfg.gpu_type {
            Some(t) => format!("gpu:{t}:{}", spec.resources.gpus),
            None => format!("gpu:{}", spec.resources.gpus),
        };
        opts.push(("gres", gres));
    }
    opts.push(("job-name", id.clone()));
    opts.push((
        "mem",
        format!("{}M", (spec.resources.memory_bytes >> 20).max(1)),
    ));
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
    // Requeueable, so that `scontrol requeue` (an administrator draining a node) and a
    // preemption in REQUEUE mode restart the worker instead of failing: its SIGTERM hands the
    // runs back first. (With JobRequeue=0, Slurm's default, it would refuse.)
    opts.push(("requeue", String::new()));
    if cfg.signal_secs > 0 {
        opts.push(("signal", format!("B:TERM@{}", cfg.signal_secs)));
    }
    opts.push(("time", cfg.time.clone()));

    let mut argv = spec.command.clone();
    let podman = match &cfg.engine {
        ContainerEngine::Docker => None,
        ContainerEngine::Podman(p) => {
            let sock = dir.join("podman.sock");
            // sun_path holds 107 bytes and a NUL.
            if sock.as_os_str().len() > 107 {
                return Err(BackendError::permanent(format!(
                    "the Podman socket {} is longer than a Unix socket path may be: use a shorter \
                     --slurm-work-dir",
                    sock.display()
                )));
            }
            argv.push("--docker-host".into());
            argv.push(format!("unix://{}", sock.display()));
            Some(podman_block(p, &sock.to_string_lossy())?)
        }
    };
    let quoted = shlex::try_join(argv.iter().map(String::as_str))
        .map_err(|e| BackendError::permanent(format!("cannot quote the worker command: {e}")))?;

    let mut s = String::from("#!/usr/bin/env bash\n");
    for (k, v) in &opts {
        if v.is_empty() {
            s.push_str(&format!("#SBATCH --{k}\n"));
        } else {
            s.push_str(&format!("#SBATCH --{k}={v}\n"));
        }
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
{podman}# SIGTERM (scancel, preemption, --signal before the time limit) goes to the worker, which hands
# its runs back to the server.
srun --unbuffered {quoted} --gpuset "$GPUSET" &
child=$!
trap 'kill -TERM "$child" 2>/dev/null' TERM INT
status=0
wait "$child" || status=$?
while kill -0 "$child" 2>/dev/null; do
  wait "$child" || status=$?
done
{podman_stop}exit "$status"
"#,
        gpus = spec.resources.gpus,
        podman = podman.as_deref().unwrap_or(""),
        podman_stop = if podman.is_some() {
            "# The job's Podman service ends with its worker.\nkill -TERM \"$PODMAN_PID\" 2>/dev/null || true\nwait \"$PODMAN_PID\" 2>/dev/null || true\n"
        } else {
            ""
        },
    ));
    Ok(s)
}

/// The part of the script that starts the job's Podman service on `sock` (storage on the node,
/// shared by the user's jobs so that images are pulled once per node).
fn podman_block(p: &PodmanSettings, sock: &str) -> Result<String, BackendError> {
    if p.storage_dir.is_empty()
        || p.storage_dir
            .chars()
            .any(|c| c.is_control() || matches!(c, '"' | '`' | '\\'))
    {
        return Err(BackendError::permanent(format!(
            "--podman-storage-dir {:?}: quotes, backquotes and backslashes cannot be used",
            p.storage_dir
        )));
    }
    let q = |s: &str| shlex::try_quote(s).map(|c| c.into_owned());
    let sock = q(sock).map_err(|e| BackendError::permanent(e.to_string()))?;
    let conf = match &p.containers_conf {
        Some(c) => format!(
            "export CONTAINERS_CONF={}\n",
            q(&c.to_string_lossy()).map_err(|e| BackendError::permanent(e.to_string()))?
        ),
        None => String::new(),
    };
    Ok(format!(
        r#"# Podman: a service of this job's own on a private socket; its image storage is on the
# node, shared by this user's jobs.
PODMAN_SOCK={sock}
PODMAN_STORAGE="{storage}"
mkdir -p "$PODMAN_STORAGE/etc" "$PODMAN_STORAGE/run" "$PODMAN_STORAGE/root" "$PODMAN_STORAGE/tmp"
cat > "$PODMAN_STORAGE/etc/storage.conf.$$" <<CLW_PODMAN_STORAGE
[storage]
driver = "{driver}"
runroot = "$PODMAN_STORAGE/run"
graphroot = "$PODMAN_STORAGE/root"
CLW_PODMAN_STORAGE
mv -f "$PODMAN_STORAGE/etc/storage.conf.$$" "$PODMAN_STORAGE/etc/storage.conf"
export CONTAINERS_STORAGE_CONF="$PODMAN_STORAGE/etc/storage.conf" TMPDIR="${{TMPDIR:-$PODMAN_STORAGE/tmp}}"
{conf}rm -f "$PODMAN_SOCK"
if [ -d /sys/fs/cgroup/unified ] && [ "$(id -u)" = 0 ]; then
  # A hybrid cgroup layout, which crun refuses: a private mount namespace with cgroup2 only.
  unshare -m --propagation private sh -c 'umount -l /sys/fs/cgroup && mount -t cgroup2 none /sys/fs/cgroup && exec podman system service --time=0 "unix://$0"' "$PODMAN_SOCK" &
else
  podman system service --time=0 "unix://$PODMAN_SOCK" &
fi
PODMAN_PID=$!
for _ in $(seq 300); do [ -S "$PODMAN_SOCK" ] && break; sleep 0.1; done
if [ ! -S "$PODMAN_SOCK" ]; then
  echo "the Podman service did not start (podman system service on $PODMAN_SOCK)" >&2
  kill "$PODMAN_PID" 2>/dev/null
  exit 1
fi
echo "Podman service $(podman --version 2>/dev/null) on $PODMAN_SOCK"
"#,
        storage = p.storage_dir,
        driver = p.storage_driver,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::slurm::SlurmBackend;
    use crate::Resources;
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
            engine: ContainerEngine::Docker,
        }
    }

    fn spec(gpus: u32) -> JobSpec {
        JobSpec {
            worker_id: "alice-codalab-slurm-worker-ab12".into(),
            shape_name: "default".into(),
            resources: Resources::new(2, gpus, 4096 << 20),
            command: vec![
                "cl-worker".into(),
                "--server".into(),
                "https://x".into(),
                "--tag".into(),
                "it's; rm -rf /".into(),
                "--password-file".into(),
                "/home/alice/.pw".into(),
            ],
            env: vec![],
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
                "#SBATCH --requeue",
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
        expected.extend(["--gpuset", "NONE"].map(String::from));
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

    #[test]
    fn podman_jobs_start_their_own_service_and_point_the_worker_at_it() {
        let mut c = cfg();
        c.engine = ContainerEngine::Podman(PodmanSettings {
            storage_dir: "${TMPDIR:-/tmp}/cl-worker-podman-$(id -u)".into(),
            storage_driver: "vfs".into(),
            containers_conf: Some(PathBuf::from("/etc/cl/containers.conf")),
        });
        let s = render_script(&c, &spec(0)).unwrap();
        let sock = "/scratch/slurm/alice-codalab-slurm-worker-ab12/podman.sock";
        assert!(s.contains(&format!("PODMAN_SOCK={sock}\n")), "{s}");
        assert!(s.contains("driver = \"vfs\""));
        assert!(s.contains("export CONTAINERS_CONF=/etc/cl/containers.conf\n"));
        assert!(s.contains("podman system service --time=0"));
        // The service starts before the worker and stops after it.
        let start = s.find("PODMAN_PID=$!").unwrap();
        let srun = s.find("srun --unbuffered").unwrap();
        let stop = s.find("kill -TERM \"$PODMAN_PID\"").unwrap();
        assert!(start < srun && srun < stop);
        let line = s.lines().find(|l| l.starts_with("srun ")).unwrap();
        assert!(
            line.contains(&format!("--docker-host unix://{sock}")),
            "{line}"
        );
        let check = std::process::Command::new("bash")
            .args(["-n", "-c", &s])
            .status()
            .unwrap();
        assert!(check.success());
        // What a Unix socket cannot be, and storage dirs that would break the script.
        let mut long = c.clone();
        long.work_dir = PathBuf::from(format!("/{}", "d".repeat(90)));
        let e = render_script(&long, &spec(0)).unwrap_err().to_string();
        assert!(e.contains("Unix socket"), "{e}");
        let mut bad = c.clone();
        bad.engine = ContainerEngine::Podman(PodmanSettings {
            storage_dir: "/tmp/x\"; rm -rf /".into(),
            storage_driver: "vfs".into(),
            containers_conf: None,
        });
        assert!(render_script(&bad, &spec(0)).is_err());
        // Docker jobs have none of it.
        let d = render_script(&cfg(), &spec(0)).unwrap();
        assert!(!d.contains("podman") && !d.contains("--docker-host"));
    }
}
