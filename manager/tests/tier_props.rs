//! Property tests of the cross-tier routing (`policy::tiers::route`): no tier above its cap nor
//! all of them above the global one, no launch on a tier that cannot, overflow never before its
//! time, a free worker always used before any launch (the cheapest tier's, of several).

use manager::policy::{route, Resources, Route, Shape, StagedBundle, TierView};
use proptest::prelude::*;

const GIB: u64 = 1 << 30;

fn shape_pool() -> Vec<Shape> {
    vec![
        Shape::new("small", 1, 0, 2 * GIB),
        Shape::new("big", 8, 0, 32 * GIB),
        Shape::new("gpu", 8, 2, 64 * GIB),
    ]
}

fn arb_resources() -> impl Strategy<Value = Resources> {
    (0u32..9, 0u32..3, 0u64..65).prop_map(|(c, g, m)| Resources::new(c, g, m * GIB))
}

fn arb_tier() -> impl Strategy<Value = TierView> {
    (
        proptest::sample::subsequence(shape_pool(), 1..=3),
        prop_oneof![Just(None), (0.0f64..120.0).prop_map(Some)],
        prop_oneof![4 => Just(true), 1 => Just(false)],
        0u32..4,
        proptest::collection::vec(arb_resources(), 0..3),
        prop_oneof![Just(0.0), Just(0.5), Just(3.0)],
    )
        .prop_map(
            |(shapes, overflow, can_launch, room, free, price)| TierView {
                name: String::new(),
                shapes,
                overflow_after_secs: overflow,
                can_launch,
                room,
                free,
                price_per_hour: price,
            },
        )
}

fn arb_staged() -> impl Strategy<Value = Vec<(StagedBundle, f64)>> {
    proptest::collection::vec(((1u32..10, 0u32..3, 1u64..70), 0.0f64..200.0), 0..12).prop_map(|v| {
        v.into_iter()
            .enumerate()
            .map(|(i, ((c, g, m), w))| (StagedBundle::new(format!("b{i:02}"), c, g, m * GIB), w))
            .collect()
    })
}

fn fits(t: &TierView, need: &Resources) -> bool {
    t.shapes.iter().any(|s| s.resources.fits(need))
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(3000))]

    #[test]
    fn caps_hold_and_only_able_tiers_launch(
        tiers in proptest::collection::vec(arb_tier(), 1..4),
        staged in arb_staged(),
        global in 0u32..8,
    ) {
        let r = route(&tiers, &staged, global);
        prop_assert_eq!(r.routes.len(), staged.len());
        prop_assert!(r.opened.iter().sum::<u32>() <= global);
        for (t, &n) in tiers.iter().zip(&r.opened) {
            prop_assert!(n <= t.room);
            prop_assert!(n == 0 || t.can_launch);
        }
        // Each opened worker is one bundle's.
        for (i, &n) in r.opened.iter().enumerate() {
            let opened_for = r.routes.iter().filter(|x| **x == Route::Opened(i)).count();
            prop_assert_eq!(n as usize, opened_for);
        }
    }

    #[test]
    fn overflow_never_before_its_time(
        tiers in proptest::collection::vec(arb_tier(), 1..4),
        staged in arb_staged(),
        global in 0u32..8,
    ) {
        let r = route(&tiers, &staged, global);
        for ((b, waited), route) in staged.iter().zip(&r.routes) {
            let need = b.request;
            match *route {
                Route::Unschedulable => {
                    prop_assert!(!tiers.iter().any(|t| fits(t, &need)));
                }
                // Into a worker's room: nothing launched, whatever the tier's rank.
                Route::Room(j) => prop_assert!(fits(&tiers[j], &need)),
                Route::Opened(j) | Route::Waits(j) => {
                    prop_assert!(fits(&tiers[j], &need));
                    // Every earlier tier that could hold it was unable to launch, or the
                    // bundle had waited past that tier's overflow-after; else it would have
                    // launched or waited there.
                    for t in tiers[..j].iter().filter(|t| fits(t, &need)) {
                        prop_assert!(
                            !t.can_launch
                                || t.overflow_after_secs.is_some_and(|o| *waited >= o),
                            "{} passed over before its time ({waited} s)", b.uuid
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn a_free_worker_is_used_before_any_launch(
        tiers in proptest::collection::vec(arb_tier(), 1..4),
        bundle in ((1u32..10, 0u32..3, 1u64..70), 0.0f64..200.0),
        global in 0u32..8,
    ) {
        let ((c, g, m), waited) = bundle;
        let b = StagedBundle::new("one", c, g, m * GIB);
        let need = b.request;
        let r = route(&tiers, &[(b, waited)], global);
        // The cheapest tier with room for it, the first of those as cheap.
        let with_room = tiers
            .iter()
            .enumerate()
            .filter(|(_, t)| fits(t, &need) && t.free.iter().any(|f| f.fits(&need)))
            .min_by(|(i, a), (j, b)| {
                a.price_per_hour.total_cmp(&b.price_per_hour).then(i.cmp(j))
            })
            .map(|(i, _)| i);
        if let Some(i) = with_room {
            prop_assert_eq!(r.routes[0], Route::Room(i));
            prop_assert_eq!(r.opened.iter().sum::<u32>(), 0);
        }
    }
}
