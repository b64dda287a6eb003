//! Benchmark of the scaling policy (not a test):
//! `cargo run --release -p codalab-worker-manager --example policy_bench`.
//!
//! 1. Ticks and (simulated) seconds from 50 staged bundles to 50 launched workers, with a fake
//!    backend that accepts every submit at once and the default throttling, against Python's
//!    rule of one launch per `--min-seconds-between-workers` (60 s).
//! 2. CPU time of one `plan` call with 10 000 staged bundles and 100 jobs.

use std::time::Instant;

use manager::policy::{
    plan, record_submit, Action, Config, Job, Observation, PolicyState, Shape, StagedBundle,
};

fn main() {
    let shape = Shape::from_flags(1, 0, 2048);
    let mut config = Config::with_default_shape(shape.clone());
    config.min_workers = 0;
    config.max_workers = 50;
    config.min_seconds_between_workers = 60.0;

    // 1. 50 one-CPU bundles, each filling a one-CPU worker.
    let staged: Vec<StagedBundle> = (0..50)
        .map(|i| StagedBundle::new(format!("0x{i:02x}"), 1, 0, 2 << 30))
        .collect();
    let mut state = PolicyState::new(&config);
    let mut jobs: Vec<Job> = Vec::new();
    let (mut now, sleep) = (0.0_f64, 5.0_f64);
    let mut ticks = 0;
    while jobs.len() < 50 && ticks < 10_000 {
        ticks += 1;
        let obs = Observation {
            staged: staged.clone(),
            jobs: Ok(jobs.clone()),
            now,
        };
        let p = plan(&config, &mut state, &obs);
        for a in &p.actions {
            if let Action::Launch { shape, count } = a {
                for _ in 0..*count {
                    jobs.push(
                        Job::pending(format!("job-{}", jobs.len()), shape.clone())
                            .submitted_at(now),
                    );
                    record_submit(&mut state, shape, true, now);
                }
            }
        }
        if jobs.len() < 50 {
            now += sleep;
        }
    }
    let python_seconds = 49.0 * 60.0;
    println!("50 staged bundles -> 50 launched workers (fake backend, --sleep-time 5):");
    println!("  ours:   {ticks} ticks, {now:.0} s of simulated time");
    println!("  Python: 50 ticks at best, {python_seconds:.0} s (one launch per 60 s)");

    // 2. A large tick.
    let staged: Vec<StagedBundle> = (0..10_000)
        .map(|i| {
            StagedBundle::new(
                format!("0x{i:05x}"),
                1 + (i % 4) as u32,
                0,
                (1 + (i % 8) as u64) << 28,
            )
        })
        .collect();
    let mut big = Config::with_default_shape(Shape::from_flags(8, 0, 32 * 1024));
    big.max_workers = 2000;
    big.min_workers = 0;
    let jobs: Vec<Job> = (0..100)
        .map(|i| Job::active(format!("j{i}"), big.shapes[0].name.clone()))
        .collect();
    let obs = Observation {
        staged,
        jobs: Ok(jobs),
        now: 0.0,
    };
    let runs = 20;
    let t0 = Instant::now();
    for _ in 0..runs {
        let mut st = PolicyState::new(&big);
        std::hint::black_box(plan(&big, &mut st, &obs));
    }
    let per = t0.elapsed().as_secs_f64() / runs as f64;
    println!(
        "policy CPU time per tick with 10 000 staged bundles and 100 jobs: {:.2} ms",
        per * 1e3
    );
}
