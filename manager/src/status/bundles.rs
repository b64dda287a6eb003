//! The staged bundles' explanations in the status: bounded for `/status`, and printed by
//! `cl-worker-manager status --bundles`.

use std::fmt::Write as _;

use super::{clock, Status};
use crate::policy::BundleWait;

/// The most bundles `/status` explains one by one; the rest are only counted
/// (`bundles_unlisted`).
pub const BUNDLES_MAX: usize = 500;

/// The first [`BUNDLES_MAX`] of `waits`, and how many staged bundles are left out: the rest of
/// `waits` and the `unread` ones (counted by the server, not read at this tick).
pub fn bounded(waits: &[BundleWait], unread: u64) -> (Vec<BundleWait>, u64) {
    let shown = waits.len().min(BUNDLES_MAX);
    let left = (waits.len() - shown) as u64 + unread;
    (waits[..shown].to_vec(), left)
}

/// A uuid's first 10 characters (as `cl` prints them).
pub fn short_uuid(uuid: &str) -> String {
    uuid.chars().take(10).collect()
}

/// `since` as a time of day, `-` when unknown.
pub fn since_text(since: Option<f64>) -> String {
    since.map_or_else(|| "-".into(), clock)
}

impl Status {
    /// The "Waiting bundles" table of `status --bundles`: one line per explained bundle (uuid,
    /// reason, since, tier with several, detail), then how many were left out.
    pub fn bundles_table(&self) -> String {
        let mut out = String::new();
        let _ = writeln!(
            out,
            "\nWaiting bundles: {}",
            self.bundles.len() as u64 + self.bundles_unlisted
        );
        if self.bundles.is_empty() && self.bundles_unlisted == 0 {
            let _ = writeln!(out, "  (none)");
            return out;
        }
        let tiers = self.bundles.iter().any(|b| b.tier.is_some());
        let rows: Vec<[String; 4]> = self
            .bundles
            .iter()
            .map(|b| {
                [
                    b.uuid.clone(),
                    b.reason.name().to_string(),
                    since_text(b.since),
                    b.tier.clone().unwrap_or_else(|| "-".into()),
                ]
            })
            .collect();
        let width = |i: usize, head: &str| {
            rows.iter()
                .map(|r| r[i].chars().count())
                .max()
                .unwrap_or(0)
                .max(head.len())
        };
        let heads = ["uuid", "reason", "since", "tier"];
        let widths: Vec<usize> = heads.iter().enumerate().map(|(i, h)| width(i, h)).collect();
        let cols = if tiers { 4 } else { 3 };
        let line = |cells: [&str; 4], detail: &str| {
            let mut l = String::from(" ");
            for i in 0..cols {
                let pad = widths[i] - cells[i].chars().count();
                let _ = write!(l, " {}{} ", cells[i], " ".repeat(pad));
            }
            l.push(' ');
            l.push_str(detail);
            l.trim_end().to_string()
        };
        let _ = writeln!(out, "{}", line(heads, "detail"));
        for (r, b) in rows.iter().zip(&self.bundles) {
            let cells = [r[0].as_str(), r[1].as_str(), r[2].as_str(), r[3].as_str()];
            let _ = writeln!(out, "{}", line(cells, &b.detail));
        }
        if self.bundles_unlisted > 0 {
            let _ = writeln!(
                out,
                "  … and {} more (past the first {BUNDLES_MAX}, or counted but not read)",
                self.bundles_unlisted
            );
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::WaitReason;

    fn wait(uuid: &str, reason: WaitReason, detail: &str, since: Option<f64>) -> BundleWait {
        BundleWait::new(uuid, reason, detail.into(), since)
    }

    #[test]
    fn the_list_is_bounded_and_the_rest_counted() {
        let waits: Vec<BundleWait> = (0..BUNDLES_MAX + 7)
            .map(|i| wait(&format!("0x{i}"), WaitReason::Queued, "", None))
            .collect();
        let (shown, left) = bounded(&waits, 3);
        assert_eq!(shown.len(), BUNDLES_MAX);
        assert_eq!(shown[0].uuid, "0x0");
        assert_eq!(left, 7 + 3);
        let (shown, left) = bounded(&waits[..2], 0);
        assert_eq!((shown.len(), left), (2, 0));
    }

    #[test]
    fn the_bundles_table_lists_each_bundle_with_its_reason() {
        let mut s = Status {
            bundles: vec![
                wait(
                    "0xaaaaaaaaaaaaaaaa",
                    WaitReason::Unschedulable { over: Vec::new() },
                    "requests 8 GPUs, the largest shape has 4: 4 over",
                    None,
                ),
                wait(
                    "0xbb",
                    WaitReason::WaitingForWorker {
                        shape: "default".into(),
                        job_id: Some("17".into()),
                        pending: 1,
                        launched: 0,
                    },
                    "pending job 17 of shape default can take it",
                    Some(3_600.0),
                ),
            ],
            bundles_unlisted: 4,
            ..Default::default()
        };
        let t = s.bundles_table();
        let lines: Vec<&str> = t.lines().collect();
        assert_eq!(lines[1], "Waiting bundles: 6", "{t}");
        assert_eq!(
            lines[2].split_whitespace().collect::<Vec<_>>(),
            ["uuid", "reason", "since", "detail"],
            "{t}"
        );
        assert_eq!(
            lines[3],
            "  0xaaaaaaaaaaaaaaaa  unschedulable       -          requests 8 GPUs, the largest \
             shape has 4: 4 over",
            "{t}"
        );
        assert_eq!(
            lines[4],
            "  0xbb                waiting_for_worker  01:00:00Z  pending job 17 of shape default \
             can take it",
            "{t}"
        );
        assert!(lines[5].contains("and 4 more"), "{t}");
        // With tiers: a tier column.
        s.bundles[1].tier = Some("campus".into());
        let t = s.bundles_table();
        assert!(t.contains(" tier "), "{t}");
        assert!(t.contains("  campus  pending job 17"), "{t}");
        // None waiting.
        let t = Status::default().bundles_table();
        assert!(t.contains("Waiting bundles: 0\n  (none)"), "{t}");
    }
}
