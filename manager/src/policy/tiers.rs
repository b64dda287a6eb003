//! Several backends in one manager, in priority order ("tiers"): which tier each staged bundle
//! goes to at this tick. Pure, like the rest of the policy; each tier's own [`plan`] then runs
//! on the bundles routed to it.
//!
//! The rule, bundle by bundle, oldest first:
//! 1. tiers whose shapes cannot hold the bundle are passed over at once;
//! 2. a tier where a running worker or a pending job (or a worker already opened for another
//!    bundle this tick) has room for it takes it, whatever its rank: the server gives a staged
//!    bundle to whichever worker has room, so nothing is launched for it. Of several, the
//!    cheapest (by `price_per_hour`, then rank): the room of dearer tiers is left unused, so it
//!    is their pending jobs that each tier's plan finds unneeded and cancels (scale-down
//!    prefers the most expensive tier);
//! 3. else, in order, a tier that can launch and has room under its cap and the global cap
//!    opens a worker of its smallest shape that fits;
//! 4. otherwise the bundle waits for that tier, unless the tier cannot launch at all (breaker
//!    open, listing failed, budget spent) or the bundle has been staged longer than the tier's
//!    `overflow-after`: then the next tier is tried;
//! 5. a bundle no tier can take now waits for the first tier that fits it; one that fits no
//!    tier is unschedulable.

use std::cmp::Ordering;

use super::{ffd_order, Resources, Shape, StagedBundle};

/// One tier as the routing sees it at this tick.
#[derive(Debug, Clone, PartialEq)]
pub struct TierView {
    pub name: String,
    /// Its worker shapes.
    pub shapes: Vec<Shape>,
    /// A bundle staged longer than this (seconds) that this tier cannot start now may go to a
    /// later tier; `None`: it waits for this tier.
    pub overflow_after_secs: Option<f64>,
    /// Whether the tier can launch at all this tick (its breaker not open, its jobs listed, its
    /// budget not spent).
    pub can_launch: bool,
    /// Workers it may still launch under its own cap (pending jobs counted).
    pub room: u32,
    /// The free capacity of each of its running workers and pending jobs.
    pub free: Vec<Resources>,
    /// What an hour of its dearest shape costs (0: no prices): of several tiers with room for
    /// a bundle, the cheapest takes it.
    pub price_per_hour: f64,
}

/// Where one staged bundle goes, by tier index.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Route {
    /// Into the room of a worker the tier has (running or pending) or opened this tick for
    /// another bundle: nothing launched for it.
    Room(usize),
    /// A worker of the tier is opened for it.
    Opened(usize),
    /// It waits for the tier.
    Waits(usize),
    /// No tier has a shape that holds it.
    Unschedulable,
}

impl Route {
    /// The tier it goes to.
    pub fn tier(self) -> Option<usize> {
        match self {
            Route::Room(i) | Route::Opened(i) | Route::Waits(i) => Some(i),
            Route::Unschedulable => None,
        }
    }
}

/// What the routing decided.
#[derive(Debug, Clone, PartialEq)]
pub struct Routing {
    /// One per bundle, in the order given.
    pub routes: Vec<Route>,
    /// Workers opened per tier (what its plan may launch for these bundles).
    pub opened: Vec<u32>,
}

/// Routes `staged` (each with how long it has been staged, in seconds) to `tiers`;
/// `global_room` is what `--max-workers` still allows over all tiers.
pub fn route(tiers: &[TierView], staged: &[(StagedBundle, f64)], global_room: u32) -> Routing {
    let mut bins: Vec<Vec<Resources>> = tiers.iter().map(|t| t.free.clone()).collect();
    let mut room: Vec<u32> = tiers.iter().map(|t| t.room).collect();
    let mut global = global_room;
    let mut opened = vec![0u32; tiers.len()];
    // The order in which rooms are taken: cheapest first, then by rank.
    let mut by_price: Vec<usize> = (0..tiers.len()).collect();
    by_price.sort_by(|&a, &b| tiers[a].price_per_hour.total_cmp(&tiers[b].price_per_hour));
    let mut routes = vec![Route::Unschedulable; staged.len()];
    // Oldest first; among bundles staged as long, the largest first (first-fit-decreasing).
    let mut order: Vec<usize> = (0..staged.len()).collect();
    order.sort_by(|&a, &b| {
        staged[b]
            .1
            .partial_cmp(&staged[a].1)
            .unwrap_or(Ordering::Equal)
            .then_with(|| ffd_order(&staged[a].0, &staged[b].0))
    });
    for k in order {
        let (bundle, waited) = &staged[k];
        let need = bundle.request;
        let mut chosen = None;
        for &i in &by_price {
            if smallest_fitting(&tiers[i].shapes, &need).is_none() {
                continue;
            }
            if let Some(bin) = bins[i].iter_mut().find(|b| b.fits(&need)) {
                bin.subtract(&need);
                chosen = Some(Route::Room(i));
                break;
            }
        }
        let mut first_fitting = None;
        for (i, t) in tiers.iter().enumerate() {
            if chosen.is_some() {
                break;
            }
            let Some(shape) = smallest_fitting(&t.shapes, &need) else {
                continue;
            };
            first_fitting.get_or_insert(i);
            if t.can_launch && room[i] > 0 && global > 0 {
                let mut bin = shape.resources;
                bin.subtract(&need);
                bins[i].push(bin);
                room[i] -= 1;
                global -= 1;
                opened[i] += 1;
                chosen = Some(Route::Opened(i));
                break;
            }
            let overflows =
                !t.can_launch || t.overflow_after_secs.is_some_and(|after| *waited >= after);
            if !overflows {
                chosen = Some(Route::Waits(i));
                break;
            }
        }
        routes[k] = chosen
            .or(first_fitting.map(Route::Waits))
            .unwrap_or(Route::Unschedulable);
    }
    Routing { routes, opened }
}

/// The smallest of `shapes` that holds `need`.
fn smallest_fitting<'a>(shapes: &'a [Shape], need: &Resources) -> Option<&'a Shape> {
    shapes
        .iter()
        .filter(|s| s.resources.fits(need))
        .min_by(|a, b| a.order_key().cmp(&b.order_key()))
}

#[cfg(test)]
mod tests {
    use super::*;

    const GIB: u64 = 1 << 30;

    fn tier(name: &str, shapes: Vec<Shape>, room: u32, overflow: Option<f64>) -> TierView {
        TierView {
            name: name.into(),
            shapes,
            overflow_after_secs: overflow,
            can_launch: true,
            room,
            free: Vec::new(),
            price_per_hour: 0.0,
        }
    }

    fn cpu(uuid: &str, waited: f64) -> (StagedBundle, f64) {
        (StagedBundle::new(uuid, 1, 0, GIB), waited)
    }

    fn campus_and_cloud() -> Vec<TierView> {
        vec![
            tier(
                "campus",
                vec![Shape::new("cpu", 1, 0, 2 * GIB)],
                1,
                Some(30.0),
            ),
            tier(
                "cloud",
                vec![
                    Shape::new("cpu", 1, 0, 2 * GIB),
                    Shape::new("gpu", 4, 1, 16 * GIB),
                ],
                10,
                None,
            ),
        ]
    }

    #[test]
    fn the_first_tier_fills_to_its_cap_then_the_rest_waits_until_overflow() {
        let tiers = campus_and_cloud();
        let staged = [cpu("a", 40.0), cpu("b", 10.0), cpu("c", 35.0)];
        let r = route(&tiers, &staged, 10);
        // The oldest (a) takes campus's one worker; c has waited past 30 s: cloud; b waits.
        assert_eq!(
            r.routes,
            vec![Route::Opened(0), Route::Waits(0), Route::Opened(1)]
        );
        assert_eq!(r.opened, vec![1, 1]);
    }

    #[test]
    fn what_the_first_tier_cannot_hold_goes_to_the_first_that_can_at_once() {
        let tiers = campus_and_cloud();
        let gpu = (StagedBundle::new("g", 2, 1, 4 * GIB), 0.0);
        let huge = (StagedBundle::new("h", 64, 0, GIB), 0.0);
        let r = route(&tiers, &[gpu, huge], 10);
        assert_eq!(r.routes, vec![Route::Opened(1), Route::Unschedulable]);
        assert_eq!(r.opened, vec![0, 1]);
    }

    #[test]
    fn a_tier_that_cannot_launch_passes_its_bundles_on_at_once() {
        let mut tiers = campus_and_cloud();
        tiers[0].can_launch = false;
        let r = route(&tiers, &[cpu("a", 0.0)], 10);
        assert_eq!(r.routes, vec![Route::Opened(1)]);
        // No tier can launch: the bundle waits for the first that fits.
        tiers[1].can_launch = false;
        let r = route(&tiers, &[cpu("a", 0.0)], 10);
        assert_eq!(r.routes, vec![Route::Waits(0)]);
        assert_eq!(r.opened, vec![0, 0]);
    }

    #[test]
    fn an_idle_worker_is_used_before_any_launch() {
        let mut tiers = campus_and_cloud();
        tiers[0].room = 0;
        tiers[0].free = vec![Resources::new(1, 0, 2 * GIB)];
        let r = route(&tiers, &[cpu("a", 100.0), cpu("b", 100.0)], 10);
        // a (first by uuid) fills the idle worker; b overflows to cloud.
        assert_eq!(r.routes, vec![Route::Room(0), Route::Opened(1)]);
        assert_eq!(r.opened, vec![0, 1]);
        // An idle cloud worker takes a bundle campus could launch for.
        let mut tiers = campus_and_cloud();
        tiers[1].free = vec![Resources::new(4, 1, 16 * GIB)];
        let r = route(&tiers, &[cpu("a", 0.0)], 10);
        assert_eq!(r.routes, vec![Route::Room(1)]);
        assert_eq!(r.opened, vec![0, 0]);
    }

    #[test]
    fn the_global_cap_holds_over_all_tiers() {
        let tiers = campus_and_cloud();
        let staged: Vec<_> = (0..5).map(|i| cpu(&format!("{i}"), 60.0)).collect();
        let r = route(&tiers, &staged, 2);
        assert_eq!(r.opened.iter().sum::<u32>(), 2);
    }

    #[test]
    fn of_several_tiers_with_room_the_cheapest_takes_the_bundle() {
        // Both tiers have a pending job with room; the cloud costs more: campus's room takes
        // the one bundle, so the cloud's pending job is the unneeded one its plan cancels.
        let mut tiers = campus_and_cloud();
        tiers[1].price_per_hour = 3.0;
        for t in &mut tiers {
            t.free = vec![Resources::new(1, 0, 2 * GIB)];
        }
        let r = route(&tiers, &[cpu("a", 0.0)], 10);
        assert_eq!(r.routes, vec![Route::Room(0)]);
        // A cloud listed first but dearer: still campus's room.
        tiers.reverse();
        let r = route(&tiers, &[cpu("a", 0.0)], 10);
        assert_eq!(r.routes, vec![Route::Room(1)]);
        // Without prices, rank decides.
        tiers[0].price_per_hour = 0.0;
        let r = route(&tiers, &[cpu("a", 0.0)], 10);
        assert_eq!(r.routes, vec![Route::Room(0)]);
    }
}
