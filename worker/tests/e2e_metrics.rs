//! End to end, real CodaLab server and real Docker: `cl-worker --metrics-addr` after two runs
//! that share a dependency, one succeeding and one failing.

use std::time::Duration;

use testkit::manager::{http_get, metric, metric_sum};
use testkit::{cl::*, peers::*, wait_until, worker::*};

#[test]
fn metrics_after_two_runs() {
    let cl = Cl::new("metrics");
    let dir = tempfile::tempdir().unwrap();
    let dep = cl.upload_text(dir.path(), "dep.txt", "dependency contents\n");
    let w = WorkerProc::start("metrics", &["--metrics-addr", "127.0.0.1:0"]);
    let addr = w.metrics_addr();
    let client = peer().client();
    let d = format!("d:{dep}");
    let ok = cl.run_bundle(&w.tag, &[&d], "cat d; seq 1 20000 > numbers");
    let b = wait_for(&client, &ok, T, is_final);
    assert_final_state(&b, "ready", &w.log_text());
    let failed = cl.run_bundle(&w.tag, &[&d], "cat d; exit 3");
    let b = wait_for(&client, &failed, T, is_final);
    assert_final_state(&b, "failed", &w.log_text());
    // Both runs are gone from the worker once the server finalized them.
    wait_until(Duration::from_secs(30), "no run left", || {
        metric_sum(&http_get(&addr, "/metrics"), "cl_worker_runs") == 0.0
    });
    let m = http_get(&addr, "/metrics");
    let log = w.log_text();
    let series: Vec<&str> = m
        .lines()
        .filter(|l| !l.starts_with('#') && !l.contains("_bucket"))
        .collect();
    eprintln!("GET /metrics after the runs:\n{}", series.join("\n"));
    let at_least = |series: &str, min: u64| {
        let v = metric(&m, series);
        assert!(v >= min, "{series} = {v} < {min}\n{m}\n{log}");
    };
    assert_eq!(
        metric(&m, "cl_worker_run_outcomes_total{outcome=\"succeeded\"}"),
        1,
        "{m}"
    );
    assert_eq!(
        metric(&m, "cl_worker_run_outcomes_total{outcome=\"failed\"}"),
        1,
        "{m}"
    );
    assert_eq!(
        metric(&m, "cl_worker_run_outcomes_total{outcome=\"killed\"}"),
        0
    );
    for stage in ["preparing", "running", "uploading_results", "finalizing"] {
        assert_eq!(
            metric(&m, &format!("cl_worker_runs{{stage=\"{stage}\"}}")),
            0,
            "{m}"
        );
    }
    // Check-ins: many, each timed; none failed.
    at_least("cl_worker_checkin_duration_seconds_count", 3);
    assert_eq!(metric(&m, "cl_worker_checkin_failures_total"), 0, "{m}");
    // Results went up (the tar.gz of stdout, stderr and 20000 numbers), the dependency came
    // down once: the first run missed the cache, the second found it there.
    at_least("cl_worker_uploaded_bytes_total", 1000);
    at_least("cl_worker_downloaded_bytes_total", 1);
    at_least("cl_worker_dependency_cache_bytes", 1);
    assert_eq!(
        metric(&m, "cl_worker_dependency_cache_misses_total"),
        1,
        "{m}"
    );
    assert_eq!(
        metric(&m, "cl_worker_dependency_cache_hits_total"),
        1,
        "{m}"
    );
    assert_eq!(
        metric(&m, "cl_worker_dependency_cache_evictions_total"),
        0,
        "{m}"
    );
    // The run image is in the image cache.
    at_least("cl_worker_image_cache_bytes", 1 << 20);
    // Present already: not pulled; nothing was prefetched (no --prefetch-* flags).
    for zero in [
        "cl_worker_image_pulls_total",
        "cl_worker_prefetched_images_total",
        "cl_worker_prefetched_dependencies_total",
    ] {
        assert_eq!(metric(&m, zero), 0, "{zero}\n{m}");
    }
    for uuid in [&ok, &failed, &dep] {
        cl.run(&["rm", uuid]);
    }
}
