//! CPUs and GPUs of this worker, and their assignment to runs: each run gets `request_cpus`
//! cores of `--cpuset` and `request_gpus` GPUs of `--gpuset`, never shared with another run;
//! a run that does not fit waits until others release theirs.

use std::collections::BTreeMap;
use std::process::Command;

/// A GPU found by `nvidia-smi`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Gpu {
    pub index: String,
    pub uuid: String,
    pub memory_mib: Option<u64>,
}

/// Parses `nvidia-smi --query-gpu=index,uuid,memory.total --format=csv,noheader,nounits`.
pub fn parse_nvidia_smi(out: &str) -> Vec<Gpu> {
    out.lines()
        .filter_map(|line| {
            let mut f = line.split(',').map(str::trim);
            let index = f.next()?.to_owned();
            let uuid = f.next()?.to_owned();
            if index.is_empty() || !uuid.starts_with("GPU-") {
                return None;
            }
            let memory_mib = f
                .next()
                .and_then(|m| m.split_whitespace().next())
                .and_then(|m| m.parse().ok());
            Some(Gpu {
                index,
                uuid,
                memory_mib,
            })
        })
        .collect()
}

/// GPUs of this machine, from `nvidia-smi` on PATH; empty when there is none.
pub fn discover_gpus() -> Vec<Gpu> {
    match Command::new("nvidia-smi")
        .args([
            "--query-gpu=index,uuid,memory.total",
            "--format=csv,noheader,nounits",
        ])
        .output()
    {
        Ok(out) if out.status.success() => parse_nvidia_smi(&String::from_utf8_lossy(&out.stdout)),
        Ok(out) => {
            tracing::warn!(
                "nvidia-smi failed ({}): {}; no GPUs",
                out.status,
                String::from_utf8_lossy(&out.stderr).trim()
            );
            Vec::new()
        }
        Err(_) => Vec::new(),
    }
}

/// Parses `--cpuset`: `ALL` (the CPUs this process may run on) or a comma-separated list of CPU
/// numbers, each of which must be available to this process.
pub fn parse_cpuset(spec: &str, available: &[usize]) -> Result<Vec<usize>, String> {
    if spec.trim() == "ALL" {
        return Ok(available.to_vec());
    }
    let mut cpus = Vec::new();
    for part in spec.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let cpu: usize = part
            .parse()
            .map_err(|_| format!("CPUSET_STR invalid format: {part:?} is not a CPU number"))?;
        if !available.contains(&cpu) {
            return Err(format!(
                "CPU {cpu} is not available to this worker (available: {available:?})"
            ));
        }
        if !cpus.contains(&cpu) {
            cpus.push(cpu);
        }
    }
    if cpus.is_empty() {
        return Err("CPUSET_STR must name at least one CPU".into());
    }
    cpus.sort_unstable();
    Ok(cpus)
}

/// CPUs this process may run on.
pub fn available_cpus() -> Vec<usize> {
    match nix::sched::sched_getaffinity(nix::unistd::Pid::from_raw(0)) {
        Ok(set) => (0..nix::sched::CpuSet::count())
            .filter(|&i| set.is_set(i).unwrap_or(false))
            .collect(),
        Err(_) => (0..std::thread::available_parallelism().map_or(1, |n| n.get())).collect(),
    }
}

/// Resolves `--gpuset` (`ALL`, `NONE`/empty, or indices and UUIDs) to GPU UUIDs.
pub fn parse_gpuset(spec: &str, gpus: &[Gpu]) -> Result<Vec<String>, String> {
    let spec = spec.trim();
    if spec.is_empty() || spec == "NONE" {
        return Ok(Vec::new());
    }
    if spec == "ALL" {
        return Ok(gpus.iter().map(|g| g.uuid.clone()).collect());
    }
    let mut out = Vec::new();
    for part in spec.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let gpu = gpus
            .iter()
            .find(|g| g.index == part || g.uuid == part)
            .ok_or_else(|| {
                format!(
                    "GPU {part:?} of --gpuset is not on this machine (found: {})",
                    if gpus.is_empty() {
                        "none".to_string()
                    } else {
                        gpus.iter()
                            .map(|g| format!("{} {}", g.index, g.uuid))
                            .collect::<Vec<_>>()
                            .join(", ")
                    }
                )
            })?;
        if !out.contains(&gpu.uuid) {
            out.push(gpu.uuid.clone());
        }
    }
    Ok(out)
}

/// What a run holds.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Assignment {
    pub cpus: Vec<usize>,
    pub gpus: Vec<String>,
}

/// Outcome of asking for resources.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Grant {
    Assigned(Assignment),
    /// Not now: others hold what is needed.
    Wait {
        free_cpus: usize,
        free_gpus: usize,
    },
    /// Never: the worker does not have that many.
    Impossible(String),
}

/// Assignment of the worker's CPUs and GPUs to runs (pure bookkeeping).
#[derive(Debug, Clone, Default)]
pub struct Allocator {
    cpus: Vec<usize>,
    gpus: Vec<String>,
    held: BTreeMap<String, Assignment>,
}

impl Allocator {
    pub fn new(cpus: Vec<usize>, gpus: Vec<String>) -> Self {
        Allocator {
            cpus,
            gpus,
            held: BTreeMap::new(),
        }
    }

    fn free_cpus(&self) -> Vec<usize> {
        self.cpus
            .iter()
            .copied()
            .filter(|c| !self.held.values().any(|a| a.cpus.contains(c)))
            .collect()
    }

    fn free_gpus(&self) -> Vec<String> {
        self.gpus
            .iter()
            .filter(|g| !self.held.values().any(|a| a.gpus.contains(g)))
            .cloned()
            .collect()
    }

    /// Assigns `cpus` CPUs (at least one) and `gpus` GPUs to `run`, lowest numbers first.
    /// Asking again for a run that holds an assignment returns it.
    pub fn request(&mut self, run: &str, cpus: u64, gpus: u64) -> Grant {
        if let Some(a) = self.held.get(run) {
            return Grant::Assigned(a.clone());
        }
        let cpus = cpus.max(1) as usize;
        let gpus = gpus as usize;
        if cpus > self.cpus.len() || gpus > self.gpus.len() {
            return Grant::Impossible(format!(
                "Requested {cpus} CPUs and {gpus} GPUs, but this worker has {} CPUs and {} GPUs.",
                self.cpus.len(),
                self.gpus.len()
            ));
        }
        let free_c = self.free_cpus();
        let free_g = self.free_gpus();
        if free_c.len() < cpus || free_g.len() < gpus {
            return Grant::Wait {
                free_cpus: free_c.len(),
                free_gpus: free_g.len(),
            };
        }
        let a = Assignment {
            cpus: free_c[..cpus].to_vec(),
            gpus: free_g[..gpus].to_vec(),
        };
        self.held.insert(run.to_owned(), a.clone());
        Grant::Assigned(a)
    }

    /// Records what a resumed run already holds.
    pub fn restore(&mut self, run: &str, a: Assignment) {
        self.held.insert(run.to_owned(), a);
    }

    pub fn release(&mut self, run: &str) -> bool {
        self.held.remove(run).is_some()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn two_gpus() -> Vec<Gpu> {
        parse_nvidia_smi("0, GPU-aaaa-1, 16384\n1, GPU-bbbb-2, 16384 MiB\n")
    }

    #[test]
    fn nvidia_smi_output() {
        let g = two_gpus();
        assert_eq!(g.len(), 2);
        assert_eq!(g[1].uuid, "GPU-bbbb-2");
        assert_eq!(g[0].memory_mib, Some(16384));
        assert!(parse_nvidia_smi("No devices were found\n").is_empty());
    }

    #[test]
    fn gpusets() {
        let g = two_gpus();
        assert_eq!(
            parse_gpuset("ALL", &g).unwrap(),
            vec!["GPU-aaaa-1", "GPU-bbbb-2"]
        );
        assert!(parse_gpuset("NONE", &g).unwrap().is_empty());
        assert!(parse_gpuset("", &g).unwrap().is_empty());
        assert_eq!(parse_gpuset("1", &g).unwrap(), vec!["GPU-bbbb-2"]);
        assert_eq!(
            parse_gpuset("GPU-aaaa-1,1,0", &g).unwrap(),
            vec!["GPU-aaaa-1", "GPU-bbbb-2"]
        );
        assert!(parse_gpuset("2", &g).is_err());
        assert!(parse_gpuset("ALL", &[]).unwrap().is_empty());
        assert!(parse_gpuset("0", &[]).unwrap_err().contains("none"));
    }

    #[test]
    fn never_double_books() {
        let mut a = Allocator::new(vec![0, 1, 2, 3], vec!["G1".into(), "G2".into()]);
        let Grant::Assigned(r1) = a.request("r1", 1, 1) else {
            panic!()
        };
        let Grant::Assigned(r2) = a.request("r2", 2, 1) else {
            panic!()
        };
        assert_eq!(r1.cpus, vec![0]);
        assert_eq!(r2.cpus, vec![1, 2]);
        assert_ne!(r1.gpus, r2.gpus);
        assert_eq!(
            a.request("r3", 1, 1),
            Grant::Wait {
                free_cpus: 1,
                free_gpus: 0
            }
        );
        // Asking again is idempotent.
        assert_eq!(a.request("r1", 1, 1), Grant::Assigned(r1.clone()));
        assert!(a.release("r1"));
        let Grant::Assigned(r3) = a.request("r3", 1, 1) else {
            panic!()
        };
        assert_eq!(r3.gpus, r1.gpus);
        assert!(matches!(a.request("big", 5, 0), Grant::Impossible(_)));
        assert!(matches!(a.request("gpu", 1, 3), Grant::Impossible(_)));
    }

    #[test]
    fn exhaustive_small_sequences() {
        // Every interleaving of requests and releases over 3 runs keeps assignments disjoint
        // and within the sets.
        let runs = ["a", "b", "c"];
        for ops in 0..(6u32.pow(5)) {
            let mut al = Allocator::new(vec![0, 1, 2], vec!["G".into()]);
            let mut x = ops;
            for _ in 0..5 {
                let op = x % 6;
                x /= 6;
                let run = runs[(op % 3) as usize];
                if op < 3 {
                    al.request(run, 1 + (op as u64 % 2), (op == 0) as u64);
                } else {
                    al.release(run);
                }
                let mut seen_c = std::collections::HashSet::new();
                let mut seen_g = std::collections::HashSet::new();
                for a in al.held.values() {
                    for c in &a.cpus {
                        assert!(seen_c.insert(*c) && *c < 3);
                    }
                    for g in &a.gpus {
                        assert!(seen_g.insert(g.clone()));
                    }
                }
            }
        }
    }

    #[test]
    fn one_cpu_at_least() {
        let mut a = Allocator::new(vec![5], vec![]);
        assert_eq!(
            a.request("r", 0, 0),
            Grant::Assigned(Assignment {
                cpus: vec![5],
                gpus: vec![]
            })
        );
    }
}
