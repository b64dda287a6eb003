//! Watching a running run: its exit as soon as it happens, and its stats.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use backon::{BlockingRetryable, ConstantBuilder, Retryable};

use super::state::{now_unix, Event, Stats, MAX_BUNDLE_ENTRIES, MAX_BUNDLE_NAME_BYTES};
use crate::nofollow::walk::Budget;
use crate::nofollow::{tree, Dir};
use crate::runtime::{BundleRuntime, RuntimeError, Sample};

/// Watches a running container: reports its exit as soon as it happens, and stats every 2 s.
pub async fn monitor<R: BundleRuntime>(
    runtime: R,
    id: String,
    bundle_path: PathBuf,
    send: impl Fn(Event) + Send + Sync + 'static,
) {
    let mut wait = Box::pin(runtime.wait(&id));
    let mut prev: Option<Sample> = None;
    let mut next_disk = Instant::now();
    let mut started_at: Option<f64> = None;
    // The runtime could not be reached after the wait broke (e.g. the engine restarting).
    let mut engine_lost = false;
    // The first sample 2 s in: a tick's body (an inspection, a sample) holds up the exit's
    // handling while it runs, and the engine answers a container's inspection only once it has
    // torn the container down.
    let mut ticker = tokio::time::interval_at(
        tokio::time::Instant::now() + Duration::from_secs(2),
        Duration::from_secs(2),
    );
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = &mut wait => {
                // Exited (or the wait broke): read the final state, a few tries a second
                // apart while the runtime does not answer.
                let mut lost = false;
                let inspected = (|| runtime.inspect(&id))
                    .retry(
                        ConstantBuilder::default()
                            .with_delay(Duration::from_secs(1))
                            .with_max_times(4),
                    )
                    .sleep(tokio::time::sleep)
                    .notify(|e: &RuntimeError, _| {
                        lost |= matches!(e, RuntimeError::Unavailable(_));
                        tracing::warn!("cannot inspect container {id}, retrying: {e}");
                    })
                    .await;
                engine_lost |= lost;
                match inspected {
                    Ok(Some(st)) if !st.running => {
                        let total = match (st.started_at, st.finished_at) {
                            (Some(s), Some(f)) => (f - s).max(0.0),
                            _ => 0.0,
                        };
                        // Measured once more: a run that wrote past its disk limit and exited
                        // before the next sample must not slip through.
                        let p = bundle_path.clone();
                        let (disk_bytes, disk_unmeasurable, too_many_entries) =
                            match tokio::task::spawn_blocking(move || measure_disk(&p)).await {
                                Ok(Ok(Some(n))) => (Some(n), false, false),
                                Ok(Ok(None)) => (None, true, true),
                                _ => (None, true, false),
                            };
                        // And what it wrote in its own file system (/tmp, say).
                        let rw = runtime.writable_bytes(&id).await.unwrap_or(0);
                        let disk_bytes = disk_bytes.map(|n| n + rw);
                        send(Event::Stats(Stats {
                            time_total: total,
                            disk_bytes,
                            disk_unmeasurable,
                            too_many_entries,
                            ..last_stats(prev)
                        }));
                        let failure = st
                            .failure
                            .or_else(|| {
                                lost_with_engine(engine_lost, st.exit_code, st.oom_killed, runtime.engine())
                            })
                            .or_else(|| {
                                let free = nix::sys::statvfs::statvfs(&bundle_path)
                                    .ok()
                                    .map(|s| s.blocks_available() * s.fragment_size());
                                failed_on_full_disk(st.exit_code, free)
                            });
                        send(Event::ContainerExited {
                            exitcode: st.exit_code,
                            oom_killed: st.oom_killed,
                            failure,
                        });
                        return;
                    }
                    Ok(Some(_)) => {} // still running: the wait stream broke; go on
                    Ok(None) => {
                        send(Event::ContainerExited {
                            exitcode: None,
                            oom_killed: false,
                            failure: Some("Docker container not found".into()),
                        });
                        return;
                    }
                    Err(e) => {
                        engine_lost |= matches!(e, RuntimeError::Unavailable(_));
                        tracing::warn!("cannot inspect container {id}: {e}");
                    }
                }
                wait = Box::pin(runtime.wait(&id));
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
            _ = ticker.tick() => {
                if started_at.is_none() {
                    started_at = runtime.inspect(&id).await.ok().flatten().and_then(|s| s.started_at);
                }
                let sample = match runtime.sample(&id).await {
                    Ok(s) => s,
                    Err(e) => {
                        tracing::debug!("no stats for {id}: {e}");
                        continue;
                    }
                };
                let mut stats = stats_from(prev, sample);
                prev = Some(sample);
                stats.time_total = started_at.map(|s| (now_unix() - s).max(0.0)).unwrap_or(0.0);
                if Instant::now() >= next_disk {
                    let p = bundle_path.clone();
                    let t0 = Instant::now();
                    match tokio::task::spawn_blocking(move || measure_disk(&p)).await {
                        Ok(Ok(Some(n))) => {
                            let rw = runtime.writable_bytes(&id).await.unwrap_or(0);
                            stats.disk_bytes = Some(n + rw);
                        }
                        Ok(Ok(None)) => {
                            stats.disk_unmeasurable = true;
                            stats.too_many_entries = true;
                        }
                        Ok(Err(e)) => {
                            tracing::warn!("cannot measure the bundle dir of {id}: {e}");
                            stats.disk_unmeasurable = true;
                        }
                        Err(_) => {}
                    }
                    next_disk = Instant::now() + disk_interval(t0.elapsed());
                }
                send(Event::Stats(stats));
            }
        }
    }
}

/// The longest gap between the end of one measurement of a bundle dir and the start of the next.
pub const MAX_DISK_INTERVAL: Duration = Duration::from_secs(10);

/// The wait before the next measurement of a bundle dir whose last walk took `walk`: big trees
/// are measured less often (the walk takes at most a tenth of the time), but never less often
/// than every [`MAX_DISK_INTERVAL`], which the run cannot stretch (its walk is capped at
/// [`MAX_BUNDLE_ENTRIES`]).
pub fn disk_interval(walk: Duration) -> Duration {
    (walk * 10).clamp(Duration::from_secs(1), MAX_DISK_INTERVAL)
}

/// The apparent size of a run's bundle dir, walked without following links (any depth); `None`
/// when it holds more than [`MAX_BUNDLE_ENTRIES`] entries or [`MAX_BUNDLE_NAME_BYTES`] of
/// names. A walk that a moving tree disturbs is tried again; one that keeps failing (an
/// unreadable directory, say) is an error, which counts against the run's disk limit.
pub fn measure_disk(bundle_path: &std::path::Path) -> std::io::Result<Option<u64>> {
    let budget = Budget {
        names: MAX_BUNDLE_ENTRIES as usize,
        bytes: MAX_BUNDLE_NAME_BYTES,
    };
    (|| Dir::open(bundle_path).and_then(|d| tree::size_within(&d, budget)))
        .retry(
            ConstantBuilder::default()
                .with_delay(Duration::ZERO)
                .with_max_times(2),
        )
        .call()
}

/// The failure of a run whose container stopped with a non-zero code while its runtime could
/// not be reached: the engine went away (restarted or stopped) and took the container with it.
/// A clean exit during such an outage is the run's own.
fn lost_with_engine(
    engine_lost: bool,
    exit_code: Option<i64>,
    oom_killed: bool,
    engine: &str,
) -> Option<String> {
    let code = exit_code?;
    (engine_lost && code != 0 && !oom_killed).then(|| {
        format!(
            "The {engine} became unreachable while the run was in flight (restarted or \
             stopped), and its container was stopped with it (exit code {code})"
        )
    })
}

/// The failure of a run that exited with a non-zero code while the file system of its bundle
/// dir had no space left: its own error output may not even have been written.
fn failed_on_full_disk(exit_code: Option<i64>, free_bytes: Option<u64>) -> Option<String> {
    let code = exit_code?;
    (code != 0 && free_bytes? < FULL_BELOW).then(|| {
        format!(
            "No space left on device: the work dir's file system was full when the run exited \
             (exit code {code})"
        )
    })
}

/// Less free space than this counts as a full file system.
const FULL_BELOW: u64 = 64 * 1024;

fn last_stats(prev: Option<Sample>) -> Stats {
    prev.map(|s| stats_from(None, s)).unwrap_or_default()
}

/// CPU share (× number of CPUs) and memory fraction from two samples, CPU times in seconds.
pub fn stats_from(prev: Option<Sample>, cur: Sample) -> Stats {
    let cpu_usage = match prev {
        Some(p) if cur.system_ns > p.system_ns => {
            let d_cpu = cur.cpu_total_ns.saturating_sub(p.cpu_total_ns) as f64;
            let d_sys = (cur.system_ns - p.system_ns) as f64;
            d_cpu / d_sys * f64::from(cur.online_cpus.max(1))
        }
        _ => 0.0,
    };
    Stats {
        time_total: 0.0,
        time_user: cur.cpu_user_ns as f64 / 1e9,
        time_system: cur.cpu_system_ns as f64 / 1e9,
        cpu_usage,
        memory_usage: if cur.memory_limit > 0 {
            cur.memory_bytes as f64 / cur.memory_limit as f64
        } else {
            0.0
        },
        memory_bytes: cur.memory_bytes,
        disk_bytes: None,
        disk_unmeasurable: false,
        too_many_entries: false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_container_stopped_during_an_engine_outage_says_so() {
        let m = lost_with_engine(true, Some(137), false, "Docker engine").unwrap();
        assert!(m.starts_with("The Docker engine became unreachable"), "{m}");
        assert!(m.ends_with("(exit code 137)"), "{m}");
        // The run's own results stand: a clean exit, an OOM kill, no outage.
        assert_eq!(
            lost_with_engine(true, Some(0), false, "Docker engine"),
            None
        );
        assert_eq!(
            lost_with_engine(true, Some(137), true, "Docker engine"),
            None
        );
        assert_eq!(
            lost_with_engine(false, Some(137), false, "Docker engine"),
            None
        );
        assert_eq!(lost_with_engine(true, None, false, "Docker engine"), None);
    }

    #[test]
    fn the_gap_between_disk_measurements_is_bounded() {
        assert_eq!(disk_interval(Duration::ZERO), Duration::from_secs(1));
        assert_eq!(
            disk_interval(Duration::from_millis(300)),
            Duration::from_secs(3)
        );
        // However long a walk took (a run cannot make it longer than the entry cap allows).
        assert_eq!(disk_interval(Duration::from_secs(30)), MAX_DISK_INTERVAL);
        assert_eq!(disk_interval(Duration::MAX / 20), MAX_DISK_INTERVAL);
    }

    #[test]
    fn a_failed_run_on_a_full_disk_says_so() {
        let m = failed_on_full_disk(Some(1), Some(0)).unwrap();
        assert!(m.starts_with("No space left on device"), "{m}");
        assert!(m.ends_with("(exit code 1)"), "{m}");
        assert_eq!(failed_on_full_disk(Some(0), Some(0)), None);
        assert_eq!(failed_on_full_disk(Some(1), Some(10 << 20)), None);
        assert_eq!(failed_on_full_disk(Some(1), None), None);
        assert_eq!(failed_on_full_disk(None, Some(0)), None);
    }

    #[test]
    fn cpu_and_memory_fractions() {
        let a = Sample {
            cpu_total_ns: 1_000_000_000,
            system_ns: 10_000_000_000,
            online_cpus: 2,
            ..Default::default()
        };
        let b = Sample {
            cpu_total_ns: 2_000_000_000,
            cpu_user_ns: 1_500_000_000,
            cpu_system_ns: 500_000_000,
            system_ns: 14_000_000_000,
            online_cpus: 2,
            memory_bytes: 50,
            memory_limit: 200,
        };
        let s = stats_from(Some(a), b);
        assert!((s.cpu_usage - 0.5).abs() < 1e-9);
        assert_eq!((s.time_user, s.time_system), (1.5, 0.5));
        assert_eq!(s.memory_usage, 0.25);
        assert_eq!(stats_from(None, b).cpu_usage, 0.0);
    }
}
