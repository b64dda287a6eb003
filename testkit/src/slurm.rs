//! The real Slurm peer (`tests/peers/slurm.sh`) for the manager's end-to-end tests.

use std::collections::HashMap;
use std::process::Command;
use std::sync::OnceLock;

use crate::peers::{bash, exports};

/// The running Slurm peer's environment (`slurm.sh env`), started once per test binary.
pub fn env() -> &'static HashMap<String, String> {
    static ENV: OnceLock<HashMap<String, String>> = OnceLock::new();
    ENV.get_or_init(|| {
        let none = HashMap::new();
        bash(&["tests/peers/slurm.sh", "start"], &none);
        exports(&bash(&["tests/peers/slurm.sh", "env"], &none))
    })
}

/// Runs a Slurm command against the peer; returns stdout (panics on failure).
pub fn run(program: &str, args: &[&str]) -> String {
    try_run(program, args).unwrap_or_else(|e| panic!("{program} {args:?}: {e}"))
}

/// Runs a Slurm command against the peer; stdout, or stderr as the error.
pub fn try_run(program: &str, args: &[&str]) -> Result<String, String> {
    let out = Command::new(program)
        .args(args)
        .envs(env())
        .output()
        .map_err(|e| e.to_string())?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(String::from_utf8_lossy(&out.stderr).into_owned())
    }
}

/// The batch script of every job slurmctld still knows (finished jobs stay for MinJobAge).
pub fn batch_scripts() -> Vec<(String, String)> {
    run("squeue", &["-h", "-t", "all", "-o", "%i"])
        .lines()
        .filter_map(|id| {
            let id = id.trim();
            try_run("scontrol", &["write", "batch_script", id, "-"])
                .ok()
                .map(|s| (id.to_string(), s))
        })
        .collect()
}
