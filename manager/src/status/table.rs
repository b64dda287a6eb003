//! `cl-worker-manager status`: the model printed as text tables.

use std::fmt::Write as _;

use super::Status;
use crate::policy::Shape;

/// `1.5 GiB`, `512 MiB`.
pub fn bytes(b: u64) -> String {
    const GIB: f64 = (1u64 << 30) as f64;
    if b >= 1 << 30 {
        format!("{:.1} GiB", b as f64 / GIB)
    } else {
        format!("{} MiB", b >> 20)
    }
}

/// `45s`, `3m05s`, `2h10m`.
pub fn duration(secs: f64) -> String {
    let s = secs.max(0.0).round() as u64;
    match s {
        0..60 => format!("{s}s"),
        60..3600 => format!("{}m{:02}s", s / 60, s % 60),
        _ => format!("{}h{:02}m", s / 3600, (s % 3600) / 60),
    }
}

/// The UTC time of day of a unix time, `HH:MM:SSZ`.
pub fn clock(at: f64) -> String {
    let s = at.max(0.0) as u64 % 86_400;
    format!("{:02}:{:02}:{:02}Z", s / 3600, (s % 3600) / 60, s % 60)
}

/// A shape's size, `1 CPU, 0 GPU, 2.0 GiB`.
pub fn shape_size(s: &Shape) -> String {
    format!(
        "{} CPU, {} GPU, {}",
        s.resources.cpus,
        s.resources.gpus,
        bytes(s.resources.memory_bytes)
    )
}

/// The first `left` columns left-aligned, the numbers after them right-aligned, two spaces
/// apart.
fn table(out: &mut String, header: &[&str], rows: &[Vec<String>], left: usize) {
    let mut widths: Vec<usize> = header.iter().map(|h| h.len()).collect();
    for r in rows {
        for (i, c) in r.iter().enumerate() {
            widths[i] = widths[i].max(c.chars().count());
        }
    }
    let line = |cells: Vec<&str>| {
        let mut l = String::from(" ");
        for (i, c) in cells.iter().enumerate() {
            let pad = widths[i] - c.chars().count();
            l.push(' ');
            if i < left {
                l.push_str(c);
                l.push_str(&" ".repeat(pad));
            } else {
                l.push_str(&" ".repeat(pad));
                l.push_str(c);
            }
            l.push(' ');
        }
        l.trim_end().to_string()
    };
    let _ = writeln!(out, "{}", line(header.to_vec()));
    for r in rows {
        let _ = writeln!(out, "{}", line(r.iter().map(String::as_str).collect()));
    }
}

/// The status as a compact text table (as `ray status` prints its cluster), for `now`.
pub fn render_table(s: &Status, now: f64) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "======== cl-worker-manager: {} backend, server {} ========",
        if s.backend.is_empty() {
            "?"
        } else {
            &s.backend
        },
        s.server
    );
    match s.updated_at {
        Some(t) => {
            let _ = writeln!(out, "Last tick:  {} ago ({})", duration(now - t), clock(t));
        }
        None => {
            let _ = writeln!(out, "Last tick:  none yet (logging in or first tick)");
        }
    }
    if !s.tiers.is_empty() {
        let rows: Vec<Vec<String>> = s
            .tiers
            .iter()
            .map(|t| {
                vec![
                    t.name.clone(),
                    t.backend.clone(),
                    format!("{}/{}", t.pending + t.running, t.max_workers),
                    t.running.to_string(),
                    t.routed.to_string(),
                    t.overflow_after_secs.map_or_else(|| "-".into(), duration),
                    format!("{:.2}", t.month_cost),
                    t.budget.map_or_else(|| "-".into(), |b| format!("{b:.2}")),
                    t.held.clone().unwrap_or_else(|| "launching".into()),
                ]
            })
            .collect();
        let _ = writeln!(out);
        table(
            &mut out,
            &[
                "tier",
                "backend",
                "workers/cap",
                "running",
                "routed",
                "overflow after",
                "this month",
                "budget",
                "state",
            ],
            &rows,
            2,
        );
        let _ = writeln!(out, "(the rest: the first tier's)\n");
    }
    let _ = writeln!(out, "Health:     {}", s.health_line());
    let _ = writeln!(out, "Breaker:    {}", s.breaker_line());
    if let Some(l) = s.lease_line() {
        let _ = writeln!(out, "Lease:      {l}");
    }
    if let Some(p) = s.pool_line() {
        let _ = writeln!(out, "Pool:       {p}");
    }
    for p in s.pool_problems() {
        let _ = writeln!(out, "            {p}");
    }

    let unsched = s.plan.as_ref().map_or(&[][..], |p| &p.unschedulable[..]);
    let _ = writeln!(
        out,
        "\nStaged bundles: {} ({})",
        s.staged(),
        s.staged_note()
    );
    let rows: Vec<Vec<String>> = s
        .shapes
        .iter()
        .map(|sh| {
            let p = s.plan.as_ref().and_then(|p| p.shape(&sh.name));
            let n = |f: fn(&crate::policy::ShapePlan) -> u64| p.map_or(0, f).to_string();
            vec![
                sh.name.clone(),
                shape_size(sh),
                n(|p| p.staged as u64),
                n(|p| p.covered_by_idle as u64),
                n(|p| u64::from(p.workers_needed)),
                n(|p| u64::from(p.launch_wanted)),
                n(|p| u64::from(p.throttled)),
                n(|p| u64::from(p.over_capacity)),
            ]
        })
        .collect();
    table(
        &mut out,
        &[
            "shape",
            "size",
            "staged",
            "fit idle",
            "workers needed",
            "to launch",
            "throttled",
            "over capacity",
        ],
        &rows,
        2,
    );
    for u in unsched {
        let _ = writeln!(out, "  unschedulable {}: {}", u.uuid, u.reason);
    }

    let (pending, running): (u32, u32) = s
        .workers
        .iter()
        .fold((0, 0), |(p, r), w| (p + w.pending, r + w.running));
    let _ = writeln!(
        out,
        "\nWorkers: {} ({pending} pending, {running} running; min {}, max {})",
        pending + running,
        s.min_workers,
        s.max_workers
    );
    let rows: Vec<Vec<String>> = s
        .workers
        .iter()
        .map(|w| {
            vec![
                w.shape.clone(),
                w.pending.to_string(),
                w.running.to_string(),
                w.lost_before_checkin.to_string(),
            ]
        })
        .collect();
    table(
        &mut out,
        &["shape", "pending", "running", "lost before check-in"],
        &rows,
        1,
    );

    let _ = writeln!(out, "\nRecent decisions:");
    if s.decisions.is_empty() {
        let _ = writeln!(out, "  (none)");
    }
    let skip = s.decisions.len().saturating_sub(10);
    for d in &s.decisions[skip..] {
        let _ = writeln!(out, "  {}  {}", clock(d.at), d.text);
    }
    out
}
