//! Hostile bundles, end to end: the real CodaLab server, real Docker (and Podman and the
//! Kubernetes runtime where a case applies), bundles and dependencies uploaded with `cl upload`
//! and `cl run` as any user could. Each attack plants a marker file on the host outside the work
//! dir and checks that no run read or changed it, that the run's failure says what happened, and
//! that the worker still serves the next run. The legitimate cases (links of every kind in a
//! dependency, used whole, at the bundle root and by sub-path) must keep working.
//!
//! docs/security.md lists each attack, the defence and this file's test for it.

use std::fs;
use std::os::unix::fs::{symlink, MetadataExt, PermissionsExt};
use std::path::PathBuf;
use std::time::Duration;

use serde_json::Value;
use testkit::hostile::{upload_dir, worker, Marker, Rt};
use testkit::{cl::*, peers::*, podman, worker::*};

fn final_state(w: &WorkerProc, uuid: &str) -> protocol::Bundle {
    let b = wait_for(&peer().client(), uuid, T, is_final);
    eprintln!(
        "{uuid}: {:?}, failure {:?}",
        b.state(),
        meta_str(&b, "failure_message")
    );
    let _ = w;
    b
}

/// What a finished run wrote to a file of its bundle ("" when it is not there).
fn cat_or_empty(cl: &Cl, target: &str) -> String {
    let out = cl.command(&["cat", target]).output().unwrap();
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The worker still takes and finishes a run.
fn assert_still_serves(cl: &Cl, w: &WorkerProc) {
    let ok = cl.run_bundle(&w.tag, &[], "echo still fine");
    let b = wait_for(&peer().client(), &ok, T, is_final);
    assert_eq!(b.state(), Some("ready"), "{b:?}\n{}", w.log_text());
    assert_eq!(cl.stdout(&ok), "still fine\n");
}

/// A dependency holding links of every legitimate kind: absolute, relative, dangling, and one
/// climbing to its parent.
fn linked_dependency(cl: &Cl) -> String {
    let d = tempfile::tempdir().unwrap();
    let dep = d.path().join("dep");
    fs::create_dir_all(dep.join("sub")).unwrap();
    fs::write(dep.join("sub/f"), "contents of f\n").unwrap();
    symlink("/etc/hostname", dep.join("abs")).unwrap();
    symlink("sub/f", dep.join("rel")).unwrap();
    // As in CodaLab's own test data.
    symlink("/broken-symlink", dep.join("broken-symlink")).unwrap();
    symlink("..", dep.join("sub/up")).unwrap();
    upload_dir(cl, &dep)
}

fn legitimate_links_are_kept_as_uploaded(rt: Rt) {
    let cl = Cl::new(&format!("hostile-links-{rt:?}"));
    let dep = linked_dependency(&cl);
    let w = worker(rt, &format!("hostile-links-{rt:?}"), &[]);
    // The dependency used whole, at the bundle root, and by sub-path.
    let run = cl.run_bundle(
        &w.tag,
        &[
            &format!("d:{dep}"),
            &format!(".:{dep}"),
            &format!("s:{dep}/sub"),
        ],
        "readlink d/abs d/rel d/broken-symlink d/sub/up; cat d/rel; \
         readlink abs rel broken-symlink; cat rel sub/f; readlink s/up; cat s/f",
    );
    let b = final_state(&w, &run);
    assert_eq!(b.state(), Some("ready"), "{b:?}\n{}", w.log_text());
    assert_eq!(
        cl.stdout(&run),
        "/etc/hostname\nsub/f\n/broken-symlink\n..\ncontents of f\n\
         /etc/hostname\nsub/f\n/broken-symlink\ncontents of f\ncontents of f\n\
         ..\ncontents of f\n"
    );
    assert_still_serves(&cl, &w);
}

#[test]
fn legitimate_links_are_kept_as_uploaded_docker() {
    legitimate_links_are_kept_as_uploaded(Rt::Docker);
}

#[test]
fn legitimate_links_are_kept_as_uploaded_podman() {
    legitimate_links_are_kept_as_uploaded(Rt::Podman);
}

#[test]
fn legitimate_links_are_kept_as_uploaded_kubernetes() {
    legitimate_links_are_kept_as_uploaded(Rt::Kubernetes);
}

/// Dependencies whose top-level links would show the host's file system if the host followed
/// them when mounting each entry (a dependency mounted at the bundle root). The first is a
/// chain of links that each look contained (`d1/…/d8/up` → the dependency's root, then `esc`
/// climbing through it); the second an absolute link to `/` and a link to the dependency's
/// parent (the host's cache).
fn escaping_dependencies(cl: &Cl) -> [String; 2] {
    let d = tempfile::tempdir().unwrap();
    let chain = d.path().join("chain");
    let deep: PathBuf = (1..=8).map(|i| format!("d{i}")).collect();
    fs::create_dir_all(chain.join(&deep)).unwrap();
    symlink([".."; 8].join("/"), chain.join(&deep).join("up")).unwrap();
    symlink(esc_target(), chain.join("esc")).unwrap();
    let plain = d.path().join("plain");
    fs::create_dir_all(&plain).unwrap();
    symlink("/", plain.join("hostroot")).unwrap();
    symlink("..", plain.join("parent")).unwrap();
    [upload_dir(cl, &chain), upload_dir(cl, &plain)]
}

fn esc_target() -> String {
    let deep: Vec<_> = (1..=8).map(|i| format!("d{i}")).collect();
    format!("{}/up/{}", deep.join("/"), [".."; 8].join("/"))
}

fn links_at_mount_points_never_reach_the_host(rt: Rt) {
    let marker = Marker::plant(&format!("mounts-{rt:?}"));
    let cl = Cl::new(&format!("hostile-mounts-{rt:?}"));
    let deps = escaping_dependencies(&cl);
    let w = worker(rt, &format!("hostile-mounts-{rt:?}"), &[]);
    let m = marker.dir.display();
    for (dep, links) in deps.iter().zip([&["esc"][..], &["hostroot", "parent"][..]]) {
        let run = cl.run_bundle(
            &w.tag,
            &[&format!(".:{dep}")],
            &format!(
                "for l in {names}; do cat $l{m}/secret; ls $l/ $l{m}; echo pwned > $l{m}/x; \
                 done > out 2>&1; readlink {names}",
                names = links.join(" ")
            ),
        );
        let b = final_state(&w, &run);
        assert_eq!(b.state(), Some("ready"), "{b:?}\n{}", w.log_text());
        let out = cat_or_empty(&cl, &format!("{run}/out"));
        // Inside the run each link resolves in the container's own file system: no marker
        // there, and no listing of the host's cache (where the dependency is named by uuid).
        assert!(out.contains("No such file"), "{out}");
        assert!(
            !out.lines().any(|l| l == dep.as_str()),
            "the host's cache was listed: {out}"
        );
        let expected: Vec<String> = links
            .iter()
            .map(|l| match *l {
                "esc" => esc_target(),
                "hostroot" => "/".into(),
                _ => "..".into(),
            })
            .collect();
        assert_eq!(cl.stdout(&run), format!("{}\n", expected.join("\n")));
        marker.assert_untouched(&[&out, &cl.stdout(&run)]);
    }
    assert_still_serves(&cl, &w);
}

#[test]
fn links_at_mount_points_never_reach_the_host_docker() {
    links_at_mount_points_never_reach_the_host(Rt::Docker);
}

#[test]
fn links_at_mount_points_never_reach_the_host_podman() {
    links_at_mount_points_never_reach_the_host(Rt::Podman);
}

#[test]
fn links_at_mount_points_never_reach_the_host_kubernetes() {
    links_at_mount_points_never_reach_the_host(Rt::Kubernetes);
}

/// A dependency mounted at the bundle root holding a directory whose name is not UTF-8 (`x\xff`)
/// beside a link to `/` named by that name's lossy twin (`x\u{FFFD}`, the replacement
/// character's bytes): a mount source built from the lossy name would be the link, and the
/// engine (or the kubelet) would mount the host's `/` for the directory.
fn a_lossy_twin_never_names_a_mount_source(rt: Rt) {
    use std::ffi::OsStr;
    use std::os::unix::ffi::OsStrExt;
    let marker = Marker::plant(&format!("twin-{rt:?}"));
    let cl = Cl::new(&format!("hostile-twin-{rt:?}"));
    let d = tempfile::tempdir().unwrap();
    let dep = d.path().join("twin");
    let dir = dep.join(OsStr::from_bytes(b"x\xff"));
    fs::create_dir_all(&dir).unwrap();
    fs::write(dir.join("f"), "inside the dependency\n").unwrap();
    symlink("/", dep.join(OsStr::from_bytes(b"x\xef\xbf\xbd"))).unwrap();
    let dep = upload_dir(&cl, &dep);
    let w = worker(rt, &format!("hostile-twin-{rt:?}"), &[]);
    let m = marker.dir.display();
    let run = cl.run_bundle(
        &w.tag,
        &[&format!(".:{dep}")],
        &format!(
            "d=$(printf 'x\\377'); t=$(printf 'x\\357\\277\\275'); ls -A \"$d\"; cat \"$d/f\"; \
             readlink \"$t\"; cat \"$d{m}/secret\" 2>&1; echo pwned > \"$d{m}/x\"; true"
        ),
    );
    let b = final_state(&w, &run);
    assert_eq!(b.state(), Some("ready"), "{b:?}\n{}", w.log_text());
    let out = cl.stdout(&run);
    let mut lines = out.lines();
    // The directory is the dependency's (one file), not the host's `/`; the twin is the link.
    assert_eq!(lines.next(), Some("f"), "{out}");
    assert_eq!(lines.next(), Some("inside the dependency"), "{out}");
    assert_eq!(lines.next(), Some("/"), "{out}");
    assert!(
        lines.next().is_some_and(|l| l.contains("No such file")),
        "{out}"
    );
    marker.assert_untouched(&[&out, &cat_or_empty(&cl, &format!("{run}/stderr"))]);
    assert_still_serves(&cl, &w);
}

#[test]
fn a_lossy_twin_never_names_a_mount_source_docker() {
    a_lossy_twin_never_names_a_mount_source(Rt::Docker);
}

#[test]
fn a_lossy_twin_never_names_a_mount_source_podman() {
    a_lossy_twin_never_names_a_mount_source(Rt::Podman);
}

#[test]
fn a_lossy_twin_never_names_a_mount_source_kubernetes() {
    a_lossy_twin_never_names_a_mount_source(Rt::Kubernetes);
}

/// The run dirs of a shared work dir: a restaged run's dir is kept for a later attempt, which
/// never follows what the earlier one left there.
#[test]
fn a_link_planted_by_an_earlier_attempt_is_not_followed() {
    let marker = Marker::plant("restage");
    let cl = Cl::new("hostile-restage");
    let files = tempfile::tempdir().unwrap();
    let dep = cl.upload_text(files.path(), "dep.txt", "dependency\n");
    let w = WorkerProc::start("hostile-restage", &["--pass-down-termination"]);
    let client = peer().client();
    // The first attempt replaces the directory `d` (where the worker puts the link `d/x` of
    // the dependency) with a link to the marker's directory, then waits to be restaged.
    let run = cl.run_bundle(
        &w.tag,
        &[&format!("d/x:{dep}")],
        &format!("rm -rf d; ln -s {} d; sleep 600", marker.dir.display()),
    );
    wait_for(&client, &run, T, |s| s == "running" || is_final(s));
    let bundle_dir = w
        .work_dir
        .path()
        .join("wd/runs")
        .join(codalab_worker::agent::run_dir_name(&run, &w.id));
    testkit::wait_until(T, "the run replaced d with a link", || {
        fs::symlink_metadata(bundle_dir.join("d")).is_ok_and(|m| m.file_type().is_symlink())
    });
    w.signal("TERM");
    let tag = w.tag.clone();
    let id = w.id.clone();
    let mut w = w;
    w.wait_exit(T)
        .expect("the worker exits after handing its run back");
    let b = wait_for(&client, &run, T, |s| s == "staged" || is_final(s));
    assert_eq!(b.state(), Some("staged"), "{b:?}\n{}", w.log_text());
    // The handed-back run's dir is kept, as CodaLab keeps it (a later attempt resumes from
    // its checkpoints); its clean-up removed the dependency's place `d` (the link, unlinked).
    assert!(bundle_dir.join("stdout").exists(), "{}", w.log_text());
    // A later attempt on the same work dir (another worker, or the same one restarted): with
    // the link back in place where its dependency goes, preparing never follows it.
    symlink(&marker.dir, bundle_dir.join("d")).unwrap();
    let w2 = WorkerProc::start_as(&id, &tag, w.into_work_dir(), &["--pass-down-termination"]);
    wait_for(&client, &run, T, |s| s == "running" || is_final(s));
    testkit::wait_until(T, "the second attempt replaced d again", || {
        fs::symlink_metadata(bundle_dir.join("d")).is_ok_and(|m| m.file_type().is_symlink())
            && fs::symlink_metadata(bundle_dir.join("stdout")).is_ok()
    });
    marker.assert_untouched(&[]);
    cl.run(&["kill", &run]);
    let b = final_state(&w2, &run);
    assert_final_state_or_server_race(&b, "killed", &w2.log_text());
    marker.assert_untouched(&[&cat_or_empty(&cl, &format!("{run}/stdout"))]);
    assert_still_serves(&cl, &w2);
}

fn over_the_disk_limit_at_exit(name: &str, request_disk: &str, command: &str, limit_text: &str) {
    let marker = Marker::plant(name);
    let cl = Cl::new(&format!("hostile-{name}"));
    let w = WorkerProc::start(&format!("hostile-{name}"), &[]);
    let run = cl.run_bundle(&w.tag, &["--request-disk", request_disk], command);
    let b = final_state(&w, &run);
    assert_final_state_or_server_race(&b, "failed", &w.log_text());
    assert_eq!(meta_str(&b, "failure_message"), limit_text);
    // Nothing was uploaded, and the server charges the owner nothing for it: it keeps the
    // bundle's `data_size` as the last reported disk use, and moves its owner's `disk_used` by
    // the same amount.
    let size = b.metadata("data_size").and_then(Value::as_u64);
    assert_eq!(size, Some(0), "data_size of {run}");
    marker.assert_untouched(&[]);
    assert_still_serves(&cl, &w);
}

#[test]
fn a_quick_write_past_a_tiny_disk_limit_fails_and_uploads_nothing() {
    // What a user's remaining quota becomes when the bundle requests no disk.
    over_the_disk_limit_at_exit(
        "quick-disk",
        "10",
        "head -c 1000 /dev/zero > f",
        "Disk limit 10b exceeded.",
    );
}

#[test]
fn a_write_past_the_disk_limit_just_before_the_exit_fails_and_uploads_nothing() {
    // Under the limit at the first sample, over it when the run exits a moment later.
    over_the_disk_limit_at_exit(
        "exit-disk",
        "1m",
        "sleep 0.5; head -c 50000000 /dev/zero > big",
        "Disk limit 1mb exceeded.",
    );
}

#[test]
fn a_sparse_10g_output_fails_and_uploads_nothing() {
    over_the_disk_limit_at_exit(
        "sparse",
        "1m",
        "truncate -s 10G big",
        "Disk limit 1mb exceeded.",
    );
}

#[test]
fn a_tree_deeper_than_path_max_cannot_switch_the_disk_limit_off() {
    over_the_disk_limit_at_exit(
        "deep",
        "1m",
        // 21 levels of 200-character names: 4221 bytes of path, past PATH_MAX (4096), and
        // 3 MB at the bottom, written while the worker samples (every 2 s).
        "n=$(printf 'd%.0s' $(seq 200)); for i in $(seq 21); do mkdir $n && cd $n || exit 1; \
         done; head -c 3000000 /dev/zero > f; sleep 5",
        "Disk limit 1mb exceeded.",
    );
}

/// Peak resident memory of a process, in bytes.
fn peak_rss(pid: u32) -> u64 {
    let status = fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .unwrap()
        * 1024
}

#[test]
fn a_netcat_flood_is_capped() {
    let cl = Cl::new("hostile-netcat");
    let w = WorkerProc::start("hostile-netcat", &[]);
    let client = peer().client();
    let run = cl.run_bundle(
        &w.tag,
        &[],
        "while true; do yes | busybox nc -l -p 8000; done",
    );
    wait_for(&client, &run, T, |s| s == "running" || is_final(s));
    // (The first tries may come before the run's port listens.)
    let t0 = std::time::Instant::now();
    let reply = loop {
        let out = cl
            .command(&["netcat", &run, "8000", "hello"])
            .output()
            .unwrap();
        let reply = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        if reply.contains("larger than 16 MiB") || reply.len() > 1 << 20 || t0.elapsed() > T {
            break reply;
        }
        std::thread::sleep(Duration::from_millis(500));
    };
    assert!(
        reply.contains("larger than 16 MiB"),
        "{}",
        reply.chars().take(2000).collect::<String>()
    );
    let peak = peak_rss(w.child.id());
    assert!(peak < 200 << 20, "the worker held {peak} bytes");
    cl.run(&["kill", &run]);
    final_state(&w, &run);
    assert_still_serves(&cl, &w);
}

#[test]
fn set_id_bits_of_a_dependency_never_reach_the_host() {
    let cl = Cl::new("hostile-suid");
    let d = tempfile::tempdir().unwrap();
    let dep = d.path().join("dep");
    fs::create_dir_all(dep.join("sgid")).unwrap();
    fs::copy("/bin/true", dep.join("suid")).unwrap();
    fs::set_permissions(dep.join("suid"), fs::Permissions::from_mode(0o6755)).unwrap();
    fs::set_permissions(dep.join("sgid"), fs::Permissions::from_mode(0o2775)).unwrap();
    let dep = upload_dir(&cl, &dep);
    let w = WorkerProc::start("hostile-suid", &[]);
    let run = cl.run_bundle(&w.tag, &[&format!("d:{dep}")], "stat -c %a d/suid d/sgid");
    let b = final_state(&w, &run);
    assert_eq!(b.state(), Some("ready"), "{b:?}\n{}", w.log_text());
    assert_eq!(cl.stdout(&run), "755\n775\n");
    // And on the host, nothing in the cache is set-user-id or set-group-id.
    let cache = w.work_dir.path().join("wd/dependencies");
    for f in testkit::files_under(&cache) {
        let mode = fs::symlink_metadata(&f).unwrap().mode();
        assert_eq!(mode & 0o6000, 0, "{} has mode {mode:o}", f.display());
    }
    assert_still_serves(&cl, &w);
}

#[test]
fn a_dependency_larger_than_the_work_dir_limit_is_cut() {
    let marker = Marker::plant("bomb");
    let cl = Cl::new("hostile-bomb");
    let d = tempfile::tempdir().unwrap();
    let dep = d.path().join("bomb");
    fs::create_dir_all(&dep).unwrap();
    // 256 MiB of zeros: a few hundred kilobytes gzipped.
    let f = fs::File::create(dep.join("zeros")).unwrap();
    f.set_len(256 << 20).unwrap();
    let dep = upload_dir(&cl, &dep);
    let w = WorkerProc::start("hostile-bomb", &["--max-work-dir-size", "64m"]);
    let run = cl.run_bundle(&w.tag, &[&format!("d:{dep}")], "ls -l d");
    let b = final_state(&w, &run);
    assert_final_state(&b, "failed", &w.log_text());
    let msg = meta_str(&b, "failure_message");
    assert!(
        msg.starts_with("Failed to download dependency d:")
            && msg.contains("larger than its limit of 64m"),
        "{msg}"
    );
    let left: Vec<_> = fs::read_dir(w.work_dir.path().join("wd/dependencies"))
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert!(left.is_empty(), "{left:?}");
    marker.assert_untouched(&[]);
    assert_still_serves(&cl, &w);
}

/// A shared-file-system worker mounts dependencies from the bundle store itself: a dependency
/// path whose last component is a link (to `/`) must not be followed by the host, and one that
/// goes through a link is refused.
#[test]
fn shared_file_system_dependency_paths_stay_in_their_bundle() {
    let marker = Marker::plant("sharedfs");
    let cl = Cl::new("hostile-sharedfs");
    let d = tempfile::tempdir().unwrap();
    let dep = d.path().join("dep");
    fs::create_dir_all(dep.join("data")).unwrap();
    fs::write(dep.join("data/f"), "shared data\n").unwrap();
    symlink("/", dep.join("esc")).unwrap();
    let dep = upload_dir(&cl, &dep);
    let w = WorkerProc::start("hostile-sharedfs", &["--shared-file-system"]);
    let m = marker.dir.display();
    let run = cl.run_bundle(
        &w.tag,
        &[&format!("x:{dep}/esc"), &format!("data:{dep}/data")],
        &format!("cat data/f; readlink x; cat x{m}/secret; ls x{m}; echo pwned > x{m}/x; true"),
    );
    let b = final_state(&w, &run);
    assert_eq!(b.state(), Some("ready"), "{b:?}\n{}", w.log_text());
    let stdout = cl.stdout(&run);
    assert_eq!(stdout, "shared data\n/\n");
    let stderr = cat_or_empty(&cl, &format!("{run}/stderr"));
    assert!(stderr.contains("No such file"), "{stderr}");
    marker.assert_untouched(&[&stdout, &stderr]);
    assert_still_serves(&cl, &w);
}

#[test]
fn podman_runs_cannot_reach_one_another() {
    let cl = Cl::new("hostile-podman-net");
    let w = worker(Rt::Podman, "hostile-podman-net", &[]);
    let client = peer().client();
    let server = cl.run_bundle(
        &w.tag,
        &[],
        "while true; do echo hello | busybox nc -l -p 8000; done",
    );
    wait_for(&client, &server, T, |s| s == "running" || is_final(s));
    let ip = podman_ip(&format!("codalab_run_{server}"));
    let probe = cl.run_bundle(
        &w.tag,
        &[],
        &format!("busybox nc -w 3 {ip} 8000 </dev/null; echo exit=$?"),
    );
    let b = final_state(&w, &probe);
    assert_eq!(b.state(), Some("ready"), "{b:?}\n{}", w.log_text());
    let out = cl.stdout(&probe);
    assert!(!out.contains("hello"), "one run reached another: {out}");
    // The worker itself still reaches the run (`cl netcat`).
    let reached = cl.run(&["netcat", &server, "8000", "ping"]);
    assert!(reached.contains("hello"), "{reached}");
    cl.run(&["kill", &server]);
    final_state(&w, &server);
    assert_still_serves(&cl, &w);
}

/// The address of a Podman container on its (only) network.
fn podman_ip(name: &str) -> String {
    let v = podman::libpod(podman::socket(), &format!("/containers/{name}/json"));
    let nets = v["NetworkSettings"]["Networks"].as_object().unwrap();
    nets.values()
        .filter_map(|n| n["IPAddress"].as_str())
        .find(|ip| !ip.is_empty())
        .unwrap_or_else(|| panic!("no address: {v}"))
        .to_owned()
}
