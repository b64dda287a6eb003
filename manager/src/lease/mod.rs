//! Two or more managers, one in charge (`--lease`): each reads the lease every few seconds;
//! the holder renews it, the others wait until it has gone unrenewed for its whole duration
//! and then take it with a compare-and-swap. Only the holder observes, plans, launches and
//! cancels ([`Gate`]); a new holder's first tick reads the backend's listing, which adopts the
//! jobs and workers of the one before, before anything is launched.
//!
//! The decisions are the pure [`elector`]; the lease lives in a Kubernetes `Lease` object
//! ([`kube`]) or in a file on a shared file system, read and replaced under the dependency
//! cache's NFS-safe lock ([`file`]). This module is the thin loop between them.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::future::BoxFuture;
use serde::{Deserialize, Serialize};
use tokio_util::sync::CancellationToken;

pub mod elector;
pub mod file;
pub mod kube;
#[cfg(test)]
mod tests;

pub use elector::{Elector, Read, Record, Timing, Transition, Write};

/// Why the lease could not be read or written (a lost compare-and-swap is no error).
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct StoreError(pub String);

/// Where the lease lives.
pub trait Store: Send + Sync {
    /// `file:<path>` or `kubernetes:<namespace>/<name>`, for people.
    fn describe(&self) -> String;
    fn read(&self) -> BoxFuture<'_, Result<Read, StoreError>>;
    /// `Ok(false)`: someone else wrote first (the version read is gone, or the lease exists).
    fn write<'a>(&'a self, write: &'a Write) -> BoxFuture<'a, Result<bool, StoreError>>;
}

/// What `--lease` names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LeaseSpec {
    File(std::path::PathBuf),
    Kubernetes { namespace: String, name: String },
}

impl std::str::FromStr for LeaseSpec {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        if let Some(path) = s.strip_prefix("file:") {
            if path.is_empty() || path.ends_with('/') {
                return Err(format!("{s:?}: file: needs the lease file's path"));
            }
            return Ok(LeaseSpec::File(path.into()));
        }
        if let Some(rest) = s.strip_prefix("kubernetes:") {
            let (namespace, name) = rest.split_once('/').unwrap_or(("default", rest));
            let ok = |n: &str| {
                !n.is_empty()
                    && n.len() <= 253
                    && n.bytes().all(|b| {
                        b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.'
                    })
                    && n.starts_with(|c: char| c.is_ascii_alphanumeric())
                    && n.ends_with(|c: char| c.is_ascii_alphanumeric())
            };
            if !ok(namespace) || !ok(name) {
                return Err(format!(
                    "{s:?}: kubernetes: needs [NAMESPACE/]NAME, each a lowercase DNS name"
                ));
            }
            return Ok(LeaseSpec::Kubernetes {
                namespace: namespace.into(),
                name: name.into(),
            });
        }
        Err(format!(
            "{s:?}: name the lease as file:PATH (on a file system every manager shares) or \
             kubernetes:[NAMESPACE/]NAME (a coordination.k8s.io/v1 Lease)"
        ))
    }
}

/// The lease as `/status`, the status page and `cl-worker-manager status` show it.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct LeaseStatus {
    /// Where it lives (`file:…`, `kubernetes:…`).
    pub lease: String,
    /// This manager's identity.
    pub me: String,
    /// Whether this manager holds it and may launch now.
    pub leader: bool,
    /// Who holds it (empty: nobody), as last read.
    pub holder: String,
    /// Unix time its holder took it.
    pub since: Option<f64>,
    /// Unix time of its last renewal.
    pub renewed_at: Option<f64>,
    pub duration_s: f64,
    /// How many times it changed hands.
    pub transitions: u32,
    /// Why it could not be read or written at the last look.
    pub error: Option<String>,
}

/// The shared view of the lease: what the loop learnt, what the control loop asks.
pub struct Shared {
    start: Instant,
    elector: Mutex<Elector>,
    status: Mutex<LeaseStatus>,
}

impl Shared {
    fn now(&self) -> f64 {
        self.start.elapsed().as_secs_f64()
    }

    fn elector(&self) -> std::sync::MutexGuard<'_, Elector> {
        self.elector.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn status(&self) -> LeaseStatus {
        let mut s = self
            .status
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        s.leader = self.elector().may_act(self.now());
        s
    }
}

/// What the control loop asks before it observes, and before each launch or cancel.
#[derive(Clone)]
pub struct Gate(Arc<Shared>);

impl Gate {
    /// Whether this manager holds the lease now (it may act until its renewal deadline).
    pub fn may_act(&self) -> bool {
        self.0.elector().may_act(self.0.now())
    }

    pub fn status(&self) -> LeaseStatus {
        self.0.status()
    }

    /// A gate that always acts, whatever it is asked (tests of the control loop).
    #[cfg(test)]
    pub fn always() -> Self {
        let mut e = Elector::new("test", Timing::of(1e9));
        let w = Write::Create(Record {
            holder: "test".into(),
            duration_s: 1e9,
            acquired_at: 0.0,
            renewed_at: 0.0,
            transitions: 0,
        });
        e.on_write(&w, true, 0.0);
        Gate(Arc::new(Shared {
            start: Instant::now(),
            elector: Mutex::new(e),
            status: Mutex::new(LeaseStatus::default()),
        }))
    }
}

/// A fresh identity for this process: `<host>-<pid>-<random>`.
pub fn default_identity() -> String {
    // The host name as the dependency cache's lock names its holder.
    let host = common::lock::HostIdent::current().host;
    format!(
        "{host}-{}-{}",
        std::process::id(),
        &crate::control::new_worker_id()[..6]
    )
}

/// Called at each change of hands: the log line and the metrics.
pub type OnTransition = Box<dyn Fn(&Transition, &LeaseStatus) + Send + Sync>;

/// The lease loop: started by [`start`], it runs until `shutdown`, then hands the lease back.
pub struct Lease {
    store: Arc<dyn Store>,
    shared: Arc<Shared>,
    on_transition: OnTransition,
}

/// Starts the lease loop for `me` on `store`; the gate the control loop asks.
pub fn start(
    store: Arc<dyn Store>,
    me: String,
    duration: Duration,
    on_transition: OnTransition,
    shutdown: CancellationToken,
) -> (Gate, tokio::task::JoinHandle<()>) {
    let timing = Timing::of(duration.as_secs_f64());
    let shared = Arc::new(Shared {
        start: Instant::now(),
        elector: Mutex::new(Elector::new(me.clone(), timing)),
        status: Mutex::new(LeaseStatus {
            lease: store.describe(),
            me,
            duration_s: timing.duration,
            ..Default::default()
        }),
    });
    let lease = Lease {
        store,
        shared: shared.clone(),
        on_transition,
    };
    let task = tokio::spawn(async move { lease.run(shutdown).await });
    (Gate(shared), task)
}

impl Lease {
    async fn run(self, shutdown: CancellationToken) {
        tracing::info!(
            "lease {}: this manager is {:?}; it launches only while it holds the lease",
            self.store.describe(),
            self.shared.elector().me
        );
        loop {
            self.round().await;
            let (wait, deadline) = {
                let e = self.shared.elector();
                let now = self.shared.now();
                (e.next_round(now) - now, e.acting_until().map(|t| t - now))
            };
            // Wake at the deadline too, to step down (and say so) on time.
            let wait = deadline
                .filter(|d| *d > 0.0)
                .map_or(wait, |d| wait.min(d + 0.01));
            tokio::select! {
                _ = tokio::time::sleep(Duration::from_secs_f64(wait.max(0.01))) => {}
                _ = shutdown.cancelled() => break,
            }
        }
        self.release().await;
    }

    /// One look: read, decide, maybe write.
    async fn round(&self) {
        let now = self.shared.now();
        let lost = self.shared.elector().tick(now);
        self.note(lost, None);
        let read = match self.store.read().await {
            Ok(r) => r,
            Err(e) => {
                self.shared.elector().on_error(now);
                self.note(None, Some(format!("cannot read the lease: {e}")));
                return;
            }
        };
        let (write, lost) = self
            .shared
            .elector()
            .on_read(&read, now, common::now_unix());
        self.note(lost, None);
        let Some(write) = write else { return };
        // `now`, taken before the read, is the start of the renewal: its deadline counts from
        // before the write could have landed.
        match self.store.write(&write).await {
            Ok(stored) => {
                let t = self.shared.elector().on_write(&write, stored, now);
                self.note(t, None);
            }
            Err(e) => {
                self.shared.elector().on_error(now);
                self.note(None, Some(format!("cannot write the lease: {e}")));
            }
        }
    }

    /// Publishes the status, logs a change of hands and calls the transition hook.
    fn note(&self, t: Option<Transition>, error: Option<String>) {
        let status = {
            let e = self.shared.elector();
            let mut s = self.shared.status.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(r) = &e.last {
                s.holder = r.holder.clone();
                s.since = (!r.holder.is_empty()).then_some(r.acquired_at);
                s.renewed_at = Some(r.renewed_at);
                s.transitions = r.transitions;
            }
            // Each error is logged once, when it first appears.
            if let Some(err) = error.as_ref().filter(|e| s.error.as_ref() != Some(*e)) {
                tracing::warn!("lease {}: {err}", s.lease);
            }
            s.error = error;
            s.leader = e.may_act(self.shared.now());
            s.clone()
        };
        if let Some(t) = t {
            match &t {
                Transition::Acquired { previous } if previous.is_empty() => tracing::info!(
                    "lease {}: acquired; this manager is in charge",
                    status.lease
                ),
                Transition::Acquired { previous } => tracing::info!(
                    "lease {}: taken over from {previous:?}, unrenewed for {:.0} s; this \
                     manager is in charge",
                    status.lease,
                    status.duration_s
                ),
                Transition::Lost { why } => tracing::warn!(
                    "lease {}: no longer in charge ({why}); launching nothing until it holds \
                     the lease again",
                    status.lease
                ),
            }
            (self.on_transition)(&t, &status);
        }
    }

    /// On shutdown the holder hands the lease back, so that a standby takes over at its next
    /// look instead of after the lease's duration.
    async fn release(&self) {
        let Ok(read) = self.store.read().await else {
            return;
        };
        let write = self.shared.elector().release(&read, common::now_unix());
        if let Some(w) = write {
            match self.store.write(&w).await {
                Ok(true) => tracing::info!("lease {}: handed back", self.store.describe()),
                Ok(false) => {}
                Err(e) => {
                    tracing::warn!("lease {}: cannot hand it back: {e}", self.store.describe())
                }
            }
        }
    }
}
