//! What the job queue's compute environments can run: whether any of them launches GPU
//! instances, so that bundles asking for GPUs get GPU jobs.

use super::{sdk_error, AwsBatchBackend};
use crate::BackendError;

/// An EC2 instance type or family with NVIDIA GPUs: the accelerated-computing `p` and `g`
/// families (`p3`, `p4d.24xlarge`, `g4dn`, `g5.xlarge`, `g5g`, `gr6`…), never a Graviton type
/// whose `g` is a suffix (`m6g`, `c7g`) nor `optimal` (C, M and R families only).
pub fn gpu_instance_type(t: &str) -> bool {
    let family = t.split('.').next().unwrap_or_default();
    let rest = family
        .strip_prefix("gr")
        .or_else(|| family.strip_prefix('g'))
        .or_else(|| family.strip_prefix('p'));
    rest.is_some_and(|r| r.starts_with(|c: char| c.is_ascii_digit()))
}

impl AwsBatchBackend {
    /// The instance types of the job queue's managed compute environments (unmanaged ones
    /// tell none).
    pub async fn queue_instance_types(&self) -> Result<Vec<String>, BackendError> {
        let queues = self
            .client
            .describe_job_queues()
            .job_queues(&self.cfg.job_queue)
            .send()
            .await
            .map_err(|e| sdk_error("DescribeJobQueues", e))?;
        let envs: Vec<String> = queues
            .job_queues()
            .iter()
            .flat_map(|q| q.compute_environment_order())
            .filter_map(|o| o.compute_environment().map(str::to_string))
            .collect();
        if envs.is_empty() {
            return Ok(Vec::new());
        }
        let out = self
            .client
            .describe_compute_environments()
            .set_compute_environments(Some(envs))
            .send()
            .await
            .map_err(|e| sdk_error("DescribeComputeEnvironments", e))?;
        Ok(out
            .compute_environments()
            .iter()
            .filter_map(|c| c.compute_resources())
            .flat_map(|r| r.instance_types().iter().cloned())
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gpu_families_and_types_only() {
        for t in [
            "p3",
            "p3.2xlarge",
            "p4d.24xlarge",
            "p5",
            "g4dn",
            "g4dn.xlarge",
            "g5",
            "g5g.xlarge",
            "g6",
            "gr6.4xlarge",
        ] {
            assert!(gpu_instance_type(t), "{t}");
        }
        for t in [
            "optimal",
            "m6g",
            "c7g.large",
            "m5.large",
            "r5",
            "c4",
            "inf1",
            "trn1",
            "",
            "g",
            "p",
            "gx",
        ] {
            assert!(!gpu_instance_type(t), "{t}");
        }
    }
}
