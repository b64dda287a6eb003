//! The start-up of a manager with several tiers: the `[[tier]]` sections checked, each tier's
//! backend built by its own builder (the same pre-flight check as its subcommand), one client
//! and one login for all, the cost book loaded, then the tiers' loop until SIGTERM.

use std::collections::HashMap;
use std::sync::Arc;

use protocol::{ClientConfig, Credentials, RestClient};
use tokio_util::sync::CancellationToken;

use super::config::{check, TierEntry};
use super::cost::{default_path, CostBook};
use super::run::{Tier, Tiers};
use crate::cli::{BackendCommand, GlobalArgs};
use crate::config::FileConfig;
use crate::control::Exit;
use crate::metrics::Metrics;
use crate::policy::{Config, Shape};
use crate::setup::{build_manager, drive, AnyBackendArgs, Driven, ManagerContext};

pub async fn start(g: &GlobalArgs, shutdown: &CancellationToken) -> anyhow::Result<Exit> {
    let Some(path) = &g.config else {
        anyhow::bail!(
            "name a backend (local, slurm-batch, aws-batch, azure-batch, kubernetes), or give \
             --config with [[tier]] sections for several"
        );
    };
    let file = FileConfig::load(path)?;
    if file.tiers.is_empty() {
        anyhow::bail!(
            "--config {}: no [[tier]] section: name a backend (local, slurm-batch, aws-batch, \
             azure-batch, kubernetes), or add [[tier]] sections for several",
            path.display()
        );
    }
    let commands =
        check(&file.tiers).map_err(|e| anyhow::anyhow!("--config {}: {e}", path.display()))?;
    let locals = commands
        .iter()
        .filter(|c| matches!(c, BackendCommand::Local(_)))
        .count();
    if locals > 1 {
        anyhow::bail!(
            "--config {}: at most one local tier (the local workers of one machine share its \
             job records)",
            path.display()
        );
    }
    let credentials = Credentials::resolve(
        commands
            .iter()
            .find_map(|c| c.args().and_then(|a| a.password_file())),
    )?;
    let client = RestClient::new(ClientConfig::new(g.server.clone()), credentials.clone())?;
    let mut tiers = Vec::new();
    // One registry: each tier's series carry its name.
    let metrics = Arc::new(Metrics::tiers_root());
    for (i, (entry, command)) in file.tiers.iter().zip(&commands).enumerate() {
        let s = Setup {
            g,
            metrics: &metrics,
            file: &file,
            credentials: &credentials,
            client: &client,
            entry,
            first: i == 0,
        };
        let args = command.args().expect("check refuses status");
        let tier = s
            .build(args)
            .await
            .map_err(|e| anyhow::anyhow!("tier {:?}: {e:#}", entry.name))?;
        tiers.push(tier);
    }
    let cost_path = default_path(path);
    let costs = CostBook::load(&cost_path)?;
    let t = Tiers::new(
        client.clone(),
        g.staged_keywords(&credentials.username),
        g.settings(),
        g.max_workers as usize,
        tiers,
        costs,
        Some(cost_path.clone()),
    );
    tracing::info!("costs kept in {}", cost_path.display());
    // A Kubernetes lease is reached with the first kubernetes tier's cluster flags.
    let cluster = commands
        .iter()
        .find_map(|c| c.args().and_then(|a| a.cluster_access()));
    drive(g, &client, shutdown, cluster, t).await
}

impl Driven for Tiers {
    fn metrics(&self) -> Arc<Metrics> {
        self.metrics.clone()
    }

    fn describe(&self) {
        for tier in &self.tiers {
            tracing::info!(
                "tier {}: {} backend, at most {} workers, overflow after {}, shapes {}",
                tier.name,
                backends::Backend::name(&tier.manager.backend),
                tier.cap,
                tier.overflow_after
                    .map_or_else(|| "never".into(), |s| format!("{s} s")),
                tier.manager
                    .config
                    .shapes
                    .iter()
                    .map(|s| s.name.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            );
        }
    }

    fn follow_lease(&mut self, gate: crate::lease::Gate) {
        for t in &mut self.tiers {
            t.manager.lease = Some(gate.clone());
        }
    }

    async fn plan_once(&mut self) -> anyhow::Result<Option<String>> {
        match self.tick(true).await {
            Some(ticks) => Ok(Some(serde_json::to_string_pretty(&ticks)?)),
            None => Ok(None),
        }
    }

    async fn run(&mut self, shutdown: CancellationToken) -> Exit {
        Tiers::run(self, shutdown).await
    }
}

/// What building one tier needs.
struct Setup<'a> {
    g: &'a GlobalArgs,
    metrics: &'a Metrics,
    file: &'a FileConfig,
    credentials: &'a Credentials,
    client: &'a RestClient,
    entry: &'a TierEntry,
    first: bool,
}

impl Setup<'_> {
    /// The tier's policy configuration (its shapes, its cap, the file's knobs, the global
    /// flags; the `--min-workers` floor on the first tier only), then its backend's builder.
    async fn build(&self, args: &dyn AnyBackendArgs) -> anyhow::Result<Tier> {
        let (g, entry) = (self.g, self.entry);
        let flags = args.shape();
        let mut config =
            Config::with_default_shape(Shape::from_flags(flags.cpus, flags.gpus, flags.memory_mb));
        let mut prices = HashMap::new();
        prices.insert("default".to_string(), entry.price_per_hour.unwrap_or(0.0));
        for s in &entry.shapes {
            config.shapes.push(Shape {
                name: s.name.clone(),
                resources: s.resources(),
            });
            prices.insert(
                s.name.clone(),
                s.price_per_hour.or(entry.price_per_hour).unwrap_or(0.0),
            );
        }
        self.file.apply_knobs(&mut config);
        g.apply_policy_flags(&mut config);
        let cap = entry
            .max_workers
            .map_or(g.max_workers, |m| m.min(g.max_workers)) as usize;
        config.max_workers = cap;
        config.min_workers = if self.first {
            config.min_workers.min(cap)
        } else {
            0
        };
        let cx = ManagerContext {
            g,
            credentials: self.credentials,
            client: self.client,
            metrics: Arc::new(self.metrics.tier(&entry.name)),
        };
        let manager = build_manager(args, config, cx).await?;
        // The shapes the backend added cost the tier's price.
        for s in &manager.config.shapes {
            prices
                .entry(s.name.clone())
                .or_insert(entry.price_per_hour.unwrap_or(0.0));
        }
        Ok(Tier {
            name: entry.name.clone(),
            manager,
            cap,
            overflow_after: entry.overflow_after,
            prices,
            budget: entry.budget,
        })
    }
}
