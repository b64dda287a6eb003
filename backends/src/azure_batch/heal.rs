//! The pool's self-healing, as a pure decision: which of the pool's unhealthy nodes to remove.
//!
//! A node `unusable` (its agent lost, its disk full, its VM broken) or `starttaskfailed` (the
//! pool's start task failed on it) takes no task, yet it holds its place in the pool, and an
//! autoscale formula counts it. Azure does not replace it by itself: the manager removes it
//! once it has been in that state for the grace period (`--remove-unhealthy-nodes-after`),
//! and the pool's target brings a fresh node. Removal needs a `steady` pool, takes at most
//! 100 nodes per request, and is asked once per node (a node asked for is `leavingpool` soon
//! after, and out of the listing).

use std::collections::HashMap;

/// The node states that are removed after the grace period.
pub const UNHEALTHY: [&str; 2] = ["unusable", "starttaskfailed"];
/// Nodes per *Remove Nodes* request (the service's limit).
pub const MAX_PER_REQUEST: usize = 100;
/// A removal asked for is not asked again for this long (seconds).
pub const ASK_AGAIN_AFTER: f64 = 300.0;

/// An unhealthy node as listed, at the manager's clock.
#[derive(Debug, Clone, PartialEq)]
pub struct Sick {
    pub id: String,
    pub state: String,
    /// Since when (seconds since the epoch) the node is in `state`: the service's
    /// `stateTransitionTime`, or when the manager first saw it so.
    pub since: f64,
}

/// The memory between listings: when each node was first seen unhealthy (for nodes the
/// service gives no time for) and when its removal was asked.
#[derive(Debug, Default, Clone)]
pub struct Memory {
    first_seen: HashMap<String, f64>,
    asked: HashMap<String, f64>,
}

impl Memory {
    /// The listing's nodes with their `since`: `transition` is the service's time of each
    /// node's state, if it gave one that parses. Nodes no longer listed are forgotten.
    pub fn observe(&mut self, listed: &[(String, String, Option<f64>)], now: f64) -> Vec<Sick> {
        let sick = |id: &String| {
            listed
                .iter()
                .any(|(n, s, _)| n == id && UNHEALTHY.contains(&s.as_str()))
        };
        self.first_seen.retain(|id, _| sick(id));
        self.asked
            .retain(|id, at| now - *at < ASK_AGAIN_AFTER && sick(id));
        listed
            .iter()
            .filter(|(_, state, _)| UNHEALTHY.contains(&state.as_str()))
            .map(|(id, state, transition)| {
                let seen = *self.first_seen.entry(id.clone()).or_insert(now);
                Sick {
                    id: id.clone(),
                    state: state.clone(),
                    // A service time in the future (clock skew) counts from the first sight.
                    since: transition.filter(|t| *t <= now).unwrap_or(seen),
                }
            })
            .collect()
    }

    /// The nodes to remove now (one request's worth), noted as asked. Nothing while the pool
    /// is not `steady`, or with no grace (`None`: self-healing off).
    pub fn to_remove(
        &mut self,
        sick: &[Sick],
        now: f64,
        grace: Option<f64>,
        steady: bool,
    ) -> Vec<Sick> {
        let Some(grace) = grace else {
            return Vec::new();
        };
        if !steady {
            return Vec::new();
        }
        let mut due: Vec<Sick> = sick
            .iter()
            .filter(|s| now - s.since >= grace && !self.asked.contains_key(&s.id))
            .cloned()
            .collect();
        // The longest-broken first.
        due.sort_by(|a, b| a.since.total_cmp(&b.since).then(a.id.cmp(&b.id)));
        due.truncate(MAX_PER_REQUEST);
        for s in &due {
            self.asked.insert(s.id.clone(), now);
        }
        due
    }

    /// A refused removal may be asked again at the next listing.
    pub fn refused(&mut self, ids: &[String]) {
        for id in ids {
            self.asked.remove(id);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn listed(v: &[(&str, &str, Option<f64>)]) -> Vec<(String, String, Option<f64>)> {
        v.iter()
            .map(|(a, b, c)| (a.to_string(), b.to_string(), *c))
            .collect()
    }

    fn ids(v: &[Sick]) -> Vec<&str> {
        v.iter().map(|s| s.id.as_str()).collect()
    }

    #[test]
    fn only_unhealthy_states_past_the_grace_are_removed() {
        let mut m = Memory::default();
        let l = listed(&[
            ("a", "unusable", Some(100.0)),
            ("b", "starttaskfailed", Some(200.0)),
            ("c", "idle", Some(0.0)),
            ("d", "running", Some(0.0)),
            ("e", "leavingpool", Some(0.0)),
        ]);
        let sick = m.observe(&l, 700.0);
        assert_eq!(ids(&sick), ["a", "b"]);
        assert_eq!(ids(&m.to_remove(&sick, 700.0, Some(600.0), true)), ["a"]);
        // Asked once: not again at the next listing, though still listed.
        let sick = m.observe(&l, 850.0);
        assert_eq!(ids(&m.to_remove(&sick, 850.0, Some(600.0), true)), ["b"]);
        assert!(m.to_remove(&sick, 851.0, Some(600.0), true).is_empty());
    }

    #[test]
    fn nothing_while_resizing_or_with_healing_off() {
        let mut m = Memory::default();
        let sick = m.observe(&listed(&[("a", "unusable", Some(0.0))]), 1000.0);
        assert!(m.to_remove(&sick, 1000.0, Some(10.0), false).is_empty());
        assert!(m.to_remove(&sick, 1000.0, None, true).is_empty());
        // Not noted as asked: removed once the pool is steady.
        assert_eq!(ids(&m.to_remove(&sick, 1001.0, Some(10.0), true)), ["a"]);
    }

    #[test]
    fn without_a_service_time_the_grace_counts_from_the_first_sight() {
        let mut m = Memory::default();
        let l = listed(&[("a", "unusable", None), ("b", "unusable", Some(5000.0))]);
        let sick = m.observe(&l, 1000.0);
        // b's time is ahead of our clock: counted from now too.
        assert_eq!(sick[0].since, 1000.0);
        assert_eq!(sick[1].since, 1000.0);
        assert!(m.to_remove(&sick, 1000.0, Some(60.0), true).is_empty());
        let sick = m.observe(&l, 1059.0);
        assert!(m.to_remove(&sick, 1059.0, Some(60.0), true).is_empty());
        let sick = m.observe(&l, 1060.0);
        assert_eq!(
            ids(&m.to_remove(&sick, 1060.0, Some(60.0), true)),
            ["a", "b"]
        );
    }

    #[test]
    fn a_node_that_recovers_starts_its_grace_again() {
        let mut m = Memory::default();
        m.observe(&listed(&[("a", "unusable", None)]), 0.0);
        m.observe(&listed(&[("a", "idle", None)]), 50.0);
        // Listed healthy in between: forgotten, then first seen again at 60.
        m.observe(&listed(&[]), 55.0);
        let sick = m.observe(&listed(&[("a", "unusable", None)]), 60.0);
        assert!(m.to_remove(&sick, 100.0, Some(60.0), true).is_empty());
        assert_eq!(ids(&m.to_remove(&sick, 120.0, Some(60.0), true)), ["a"]);
    }

    #[test]
    fn at_most_one_request_of_the_longest_broken_and_refusals_are_asked_again() {
        let mut m = Memory::default();
        let l: Vec<_> = (0..150)
            .map(|i| {
                (
                    format!("n{i:03}"),
                    "unusable".to_string(),
                    Some(f64::from(149 - i)),
                )
            })
            .collect();
        let sick = m.observe(&l, 1000.0);
        let first = m.to_remove(&sick, 1000.0, Some(0.0), true);
        assert_eq!(first.len(), MAX_PER_REQUEST);
        assert_eq!(first[0].id, "n149");
        let first_ids: Vec<String> = first.iter().map(|s| s.id.clone()).collect();
        m.refused(&first_ids[..10]);
        let second = m.to_remove(&sick, 1001.0, Some(0.0), true);
        assert_eq!(second.len(), 60);
        // After ASK_AGAIN_AFTER a removal that did not happen is asked again.
        let sick = m.observe(&l, 1000.0 + ASK_AGAIN_AFTER + 1.0);
        assert_eq!(
            m.to_remove(&sick, 1000.0 + ASK_AGAIN_AFTER + 1.0, Some(0.0), true)
                .len(),
            MAX_PER_REQUEST
        );
    }
}
