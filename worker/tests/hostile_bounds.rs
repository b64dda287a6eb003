//! Resource exhaustion, end to end: reads, images and dependencies that would take the worker's
//! memory or the host's disk, tried as any user could (the real CodaLab server, real Docker,
//! `cl` and the REST API). Each case checks that the worker stays within a fixed bound (its
//! peak memory, measured) and keeps serving. docs/security.md ("Resource exhaustion") lists
//! each bound and its test.

use std::io::Read;
use std::time::Duration;

use serde_json::Value;
use testkit::{cl::*, peers::*, worker::*};

/// Peak resident memory of a process, in bytes.
fn peak_rss(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .unwrap()
        * 1024
}

/// Whether a process is still running (not gone, not a zombie).
fn alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| s.rsplit_once(") ").map(|(_, rest)| !rest.starts_with('Z')))
        .unwrap_or(false)
}

/// What the worker may hold above its peak before the attack.
const BOUND: u64 = 256 << 20;

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

/// `GET /rest<path>` as the root user: (status, body).
fn rest_get(path: &str) -> (u16, Vec<u8>) {
    runtime().block_on(async {
        let client = peer().client();
        let resp = client
            .request(reqwest::Method::GET, path)
            .await
            .unwrap()
            .timeout(Duration::from_secs(120))
            .send()
            .await
            .unwrap();
        let status = resp.status().as_u16();
        (status, resp.bytes().await.unwrap().to_vec())
    })
}

/// A run that builds something in its bundle dir, touches `done`, and waits to be read: its
/// uuid and its bundle dir on the host.
fn running_with(cl: &Cl, w: &WorkerProc, build: &str) -> (String, std::path::PathBuf) {
    let run = cl.run_bundle(&w.tag, &[], &format!("{build}; touch ~/done; sleep 600"));
    let client = peer().client();
    wait_for(&client, &run, T, |s| s == "running" || is_final(s));
    let dir = w
        .work_dir
        .path()
        .join("wd/runs")
        .join(codalab_worker::agent::run_dir_name(&run, &w.id));
    testkit::wait_until(Duration::from_secs(300), "the run built its tree", || {
        dir.join("done").exists()
    });
    (run, dir)
}

fn nesting(v: &Value) -> usize {
    v.get("contents")
        .and_then(Value::as_array)
        .map_or(0, |c| 1 + c.iter().map(nesting).max().unwrap_or(0))
}

fn assert_still_serves(cl: &Cl, w: &WorkerProc) {
    let ok = cl.run_bundle(&w.tag, &[], "echo still fine");
    let b = wait_for(&peer().client(), &ok, T, is_final);
    assert_eq!(b.state(), Some("ready"), "{b:?}\n{}", w.log_text());
}

fn kill(cl: &Cl, w: &WorkerProc, run: &str) {
    cl.run(&["kill", run]);
    let b = wait_for(&peer().client(), run, T, is_final);
    assert_final_state_or_server_race(&b, "killed", &w.log_text());
}

#[test]
fn a_tree_thousands_of_levels_deep_listed_to_any_depth_leaves_the_worker_serving() {
    let cl = Cl::new("bounds-deep");
    let w = WorkerProc::start("bounds-deep", &[]);
    let (run, dir) = running_with(
        &cl,
        &w,
        // Three `mkdir -p` of 1,000 levels each (one process each; a path of 2,000 bytes).
        "p=$(printf 'd/%.0s' $(seq 1000)); for i in 1 2 3; do mkdir -p $p && cd $p || exit 1; done",
    );
    let before = peak_rss(w.child.id());
    let (status, body) = rest_get(&format!("/bundles/{run}/contents/info/?depth=100000"));
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body));
    let v: Value = serde_json::from_slice(&body).unwrap();
    // The listing stops at its depth bound, and the worker is still there.
    let depth = nesting(&v["data"]);
    assert!((2..=33).contains(&depth), "{depth}");
    assert!(alive(w.child.id()), "the worker died:\n{}", w.log_text());
    let peak = peak_rss(w.child.id());
    eprintln!("deep listing: worker peak {before} -> {peak} bytes, answer nesting {depth}");
    assert!(peak < before + BOUND, "{before} -> {peak}");
    // The tree goes before the kill: the server cannot store a path of 6,000 bytes ("File name
    // too long", after minutes of unpacking), and its upload is not what this case is about.
    std::fs::remove_dir_all(dir.join("d")).unwrap();
    kill(&cl, &w, &run);
    assert_still_serves(&cl, &w);
}

#[test]
fn a_directory_of_200000_links_is_refused_not_held() {
    let cl = Cl::new("bounds-wide");
    let w = WorkerProc::start("bounds-wide", &[]);
    let (run, dir) = running_with(
        &cl,
        &w,
        "mkdir many && cd many && seq 200000 | xargs ln -s -t .",
    );
    let before = peak_rss(w.child.id());
    let (status, body) = rest_get(&format!("/bundles/{run}/contents/info/many?depth=1"));
    let text = String::from_utf8_lossy(&body);
    assert_ne!(
        status,
        200,
        "{}",
        text.chars().take(500).collect::<String>()
    );
    assert!(text.contains("too large"), "{status}: {text}");
    let peak = peak_rss(w.child.id());
    eprintln!("wide listing: worker peak {before} -> {peak} bytes");
    assert!(peak < before + BOUND, "{before} -> {peak}");
    // The links go before the kill: the server unpacks 200,000 entries for minutes (over the
    // test's wait in a loaded CI lane), and their upload is not what this case is about.
    std::fs::remove_dir_all(dir.join("many")).unwrap();
    kill(&cl, &w, &run);
    assert_still_serves(&cl, &w);
}

#[test]
fn the_head_of_a_1g_file_is_read_from_its_ends_only() {
    let cl = Cl::new("bounds-head");
    let w = WorkerProc::start("bounds-head", &[]);
    let (run, _) = running_with(&cl, &w, "truncate -s 1G big");
    let before = peak_rss(w.child.id());
    let mut child = cl
        .command(&["cat", "--head", "100000000", &format!("{run}/big")])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = Vec::new();
    child.stdout.take().unwrap().read_to_end(&mut out).unwrap();
    let status = child.wait().unwrap();
    assert!(status.success(), "cl cat failed");
    let peak = peak_rss(w.child.id());
    eprintln!(
        "cat --head: {} bytes answered, worker peak {before} -> {peak} bytes",
        out.len()
    );
    assert!(out.len() <= 8 << 20, "{} bytes", out.len());
    assert!(peak < before + BOUND, "{before} -> {peak}");
    kill(&cl, &w, &run);
    assert_still_serves(&cl, &w);
}

/// The anonymous volume Docker makes for an image's `VOLUME` goes with the run's container.
#[test]
fn an_images_anonymous_volume_is_removed_with_its_run() {
    let image = "cl-worker-test/volume:latest";
    let mut build = std::process::Command::new("docker")
        .args(["build", "-q", "-t", image, "-"])
        .stdin(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    use std::io::Write;
    build
        .stdin
        .take()
        .unwrap()
        .write_all(b"FROM codalab/default-cpu:latest\nVOLUME /data\n")
        .unwrap();
    assert!(build.wait().unwrap().success(), "docker build");
    let volumes = || {
        let out = std::process::Command::new("docker")
            .args(["volume", "ls", "-q"])
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .map(str::to_owned)
            .collect::<std::collections::BTreeSet<_>>()
    };
    let cl = Cl::new("bounds-volume");
    let w = WorkerProc::start("bounds-volume", &[]);
    let before = volumes();
    let run = cl.run_bundle(
        &w.tag,
        &["--request-docker-image", image],
        "head -c 1000000 /dev/zero > /data/f; echo wrote",
    );
    let b = wait_for(&peer().client(), &run, T, is_final);
    assert_eq!(b.state(), Some("ready"), "{b:?}\n{}", w.log_text());
    assert_eq!(cl.stdout(&run), "wrote\n");
    let after = volumes();
    let left: Vec<_> = after.difference(&before).collect();
    assert!(left.is_empty(), "volumes left on the host: {left:?}");
}

/// A name outside the reference grammar is refused before any request: a listener standing
/// for the engine's API on loopback is never reached.
#[test]
fn an_image_name_outside_the_grammar_makes_no_request() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.set_nonblocking(true).unwrap();
    let port = listener.local_addr().unwrap().port();
    let cl = Cl::new("bounds-ref");
    // With --max-image-size the worker asks the image's registry for its size before a pull:
    // the request the name would have steered.
    let w = WorkerProc::start("bounds-ref", &["--max-image-size", "1g"]);
    let image = format!("localhost:{port}/../containers/json?@x");
    let run = cl.run_bundle(&w.tag, &["--request-docker-image", &image], "true");
    let b = wait_for(&peer().client(), &run, T, is_final);
    assert_final_state(&b, "failed", &w.log_text());
    let msg = meta_str(&b, "failure_message");
    assert!(msg.contains("invalid reference format"), "{msg}");
    assert!(
        listener.accept().is_err(),
        "the worker connected to the address the name held"
    );
    assert_still_serves(&cl, &w);
}

/// `big`, `big/.` and `big/./` are one dependency: downloaded once, one cache entry.
#[test]
fn a_dependency_named_three_ways_is_downloaded_once() {
    let cl = Cl::new("bounds-dep-key");
    let d = tempfile::tempdir().unwrap();
    let bundle = d.path().join("b");
    std::fs::create_dir_all(bundle.join("big")).unwrap();
    std::fs::write(bundle.join("big/f"), "x".repeat(1 << 20)).unwrap();
    let dep = testkit::hostile::upload_dir(&cl, &bundle);
    let w = WorkerProc::start("bounds-dep-key", &[]);
    let run = cl.run_bundle(
        &w.tag,
        &[
            &format!("a:{dep}/big"),
            &format!("b:{dep}/big/."),
            &format!("c:{dep}/big/./"),
        ],
        "cat a/f b/f c/f | wc -c",
    );
    let b = wait_for(&peer().client(), &run, T, is_final);
    assert_eq!(b.state(), Some("ready"), "{b:?}\n{}", w.log_text());
    assert_eq!(cl.stdout(&run).trim(), (3 << 20).to_string());
    let entries: Vec<_> = std::fs::read_dir(w.work_dir.path().join("wd/dependencies"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("0x"))
        .collect();
    assert_eq!(entries.len(), 1, "{entries:?}");
}

/// Writes outside the bundle dir (the container's writable layer: `/tmp`) count against the
/// run's disk limit: before, 200 MB in `/tmp` under a 20 MB limit ended `ready`.
#[test]
fn a_write_outside_the_bundle_dir_counts_against_the_disk_limit() {
    let cl = Cl::new("bounds-rw");
    let w = WorkerProc::start("bounds-rw", &[]);
    let run = cl.run_bundle(
        &w.tag,
        &["--request-disk", "20m"],
        "head -c 200000000 /dev/zero > /tmp/big; echo wrote",
    );
    let b = wait_for(&peer().client(), &run, T, is_final);
    assert_final_state_or_server_race(&b, "failed", &w.log_text());
    assert_eq!(meta_str(&b, "failure_message"), "Disk limit 20mb exceeded.");
    assert_still_serves(&cl, &w);
}

/// A run of more names than the worker measures (about 280,000 files of 246-byte names: past
/// the 64 MiB of names the walk may hold, the cheaper of its two caps to reach; the count cap,
/// 1,000,000 entries, is the same budget's other half, unit-tested): the walk that measures its
/// bundle dir stops there (its time and memory, and so the gap between two disk measurements,
/// stay bounded), and the run fails with a clear text and uploads nothing. Before, the walk took
/// ever longer, the gap with it, and held every name.
#[test]
fn a_bundle_of_more_entries_than_the_worker_measures_fails_with_its_text() {
    let cl = Cl::new("bounds-entries");
    let w = WorkerProc::start("bounds-entries", &[]);
    let before = peak_rss(w.child.id());
    let run = cl.run_bundle(
        &w.tag,
        &["--request-disk", "10g"],
        // bash alone (the image has no perl): one open per file, no fork.
        "n=$(printf 'x%.0s' $(seq 240)); mkdir m && cd m && \
         for ((i = 100000; i < 380000; i++)); do : > $n$i || exit 1; done; echo made; sleep 600",
    );
    let b = wait_for(&peer().client(), &run, Duration::from_secs(600), is_final);
    assert_final_state_or_server_race(&b, "failed", &w.log_text());
    assert_eq!(
        meta_str(&b, "failure_message"),
        "Too many files: the bundle holds more than 1000000 entries (or 64 MiB of names), the \
         most a worker measures."
    );
    // Nothing uploaded, nothing charged.
    assert_eq!(
        b.metadata("data_size").and_then(Value::as_u64).unwrap_or(0),
        0,
        "{b:?}"
    );
    let peak = peak_rss(w.child.id());
    eprintln!("280,000 long names: worker peak {before} -> {peak} bytes");
    assert!(peak < before + BOUND, "{before} -> {peak}");
    assert_still_serves(&cl, &w);
}

/// One run's dependencies together stay within --max-work-dir-size: two of 6 MB each under a
/// 10 MB work dir fail the run with a clear text (each alone fits). Before, a run could hold
/// any number of dependencies of the full size each.
#[test]
fn a_runs_dependencies_together_stay_within_the_work_dir_size() {
    let cl = Cl::new("bounds-dep-total");
    let d = tempfile::tempdir().unwrap();
    let mut deps = Vec::new();
    for name in ["one", "two"] {
        let bundle = d.path().join(name);
        std::fs::create_dir_all(&bundle).unwrap();
        std::fs::write(bundle.join("f"), name.repeat(2 << 20)).unwrap();
        deps.push(testkit::hostile::upload_dir(&cl, &bundle));
    }
    let w = WorkerProc::start("bounds-dep-total", &["--max-work-dir-size", "10m"]);
    // Each alone fits.
    let one = cl.run_bundle(&w.tag, &[&format!("a:{}", deps[0])], "wc -c < a/f");
    let b = wait_for(&peer().client(), &one, T, is_final);
    assert_eq!(b.state(), Some("ready"), "{b:?}\n{}", w.log_text());
    assert_eq!(cl.stdout(&one).trim(), (6 << 20).to_string());
    let both = cl.run_bundle(
        &w.tag,
        &[&format!("a:{}", deps[0]), &format!("b:{}", deps[1])],
        "wc -c a/f b/f",
    );
    let b = wait_for(&peer().client(), &both, T, is_final);
    assert_final_state(&b, "failed", &w.log_text());
    let msg = meta_str(&b, "failure_message");
    assert!(
        msg.starts_with("The dependencies of this run total at least 12")
            && msg.ends_with("more than the worker's --max-work-dir-size of 10mb"),
        "{msg}"
    );
    assert_still_serves(&cl, &w);
}
