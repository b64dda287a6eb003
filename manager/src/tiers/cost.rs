//! What the tiers' workers cost: worker-seconds of running workers times their shape's price,
//! per tier and shape, all-time and for the current calendar month (UTC, the budget's period).
//! Kept in a small JSON file across manager restarts, written atomically after each tick.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// Longest gap between two ticks that is charged: a manager that was down does not know what
/// its workers did meanwhile (they exit when idle), and a clock jump is not a bill.
pub const MAX_GAP_SECS: f64 = 300.0;

/// Worker-seconds and cost of one tier and shape.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct Spent {
    pub worker_seconds: f64,
    pub cost: f64,
}

/// The cost ledger of every tier.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct CostBook {
    /// `YYYY-MM` of `month`.
    pub month_of: String,
    /// Tier → shape → this month's.
    pub month: BTreeMap<String, BTreeMap<String, Spent>>,
    /// Tier → shape → since the file was made.
    pub total: BTreeMap<String, BTreeMap<String, Spent>>,
    /// Unix time of the last accrual.
    pub last_at: Option<f64>,
}

/// `YYYY-MM` (UTC) of a Unix time.
pub fn month_of(unix: f64) -> String {
    let ts = jiff::Timestamp::from_second(unix as i64).unwrap_or(jiff::Timestamp::UNIX_EPOCH);
    ts.strftime("%Y-%m").to_string()
}

impl CostBook {
    /// Reads the file; a missing file is an empty book, an unreadable one an error.
    pub fn load(path: &Path) -> anyhow::Result<Self> {
        match std::fs::read(path) {
            Ok(bytes) => serde_json::from_slice(&bytes)
                .map_err(|e| anyhow::anyhow!("cost file {}: {e}", path.display())),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Self::default()),
            Err(e) => Err(anyhow::anyhow!("cost file {}: {e}", path.display())),
        }
    }

    pub fn save(&self, path: &Path) -> std::io::Result<()> {
        let bytes = serde_json::to_vec_pretty(self).map_err(std::io::Error::other)?;
        common::write_atomic(path, &bytes, None)
    }

    /// Charges the time since the last accrual (at most [`MAX_GAP_SECS`]) for `running`:
    /// (tier, shape, workers running, price per hour). A new month starts its own sums.
    /// Returns the seconds charged per worker.
    pub fn accrue(&mut self, now: f64, running: &[(String, String, u32, f64)]) -> f64 {
        let month = month_of(now);
        if month != self.month_of {
            self.month_of = month;
            self.month.clear();
        }
        let dt = match self.last_at {
            Some(t) if now > t => (now - t).min(MAX_GAP_SECS),
            _ => 0.0,
        };
        self.last_at = Some(now);
        for (tier, shape, n, price) in running {
            let secs = dt * f64::from(*n);
            for book in [&mut self.month, &mut self.total] {
                let s = book
                    .entry(tier.clone())
                    .or_default()
                    .entry(shape.clone())
                    .or_default();
                s.worker_seconds += secs;
                s.cost += secs * price / 3600.0;
            }
        }
        dt
    }

    /// What `tier` spent since the file was made.
    pub fn total_cost(&self, tier: &str) -> f64 {
        self.total
            .get(tier)
            .map_or(0.0, |m| m.values().map(|s| s.cost).sum())
    }

    /// What `tier` spent this month.
    pub fn month_cost(&self, tier: &str) -> f64 {
        self.month
            .get(tier)
            .map_or(0.0, |m| m.values().map(|s| s.cost).sum())
    }
}

/// Where the cost file lives: beside the manager's own state, in `$CODALAB_HOME` or
/// `~/.codalab` (CodaLab's home), named after the configuration file.
pub fn default_path(config: &Path) -> PathBuf {
    let home = std::env::var_os("CODALAB_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".codalab")))
        .unwrap_or_else(|| PathBuf::from("."));
    let stem = config
        .file_stem()
        .map_or("tiers".into(), |s| s.to_string_lossy().into_owned());
    home.join(format!("cl-worker-manager-{stem}-cost.json"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(tier: &str, shape: &str, n: u32, price: f64) -> (String, String, u32, f64) {
        (tier.into(), shape.into(), n, price)
    }

    #[test]
    fn running_workers_are_charged_by_the_second_and_months_restart() {
        // 2026-11-30T23:59:00Z
        let t0 = 1_796_083_140.0;
        let mut b = CostBook::default();
        b.accrue(t0, &[run("cloud", "gpu", 2, 3.6)]);
        assert_eq!(b.month_cost("cloud"), 0.0, "nothing before the first tick");
        b.accrue(t0 + 30.0, &[run("cloud", "gpu", 2, 3.6)]);
        // 2 workers × 30 s × 3.6/h = 0.06.
        assert!((b.month_cost("cloud") - 0.06).abs() < 1e-9);
        assert_eq!(b.month_of, "2026-11");
        // A gap past MAX_GAP_SECS is charged MAX_GAP_SECS; December starts at zero.
        b.accrue(t0 + 10_000.0, &[run("cloud", "gpu", 1, 3.6)]);
        assert_eq!(b.month_of, "2026-12");
        assert!((b.month_cost("cloud") - 0.3).abs() < 1e-9);
        let total = b.total["cloud"]["gpu"];
        assert!((total.worker_seconds - 360.0).abs() < 1e-9);
        assert!((total.cost - 0.36).abs() < 1e-9);
    }

    #[test]
    fn the_book_survives_a_restart() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("cost.json");
        assert_eq!(CostBook::load(&path).unwrap(), CostBook::default());
        let mut b = CostBook::default();
        b.accrue(1_796_083_140.0, &[]);
        b.accrue(1_796_083_200.0, &[run("campus", "default", 1, 0.0)]);
        b.save(&path).unwrap();
        assert_eq!(CostBook::load(&path).unwrap(), b);
        std::fs::write(&path, "{").unwrap();
        assert!(CostBook::load(&path).is_err());
    }
}
