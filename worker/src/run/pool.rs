//! The worker's CPUs and GPUs, handed to runs without sharing.

use std::sync::Arc;

use crate::resources::{Allocator, Assignment, Grant};

/// The worker's CPUs and GPUs, shared by the event loop and preparation tasks.
#[derive(Clone)]
pub struct CpuGpuPool {
    alloc: Arc<std::sync::Mutex<Allocator>>,
    freed: Arc<tokio::sync::Notify>,
}

impl CpuGpuPool {
    pub fn new(a: Allocator) -> Self {
        CpuGpuPool {
            alloc: Arc::new(std::sync::Mutex::new(a)),
            freed: Arc::new(tokio::sync::Notify::new()),
        }
    }

    /// Waits until `req` (cpus, gpus) can be assigned to `run` without sharing.
    pub async fn acquire(
        &self,
        run: &str,
        req: (u64, u64),
        status: impl Fn(String),
    ) -> Result<Assignment, String> {
        loop {
            let freed = self.freed.notified();
            tokio::pin!(freed);
            freed.as_mut().enable();
            let grant = self.alloc.lock().unwrap().request(run, req.0, req.1);
            match grant {
                Grant::Assigned(a) => return Ok(a),
                Grant::Impossible(msg) => return Err(msg),
                Grant::Wait {
                    free_cpus,
                    free_gpus,
                } => {
                    status(format!(
                        "Waiting for resources: {} CPUs and {} GPUs requested, {free_cpus} CPUs and \
                         {free_gpus} GPUs free.",
                        req.0.max(1),
                        req.1
                    ));
                    freed.await;
                }
            }
        }
    }

    pub fn restore(&self, run: &str, a: Assignment) {
        self.alloc.lock().unwrap().restore(run, a);
    }

    pub fn release(&self, run: &str) {
        if self.alloc.lock().unwrap().release(run) {
            self.freed.notify_waiters();
        }
    }
}
