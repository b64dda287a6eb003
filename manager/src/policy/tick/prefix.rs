//! When the first staged bundles of a long list already decide the tick.

use super::*;

/// Whether `staged`, the first bundles of a longer staged list, already decides the tick: for
/// any bundles that may follow, [`plan`] with the whole list takes the same actions as with
/// these. Then the rest need not be read from the server (with 10 000 staged bundles, reading
/// them all costs the server seconds per tick).
///
/// It holds when every shape's demand from these bundles alone covers its pending jobs plus
/// all the room left under `--max-workers`: more bundles only raise demand, so no pending job
/// is cancelled either way, and every shape wants at least the whole budget, which rule 7 then
/// shares out the same way. The demand counted is a lower bound of what packing needs, which
/// more bundles can only raise: per shape and resource, what its bundles request beyond all
/// the free capacity of running workers, in whole workers of the shape. A failed listing
/// decides nothing (no actions), so any prefix does.
pub fn staged_prefix_decides(
    config: &Config,
    staged: &[StagedBundle],
    jobs: &Result<Vec<Job>, String>,
) -> bool {
    let Ok(jobs) = jobs else {
        return true;
    };
    let mut t = Tick::new(config, 0.0);
    let (_, eligible) = t.eligibility_and_shapes(staged);
    t.count_jobs(jobs);
    let room = config.max_workers.saturating_sub(jobs.len()) as u64;
    let mut idle = Resources::default();
    for f in jobs
        .iter()
        .filter(|j| j.state == Occupancy::Active)
        .filter_map(|j| j.free)
    {
        idle.add(&f);
    }
    let mut requested = vec![Resources::default(); t.plans.len()];
    for (b, i, _) in &eligible {
        requested[*i].add(&b.request.min_each(&t.shapes[*i].resources));
    }
    let dims = |r: &Resources| [u64::from(r.cpus), u64::from(r.gpus), r.memory_bytes];
    let idle = dims(&idle);
    t.plans.iter().enumerate().all(|(i, sp)| {
        let (cap, req) = (dims(&t.shapes[i].resources), dims(&requested[i]));
        let lower_bound = (0..3)
            .filter(|&d| cap[d] > 0)
            .map(|d| req[d].saturating_sub(idle[d]).div_ceil(cap[d]))
            .max()
            .unwrap_or(0);
        lower_bound >= u64::from(sp.pending) + room
    })
}
