//! End to end, real CodaLab server, real Docker and a private image registry: workers that
//! start warm. A worker told of its first run's image and dependency (`--prefetch-image`,
//! `--prefetch-dependency`, as the manager tells the workers it launches) fetches them as it
//! starts; the run, assigned while the image is still being pulled, waits for that pull
//! instead of starting a second one, and uses the dependency already fetched. Prefetching stays
//! within `--max-work-dir-size`. Workers given one `--dependency-cache-dir` share a cache that
//! outlives each of them.

use std::process::Command;
use std::time::Duration;

use testkit::images::{docker, present};
use testkit::manager::{http_get, metric};
use testkit::{cl::*, peers::*, wait_until, worker::*};

/// An image in the private registry and not on the engine: the test image with `mb` MB of
/// random bytes on top (random: the layer's pull is not shortened by compression).
fn image_in_registry_only(mb: u32) -> String {
    let registry = testkit::peers::start("registry.sh")["CLW_REGISTRY"].clone();
    let remote = format!("{registry}/clw-prefetch:{}", unique("t"));
    let name = unique("clw-prefetch-build");
    docker(&[
        "run",
        "--name",
        &name,
        "--network",
        "none",
        "cl-worker-test/base:latest",
        "bash",
        "-c",
        &format!("head -c {mb}M /dev/urandom > /blob"),
    ]);
    docker(&["commit", &name, &remote]);
    docker(&["rm", &name]);
    docker(&["push", "-q", &remote]);
    docker(&["rmi", &remote]);
    assert!(!present(&remote));
    remote
}

/// Uploads a file of `bytes` pseudo-random bytes; its uuid.
fn upload_random(cl: &Cl, dir: &std::path::Path, name: &str, bytes: usize, seed: u64) -> String {
    let mut x = seed | 1;
    let data: Vec<u8> = (0..bytes)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect();
    let f = dir.join(name);
    std::fs::write(&f, data).unwrap();
    last_uuid(&cl.run(&["upload", f.to_str().unwrap()]))
}

const MIB: usize = 1 << 20;

#[test]
fn a_prefetched_image_is_pulled_once_and_a_prefetched_dependency_is_what_the_run_uses() {
    let cl = Cl::new("prefetch");
    let client = peer().client();
    let remote = image_in_registry_only(150);
    let dir = tempfile::tempdir().unwrap();
    let dep = upload_random(&cl, dir.path(), "dep.bin", 4 * MIB, 7);
    let tag = unique("clw-prefetch");
    let d = format!("d:{dep}");
    let uuid = cl.run_bundle(&tag, &["--request-docker-image", &remote, &d], "wc -c < d");
    // Staged before the worker starts: its first check-in is handed the run while the
    // prefetch is pulling the image.
    wait_for(&client, &uuid, T, |s| s == "staged");
    let w = WorkerProc::start_as(
        &tag,
        &tag,
        tempfile::tempdir().unwrap(),
        &[
            "--metrics-addr",
            "127.0.0.1:0",
            "--prefetch-image",
            &remote,
            "--prefetch-dependency",
            &dep,
        ],
    );
    let addr = w.metrics_addr();
    let b = wait_for(&client, &uuid, T, is_final);
    assert_final_state(&b, "ready", &w.log_text());
    assert_eq!(cl.stdout(&uuid).trim(), (4 * MIB).to_string());
    wait_until(Duration::from_secs(30), "both prefetches counted", || {
        let m = http_get(&addr, "/metrics");
        metric(&m, "cl_worker_prefetched_images_total") == 1
            && metric(&m, "cl_worker_prefetched_dependencies_total") == 1
    });
    let m = http_get(&addr, "/metrics");
    let log = w.log_text();
    eprintln!(
        "pulls {}, downloaded {} bytes, cache hits {}, misses {}",
        metric(&m, "cl_worker_image_pulls_total"),
        metric(&m, "cl_worker_downloaded_bytes_total"),
        metric(&m, "cl_worker_dependency_cache_hits_total"),
        metric(&m, "cl_worker_dependency_cache_misses_total")
    );
    // One pull of the image for the prefetch and the run together.
    assert_eq!(metric(&m, "cl_worker_image_pulls_total"), 1, "{m}\n{log}");
    // The dependency crossed the network once.
    let downloaded = metric(&m, "cl_worker_downloaded_bytes_total");
    assert!(
        downloaded >= 4 * MIB as u64 && downloaded < 8 * MIB as u64,
        "{downloaded}\n{log}"
    );
    assert!(log.contains(&format!("prefetched image {remote}")), "{log}");
    drop(w);
    let _ = Command::new("docker").args(["rmi", &remote]).output();
}

#[test]
fn prefetching_stays_within_the_work_dir_size() {
    let cl = Cl::new("prefetch-bound");
    let dir = tempfile::tempdir().unwrap();
    let a = upload_random(&cl, dir.path(), "a.bin", 6 * MIB, 11);
    let b = upload_random(&cl, dir.path(), "b.bin", 6 * MIB, 13);
    let w = WorkerProc::start(
        "prefetch-bound",
        &[
            "--metrics-addr",
            "127.0.0.1:0",
            "--max-work-dir-size",
            "10m",
            "--prefetch-dependency",
            &a,
            "--prefetch-dependency",
            &b,
        ],
    );
    let addr = w.metrics_addr();
    wait_until(
        Duration::from_secs(60),
        "the second left to its run",
        || w.log_text().contains("not prefetching dependency"),
    );
    let m = http_get(&addr, "/metrics");
    let log = w.log_text();
    assert_eq!(
        metric(&m, "cl_worker_prefetched_dependencies_total"),
        1,
        "{m}\n{log}"
    );
    assert!(
        metric(&m, "cl_worker_dependency_cache_bytes") <= 10 * MIB as u64,
        "{m}"
    );
    assert!(
        log.contains(&format!("not prefetching dependency {b}/")),
        "{log}"
    );
    assert_eq!(
        metric(&m, "cl_worker_dependency_cache_evictions_total"),
        0,
        "{m}"
    );
}

#[test]
fn a_second_worker_on_the_shared_cache_downloads_nothing() {
    let cl = Cl::new("prefetch-shared");
    let client = peer().client();
    let dir = tempfile::tempdir().unwrap();
    let dep = upload_random(&cl, dir.path(), "dep.bin", 2 * MIB, 17);
    let cache = tempfile::tempdir().unwrap();
    let cache_dir = cache.path().join("cache").display().to_string();
    let d = format!("d:{dep}");
    let mut downloaded = Vec::new();
    for i in 0..2 {
        let tag = unique(&format!("clw-shared-{i}"));
        let w = WorkerProc::start_as(
            &tag,
            &tag,
            tempfile::tempdir().unwrap(),
            &[
                "--metrics-addr",
                "127.0.0.1:0",
                "--dependency-cache-dir",
                &cache_dir,
            ],
        );
        let addr = w.metrics_addr();
        let uuid = cl.run_bundle(&tag, &[&d], "wc -c < d");
        let b = wait_for(&client, &uuid, T, is_final);
        assert_final_state(&b, "ready", &w.log_text());
        assert_eq!(cl.stdout(&uuid).trim(), (2 * MIB).to_string());
        downloaded.push(metric(
            &http_get(&addr, "/metrics"),
            "cl_worker_downloaded_bytes_total",
        ));
        // The first worker is gone before the second starts.
        drop(w);
    }
    eprintln!("bytes downloaded by each worker: {downloaded:?}");
    assert!(downloaded[0] >= 2 * MIB as u64, "{downloaded:?}");
    assert_eq!(downloaded[1], 0, "{downloaded:?}");
}
