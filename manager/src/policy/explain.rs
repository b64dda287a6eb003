//! Why each staged bundle is not running yet: one [`BundleWait`] per staged bundle of the
//! observation, derived by [`plan`](super::plan) from what the tick decided (`tick/explain.rs`) and, with
//! several tiers, by [`explain_routes`] from the routing. Pure, like the rest of the policy; the
//! control loop only copies it into `/status`, the page, `status --bundles` and the
//! `waiting_bundles` gauges.

use serde::{Deserialize, Serialize};

use super::{Route, Routing, Shape, StagedBundle, TierView};

/// The kind of a [`WaitReason`], for the `waiting_bundles{reason}` gauges.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum WaitKind {
    WaitingForWorker,
    OverCap,
    OverflowDelay,
    BackingOff,
    Throttled,
    Unschedulable,
    Queued,
}

impl WaitKind {
    /// Every kind, in the order the gauges and tables list them.
    pub const ALL: [WaitKind; 7] = [
        WaitKind::WaitingForWorker,
        WaitKind::OverCap,
        WaitKind::OverflowDelay,
        WaitKind::BackingOff,
        WaitKind::Throttled,
        WaitKind::Unschedulable,
        WaitKind::Queued,
    ];

    /// The snake_case name (the JSON tag and the gauge's `reason` label).
    pub fn name(self) -> &'static str {
        match self {
            WaitKind::WaitingForWorker => "waiting_for_worker",
            WaitKind::OverCap => "over_cap",
            WaitKind::OverflowDelay => "overflow_delay",
            WaitKind::BackingOff => "backing_off",
            WaitKind::Throttled => "throttled",
            WaitKind::Unschedulable => "unschedulable",
            WaitKind::Queued => "queued",
        }
    }
}

/// Which cap holds a bundle's launch back.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CapKind {
    /// `--max-workers` (with tiers: the global one over all tiers).
    MaxWorkers,
    /// A bounded backend's capacity (the `local` machine).
    Capacity,
    /// A tier's own `max-workers`.
    TierMaxWorkers,
    /// A tier's monthly budget is spent.
    TierBudget,
}

/// Which throttle holds a bundle's launch back.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ThrottleKind {
    /// `--min-seconds-between-workers` since the last launch round.
    RoundSpacing,
    /// The token bucket (`launch_burst`, `launch_rate_per_sec`) is empty.
    TokenBucket,
}

/// A request beyond what the largest shape offers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Excess {
    /// `cpus`, `gpus` or `memory` (bytes).
    pub resource: ResourceKind,
    pub requested: u64,
    /// The largest amount any shape offers.
    pub largest: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ResourceKind {
    Cpus,
    Gpus,
    Memory,
}

impl Excess {
    /// `requests 8 GPUs, the largest shape has 4: 4 over`.
    pub fn text(&self) -> String {
        let over = self.requested.saturating_sub(self.largest);
        match self.resource {
            ResourceKind::Cpus => format!(
                "requests {} CPUs, the largest shape has {}: {over} over",
                self.requested, self.largest
            ),
            ResourceKind::Gpus => format!(
                "requests {} GPUs, the largest shape has {}: {over} over",
                self.requested, self.largest
            ),
            ResourceKind::Memory => format!(
                "requests {} memory, the largest shape has {}: {} over",
                size(self.requested),
                size(self.largest),
                size(over)
            ),
        }
    }
}

/// `1.5 GiB`, `512 MiB`.
fn size(b: u64) -> String {
    if b >= 1 << 30 {
        format!("{:.1} GiB", b as f64 / (1u64 << 30) as f64)
    } else {
        format!("{} MiB", b >> 20)
    }
}

/// What `need` asks beyond the largest of `shapes`, resource by resource (empty: each fits the
/// largest on its own, or there is no shape).
pub fn excess_over_largest<'a>(
    shapes: impl IntoIterator<Item = &'a Shape>,
    need: &super::Resources,
) -> Vec<Excess> {
    let mut largest = [0u64; 3];
    let mut any = false;
    for s in shapes {
        any = true;
        let r = s.resources;
        largest[0] = largest[0].max(u64::from(r.cpus));
        largest[1] = largest[1].max(u64::from(r.gpus));
        largest[2] = largest[2].max(r.memory_bytes);
    }
    if !any {
        return Vec::new();
    }
    let requested = [
        u64::from(need.cpus),
        u64::from(need.gpus),
        need.memory_bytes,
    ];
    [ResourceKind::Cpus, ResourceKind::Gpus, ResourceKind::Memory]
        .into_iter()
        .zip(requested.into_iter().zip(largest))
        .filter(|(_, (r, l))| r > l)
        .map(|(resource, (requested, largest))| Excess {
            resource,
            requested,
            largest,
        })
        .collect()
}

/// Why one staged bundle is not running yet, with the data of that reason.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "reason", rename_all = "snake_case")]
pub enum WaitReason {
    /// A worker that can take it is on its way: a pending job of its shape (named when there is
    /// exactly one), or one launched for it at this tick.
    WaitingForWorker {
        shape: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        job_id: Option<String>,
        /// Pending jobs of the shape listed at this tick.
        pending: u32,
        /// Workers of the shape launched at this tick.
        launched: u32,
    },
    /// A cap holds its launch back.
    OverCap {
        cap: CapKind,
        /// The cap, in workers (none for a capacity or a budget).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        max: Option<u64>,
        /// The workers counted against it.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        current: Option<u64>,
    },
    /// It waits for its tier until it has been staged for the tier's `overflow-after`.
    OverflowDelay { tier: String, until: f64 },
    /// Launches are held by the back-off after failed launches or by the circuit breaker.
    BackingOff {
        /// When launches may resume (unknown: a half-open breaker's probe is out).
        until: Option<f64>,
        /// Whether it is the breaker (else the back-off).
        breaker: bool,
    },
    /// Launches are throttled: the round spacing or the token bucket.
    Throttled {
        by: ThrottleKind,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        until: Option<f64>,
    },
    /// No worker of this manager can ever run it: its queue, or a request beyond the largest
    /// shape (`over`, one entry per resource too large).
    Unschedulable {
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        over: Vec<Excess>,
    },
    /// None of the above: e.g. a running worker has room for it and the server has not handed
    /// it over yet, or the backend's jobs could not be listed.
    Queued,
    /// A reason this build does not know (a newer manager's answer).
    #[serde(other)]
    Other,
}

impl WaitReason {
    pub fn kind(&self) -> Option<WaitKind> {
        Some(match self {
            WaitReason::WaitingForWorker { .. } => WaitKind::WaitingForWorker,
            WaitReason::OverCap { .. } => WaitKind::OverCap,
            WaitReason::OverflowDelay { .. } => WaitKind::OverflowDelay,
            WaitReason::BackingOff { .. } => WaitKind::BackingOff,
            WaitReason::Throttled { .. } => WaitKind::Throttled,
            WaitReason::Unschedulable { .. } => WaitKind::Unschedulable,
            WaitReason::Queued => WaitKind::Queued,
            WaitReason::Other => return None,
        })
    }

    /// The snake_case name (`other` for an unknown one).
    pub fn name(&self) -> &'static str {
        self.kind().map_or("other", WaitKind::name)
    }
}

/// One staged bundle and why it is not running yet.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BundleWait {
    pub uuid: String,
    #[serde(flatten)]
    pub reason: WaitReason,
    /// The reason in words (the bundle's uuid is user data: escape it where it is shown).
    pub detail: String,
    /// Unix time since when it waits for this, when known (waiting for a worker: the oldest
    /// pending job of its shape first listed, or this tick's launch).
    #[serde(default)]
    pub since: Option<f64>,
    /// With several tiers: the tier it waits for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tier: Option<String>,
}

impl BundleWait {
    pub fn new(uuid: &str, reason: WaitReason, detail: String, since: Option<f64>) -> Self {
        BundleWait {
            uuid: uuid.to_owned(),
            reason,
            detail,
            since,
            tier: None,
        }
    }
}

/// How many of `waits` have each reason, every kind present (0 when none).
pub fn count_waits(waits: &[BundleWait]) -> Vec<(WaitKind, usize)> {
    WaitKind::ALL
        .iter()
        .map(|&k| {
            (
                k,
                waits.iter().filter(|w| w.reason.kind() == Some(k)).count(),
            )
        })
        .collect()
}

/// What [`explain_routes`] knows of a tier beyond its [`TierView`].
#[derive(Debug, Clone, PartialEq)]
pub struct TierLimits {
    /// Its own `max-workers`.
    pub cap: usize,
    /// Its jobs listed at this tick (pending and running).
    pub workers: usize,
    /// Why it launches nothing at this tick (its view's `can_launch` is false), as a reason.
    pub held: Option<(WaitReason, String)>,
}

/// With several tiers: the explanation of each staged bundle the routing did not hand to a
/// tier's own plan to explain ([`Route::Waits`]: the bundle waits for a tier that cannot take it
/// now; [`Route::Unschedulable`]: no tier has a shape that holds it). `None` for the bundles
/// routed into a tier's room or to a worker opened for them: that tier's [`plan`](super::plan)
/// explains them. `staged` and `routing` as [`route`](super::route) took and gave them; `global` is the global
/// `--max-workers` and the workers counted against it.
pub fn explain_routes(
    tiers: &[TierView],
    limits: &[TierLimits],
    staged: &[(StagedBundle, f64)],
    routing: &Routing,
    global: (usize, usize),
    now: f64,
) -> Vec<Option<BundleWait>> {
    let opened: u32 = routing.opened.iter().sum();
    let global_left = global.0.saturating_sub(global.1 + opened as usize);
    staged
        .iter()
        .zip(&routing.routes)
        .map(|((b, waited), r)| match *r {
            Route::Room(_) | Route::Opened(_) => None,
            Route::Unschedulable => {
                let over = excess_over_largest(tiers.iter().flat_map(|t| &t.shapes), &b.request);
                let detail = if over.is_empty() {
                    "no worker shape of any tier holds all it requests at once".to_string()
                } else {
                    over.iter().map(Excess::text).collect::<Vec<_>>().join("; ")
                };
                Some(BundleWait::new(
                    &b.uuid,
                    WaitReason::Unschedulable { over },
                    detail,
                    None,
                ))
            }
            Route::Waits(i) => {
                let t = &tiers[i];
                let l = &limits[i];
                let fits_later = tiers[i + 1..]
                    .iter()
                    .any(|u| u.shapes.iter().any(|s| s.resources.fits(&b.request)));
                let (reason, detail, since) = if let (false, Some((r, d))) = (t.can_launch, &l.held)
                {
                    (r.clone(), d.clone(), None)
                } else if let Some(after) = t
                    .overflow_after_secs
                    .filter(|a| t.can_launch && fits_later && *waited < *a)
                {
                    let until = now + (after - waited);
                    (
                        WaitReason::OverflowDelay {
                            tier: t.name.clone(),
                            until,
                        },
                        format!(
                            "tier {} is full; a later tier may take it once it has waited {:.0} s",
                            t.name, after
                        ),
                        Some(now - waited),
                    )
                } else if global_left == 0 {
                    (
                        WaitReason::OverCap {
                            cap: CapKind::MaxWorkers,
                            max: Some(global.0 as u64),
                            current: Some(global.1 as u64),
                        },
                        format!(
                            "--max-workers {} reached over all tiers ({} workers)",
                            global.0, global.1
                        ),
                        None,
                    )
                } else {
                    (
                        WaitReason::OverCap {
                            cap: CapKind::TierMaxWorkers,
                            max: Some(l.cap as u64),
                            current: Some(l.workers as u64),
                        },
                        format!(
                            "tier {}'s max-workers {} reached ({} workers)",
                            t.name, l.cap, l.workers
                        ),
                        None,
                    )
                };
                Some(BundleWait {
                    tier: Some(t.name.clone()),
                    ..BundleWait::new(&b.uuid, reason, detail, since)
                })
            }
        })
        .collect()
}

/// With several tiers: one explanation per bundle of `staged`, in its order: the routing's
/// ([`explain_routes`]) where it gave one, else that of the plan of the tier the bundle was
/// routed to (`tier_waits`: each tier's name and its plan's [`BundleWait`]s), naming the tier.
pub fn merge_tier_waits(
    staged: &[(StagedBundle, f64)],
    routing: &Routing,
    route_waits: Vec<Option<BundleWait>>,
    tier_waits: &[(String, Vec<BundleWait>)],
) -> Vec<BundleWait> {
    staged
        .iter()
        .zip(&routing.routes)
        .zip(route_waits)
        .map(|(((b, _), r), w)| {
            if let Some(w) = w {
                return w;
            }
            let tier = r.tier().and_then(|i| tier_waits.get(i));
            let found = tier.and_then(|(name, ws)| {
                let w = ws.iter().find(|w| w.uuid == b.uuid)?;
                Some(BundleWait {
                    tier: Some(name.clone()),
                    ..w.clone()
                })
            });
            found.unwrap_or_else(|| BundleWait {
                tier: tier.map(|(name, _)| name.clone()),
                ..BundleWait::new(
                    &b.uuid,
                    WaitReason::Queued,
                    "routed to a tier that did not plan at this tick".into(),
                    None,
                )
            })
        })
        .collect()
}

#[cfg(test)]
mod tests;
