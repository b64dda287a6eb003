//! Workers that start warm: each worker launched for staged bundles is told their images and
//! dependencies (`--prefetch-image`, `--prefetch-dependency`), which it fetches as it starts,
//! beside its first check-ins, instead of after the server hands it a run. Pure: which bundles
//! each new worker is told of, and the flags that say so. Names of images and bundles only:
//! nothing secret goes into a worker's command line.

use std::collections::HashSet;

use crate::policy::{Resources, StagedBundle};

/// At most this many images per worker (the worker refuses more).
pub const MAX_IMAGES: usize = 16;
/// At most this many dependencies per worker (the worker refuses more).
pub const MAX_DEPENDENCIES: usize = 64;

/// What one new worker is asked to fetch, and for which bundles.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Prefetch {
    pub bundles: Vec<String>,
    pub images: Vec<String>,
    /// `(parent_uuid, parent_path)`.
    pub dependencies: Vec<(String, String)>,
}

impl Prefetch {
    /// The worker's flags: `--prefetch-image IMAGE` and `--prefetch-dependency UUID[:PATH]`
    /// (the path after the first colon; a uuid has none).
    pub fn args(&self) -> Vec<String> {
        let mut out = Vec::new();
        for i in &self.images {
            out.extend(["--prefetch-image".to_string(), i.clone()]);
        }
        for (uuid, path) in &self.dependencies {
            let v = if path.is_empty() {
                uuid.clone()
            } else {
                format!("{uuid}:{path}")
            };
            out.extend(["--prefetch-dependency".to_string(), v]);
        }
        out
    }

    /// Takes `b` if its needs fit within the bounds; whether it did.
    fn take(&mut self, b: &StagedBundle) -> bool {
        let image_new = b.needs.image.as_ref().filter(|i| !self.images.contains(i));
        let deps_new: Vec<_> = b
            .needs
            .dependencies
            .iter()
            .filter(|d| !self.dependencies.contains(d))
            .collect::<HashSet<_>>()
            .into_iter()
            .collect();
        if self.images.len() + usize::from(image_new.is_some()) > MAX_IMAGES
            || self.dependencies.len() + deps_new.len() > MAX_DEPENDENCIES
        {
            return false;
        }
        self.images.extend(image_new.cloned());
        // In the bundle's own order (the set above only removed repeats).
        for d in &b.needs.dependencies {
            if !self.dependencies.contains(d) {
                self.dependencies.push(d.clone());
            }
        }
        self.bundles.push(b.uuid.clone());
        true
    }
}

/// Deals the staged bundles among `workers` new workers of `shape`, in staged order: a bundle
/// goes to the first of them with room left for its request (first fit, as the server would
/// fill them) and within the bounds of what a worker is told; bundles whose request the shape
/// cannot hold, bundles with nothing to fetch and bundles already dealt to a worker launched
/// earlier (`dealt`) are skipped. One entry per worker, possibly empty.
pub fn deal(
    staged: &[StagedBundle],
    shape: &Resources,
    workers: usize,
    dealt: &HashSet<String>,
) -> Vec<Prefetch> {
    let mut out = vec![Prefetch::default(); workers];
    let mut room = vec![*shape; workers];
    for b in staged {
        if dealt.contains(&b.uuid) || b.needs.is_empty() || !shape.fits(&b.request) {
            continue;
        }
        for (p, r) in out.iter_mut().zip(room.iter_mut()) {
            if r.fits(&b.request) && p.take(b) {
                r.subtract(&b.request);
                break;
            }
        }
    }
    out
}

/// A bundle dealt to a new worker is not dealt again for this long while it stays staged (the
/// worker may have been lost before it checked in).
pub const DEALT_FOR_SECS: f64 = 600.0;

/// What the loop keeps between its plan and the launches: the staged bundles of the last plan
/// and the bundles dealt to workers launched before.
#[derive(Debug, Default)]
pub struct Book {
    staged: Vec<StagedBundle>,
    /// bundle uuid → when it was dealt.
    dealt: std::collections::HashMap<String, f64>,
}

impl Book {
    /// The staged bundles the plan is made from; dealt bundles no longer staged, or dealt
    /// long ago, are forgotten.
    pub fn observe(&mut self, staged: &[StagedBundle], now: f64) {
        let live: HashSet<&str> = staged.iter().map(|b| b.uuid.as_str()).collect();
        self.dealt
            .retain(|u, at| live.contains(u.as_str()) && now - *at < DEALT_FOR_SECS);
        self.staged = staged.to_vec();
    }

    /// What each of `workers` new workers of `shape` is told; the bundles are then dealt.
    pub fn deal(&mut self, shape: &Resources, workers: usize, now: f64) -> Vec<Prefetch> {
        let dealt: HashSet<String> = self.dealt.keys().cloned().collect();
        let out = deal(&self.staged, shape, workers, &dealt);
        for p in &out {
            for b in &p.bundles {
                self.dealt.insert(b.clone(), now);
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::Needs;
    use proptest::prelude::*;

    fn bundle(uuid: &str, cpus: u32, image: Option<&str>, deps: &[&str]) -> StagedBundle {
        let mut b = StagedBundle::new(uuid, cpus, 0, 1 << 30);
        b.needs = Needs {
            image: image.map(str::to_owned),
            dependencies: deps
                .iter()
                .map(|d| (d.to_string(), String::new()))
                .collect(),
        };
        b
    }

    #[test]
    fn each_worker_is_told_what_the_bundles_it_would_hold_need() {
        let staged = vec![
            bundle("0xa", 2, Some("img:1"), &["0xd1"]),
            bundle("0xb", 2, Some("img:1"), &["0xd1", "0xd2"]),
            bundle("0xc", 2, Some("img:2"), &[]),
            bundle("0xe", 8, Some("huge"), &["0xd9"]),
        ];
        let shape = Resources::new(4, 0, 8 << 30);
        let out = deal(&staged, &shape, 2, &HashSet::new());
        assert_eq!(out[0].bundles, ["0xa", "0xb"]);
        assert_eq!(out[0].images, ["img:1"]);
        assert_eq!(
            out[0].args(),
            [
                "--prefetch-image",
                "img:1",
                "--prefetch-dependency",
                "0xd1",
                "--prefetch-dependency",
                "0xd2"
            ]
        );
        assert_eq!(out[1].bundles, ["0xc"]);
        assert_eq!(out[1].args(), ["--prefetch-image", "img:2"]);
        // Dealt before: not again.
        let again = deal(&staged, &shape, 1, &["0xa".to_string()].into());
        assert_eq!(again[0].bundles, ["0xb", "0xc"]);
    }

    #[test]
    fn the_book_deals_a_bundle_once_while_it_stays_staged() {
        let staged = vec![bundle("0xa", 1, Some("i"), &[])];
        let shape = Resources::new(1, 0, 1 << 30);
        let mut book = Book::default();
        book.observe(&staged, 0.0);
        assert_eq!(book.deal(&shape, 1, 0.0)[0].bundles, ["0xa"]);
        book.observe(&staged, 10.0);
        assert!(book.deal(&shape, 1, 10.0)[0].bundles.is_empty());
        // Long after, or once it left and came back, it is dealt again.
        book.observe(&staged, DEALT_FOR_SECS + 1.0);
        assert_eq!(book.deal(&shape, 1, 0.0)[0].bundles, ["0xa"]);
        book.observe(&[], 1.0);
        book.observe(&staged, 2.0);
        assert_eq!(book.deal(&shape, 1, 2.0)[0].bundles, ["0xa"]);
    }

    #[test]
    fn a_dependency_path_follows_the_first_colon() {
        let mut b = bundle("0xa", 1, None, &[]);
        b.needs.dependencies = vec![("0xd".into(), "a:b/c".into())];
        let out = deal(&[b], &Resources::new(1, 0, 1 << 30), 1, &HashSet::new());
        assert_eq!(out[0].args(), ["--prefetch-dependency", "0xd:a:b/c"]);
    }

    proptest! {
        /// Whatever is staged: no worker is told more than the bounds, no bundle is dealt
        /// twice, every bundle dealt fits the room its worker had, and everything a worker is
        /// told comes from the bundles dealt to it.
        #[test]
        fn the_deal_keeps_its_bounds(
            bundles in proptest::collection::vec(
                (1u32..6, proptest::option::of(0u8..40), proptest::collection::vec(0u8..120, 0..30)),
                0..60,
            ),
            workers in 0usize..5,
            cpus in 1u32..9,
        ) {
            let staged: Vec<_> = bundles
                .iter()
                .enumerate()
                .map(|(i, (c, img, deps))| {
                    let mut b = StagedBundle::new(format!("0x{i}"), *c, 0, 1 << 20);
                    b.needs.image = img.map(|n| format!("img{n}"));
                    b.needs.dependencies = deps.iter().map(|d| (format!("0xd{d}"), String::new())).collect();
                    b
                })
                .collect();
            let shape = Resources::new(cpus, 0, 1 << 30);
            let out = deal(&staged, &shape, workers, &HashSet::new());
            prop_assert_eq!(out.len(), workers);
            let mut seen = HashSet::new();
            for p in &out {
                prop_assert!(p.images.len() <= MAX_IMAGES);
                prop_assert!(p.dependencies.len() <= MAX_DEPENDENCIES);
                let mine: Vec<_> = staged.iter().filter(|b| p.bundles.contains(&b.uuid)).collect();
                prop_assert!(mine.iter().map(|b| b.request.cpus).sum::<u32>() <= cpus);
                for b in &mine {
                    prop_assert!(seen.insert(b.uuid.clone()));
                }
                for i in &p.images {
                    prop_assert!(mine.iter().any(|b| b.needs.image.as_ref() == Some(i)));
                }
                for d in &p.dependencies {
                    prop_assert!(mine.iter().any(|b| b.needs.dependencies.contains(d)));
                }
                let distinct: HashSet<_> = p.dependencies.iter().collect();
                prop_assert_eq!(distinct.len(), p.dependencies.len());
            }
        }
    }
}
