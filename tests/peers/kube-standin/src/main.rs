//! kube-standin: a Kubernetes API stand-in for tests, on loopback.
//!
//! The object store and API semantics (uids, resourceVersions, 409 AlreadyExists, label
//! selectors, status subresources, patches) are kube-fake-client's in-memory API; `api`
//! serves it over HTTP on the real REST paths, and `agent` plays scheduler and kubelet for
//! fake nodes, running pods' containers in the local Docker engine. See tests/peers/README.md.

mod agent;
mod api;
mod discovery;
mod sched;
mod schema;
mod state;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{bail, Context, Result};
use clap::Parser;
use k8s_openapi::api::apps::v1::{DaemonSet, Deployment};
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{Node, PersistentVolume, PersistentVolumeClaim, Pod, Service};
use kube_fake_client::ClientBuilder;

use agent::{Agent, AgentConfig, NodeArg};
use state::{Faults, Shared};

#[derive(Parser, Debug)]
#[command(
    name = "kube-standin",
    about = "Kubernetes API stand-in (kube-fake-client over HTTP) with a Docker node agent"
)]
struct Args {
    /// Port on 127.0.0.1 (plain HTTP).
    #[arg(long, env = "CLW_K8S_PORT", default_value_t = 16443)]
    port: u16,
    /// File holding the bearer token every request must send (none: no authentication).
    #[arg(long, env = "CLW_K8S_TOKEN_FILE")]
    token_file: Option<PathBuf>,
    /// A fake node: name=N,cpu=4,memory=8Gi,gpu=0,pods=110,ip=127.0.0.1,label.K=V,taint.K=V:EFFECT
    /// (repeat for more nodes).
    #[arg(long = "node", default_value = "name=node-a,cpu=4,memory=8Gi")]
    nodes: Vec<NodeArg>,
    /// Namespaces besides default, kube-system, kube-public and kube-node-lease.
    #[arg(long = "namespace")]
    namespaces: Vec<String>,
    /// Directory for the record of created objects (objects/), claim directories (pvcs/) and
    /// pod volumes (pods/). objects/ is emptied at start.
    #[arg(long)]
    state_dir: PathBuf,
    /// Node agent polling period.
    #[arg(long, default_value_t = 250)]
    tick_ms: u64,
    /// Longest grace period honoured when a pod is deleted (SIGTERM, then SIGKILL).
    #[arg(long, default_value_t = 5)]
    max_grace_seconds: i64,
    /// First back-off after a failed image pull (doubles up to 8 times this).
    #[arg(long, default_value_t = 2000)]
    image_backoff_ms: u64,
}

/// A stable 64-bit hash (FNV-1a) for made-up ids.
pub fn api_hash(s: &str) -> u64 {
    s.bytes().fold(0xcbf29ce484222325u64, |h, b| {
        (h ^ b as u64).wrapping_mul(0x100000001b3)
    })
}

fn instance_id() -> String {
    let mut b = [0u8; 8];
    if let Ok(mut f) = std::fs::File::open("/dev/urandom") {
        use std::io::Read;
        let _ = f.read_exact(&mut b);
    }
    let n = u64::from_le_bytes(b) ^ (std::process::id() as u64) << 32;
    format!("{n:016x}")
}

#[tokio::main]
async fn main() -> Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| "kube_standin=info".into()),
        )
        .with_target(false)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_writer(std::io::stderr)
        .init();
    let args = Args::parse();

    let mut names = std::collections::BTreeSet::new();
    for n in &args.nodes {
        if !names.insert(n.name.clone()) {
            bail!("node {} given twice", n.name);
        }
    }
    let token = match &args.token_file {
        Some(p) => {
            let t =
                std::fs::read_to_string(p).with_context(|| format!("reading {}", p.display()))?;
            let t = t.trim().to_string();
            if t.is_empty() {
                bail!("{} is empty", p.display());
            }
            Some(t)
        }
        None => None,
    };
    let mut namespaces: Vec<String> = ["default", "kube-system", "kube-public", "kube-node-lease"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    for n in &args.namespaces {
        if !namespaces.contains(n) {
            namespaces.push(n.clone());
        }
    }
    let objects_dir = args.state_dir.join("objects");
    let _ = std::fs::remove_dir_all(&objects_dir);
    std::fs::create_dir_all(&objects_dir)
        .with_context(|| format!("creating {}", objects_dir.display()))?;
    let state_dir = std::fs::canonicalize(&args.state_dir)?;

    let client = ClientBuilder::new()
        .with_status_subresource::<Pod>()
        .with_status_subresource::<Node>()
        .with_status_subresource::<PersistentVolumeClaim>()
        .with_status_subresource::<PersistentVolume>()
        .with_status_subresource::<Service>()
        .with_status_subresource::<Job>()
        .with_status_subresource::<Deployment>()
        .with_status_subresource::<DaemonSet>()
        .build()
        .await
        .context("building the in-memory API")?;

    let shared = Arc::new(Shared {
        client,
        token,
        namespaces,
        objects_dir,
        state_dir: state_dir.clone(),
        seq: AtomicU64::new(0),
        faults: Mutex::new(Faults::default()),
        wake: tokio::sync::Notify::new(),
        grace: Mutex::new(Default::default()),
        instance: instance_id(),
        version: (1, 36),
        port: args.port,
    });

    let agent = Agent::new(
        shared.clone(),
        AgentConfig {
            nodes: args.nodes.clone(),
            tick: Duration::from_millis(args.tick_ms.max(20)),
            max_grace: args.max_grace_seconds.max(0),
            image_backoff: Duration::from_millis(args.image_backoff_ms.max(100)),
        },
    )
    .await?;
    let stale = agent.remove_stale_containers(true).await?;
    if stale > 0 {
        tracing::info!("removed {stale} containers left by an earlier run");
    }
    agent.register_nodes().await?;

    let addr = SocketAddr::from(([127, 0, 0, 1], args.port));
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .with_context(|| format!("binding {addr}"))?;
    let app = axum::Router::new()
        .fallback(api::handle)
        .with_state(shared.clone());

    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let agent_task = tokio::spawn(agent.run(stop_rx));
    tracing::info!(
        "kube-standin listening on http://{addr} (Kubernetes v{}.{} API; nodes: {}; state {})",
        shared.version.0,
        shared.version.1,
        args.nodes
            .iter()
            .map(|n| n.name.as_str())
            .collect::<Vec<_>>()
            .join(", "),
        state_dir.display()
    );
    axum::serve(listener, app)
        .with_graceful_shutdown(async {
            let mut term =
                tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
                    .expect("SIGTERM handler");
            tokio::select! {
                _ = term.recv() => {}
                _ = tokio::signal::ctrl_c() => {}
            }
            tracing::info!("stopping");
        })
        .await?;
    let _ = stop_tx.send(true);
    let _ = tokio::time::timeout(Duration::from_secs(15), agent_task).await;
    tracing::info!("stopped");
    Ok(())
}
