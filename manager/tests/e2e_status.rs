//! End to end, the real CodaLab server: what an operator sees of a manager with staged bundles.
//! The manager (`local`, `--max-workers 0`, so that it launches nothing) serves its status page,
//! which headless Chromium renders; `cl-worker-manager status` prints it as a table and exits 0,
//! and 69 when nothing answers. Each staged bundle is explained: the three small ones wait on
//! the `--max-workers 0` cap, the big one is unschedulable (64 CPUs over a 1-CPU shape).

use std::collections::HashMap;
use std::process::Command;
use std::time::Duration;

use testkit::manager::{worker_globals, ManagerProc};
use testkit::{cl::*, peers::*, wait_until, worker::*};

fn chromium(args: &[&str]) -> String {
    let mut argv = vec!["tests/peers/chromium.sh"];
    argv.extend_from_slice(args);
    bash(&argv, &HashMap::new())
}

fn status_cmd(url: &str) -> (Option<i32>, String, String) {
    status_cmd_with(&[url])
}

fn status_cmd_with(args: &[&str]) -> (Option<i32>, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_cl-worker-manager"))
        .arg("status")
        .args(args)
        .env_remove("CL_WORKER_MANAGER_METRICS_ADDR")
        .output()
        .unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn status_page_in_chromium_and_status_command() {
    // Chromium is a peer like the others: installed if missing, never skipped.
    chromium(&["install"]);
    let cl = Cl::new("mgr-status");
    let tag = unique("clw-status");
    let mut uuids: Vec<String> = (0..3)
        .map(|i| cl.run_bundle(&tag, &[], &format!("echo {i}")))
        .collect();
    let big = cl.run_bundle(&tag, &["--request-cpus", "64"], "echo never");
    uuids.push(big.clone());
    let client = peer().client();
    for uuid in &uuids {
        wait_for(&client, uuid, T, |s| s == "staged");
    }
    let dir = tempfile::tempdir().unwrap();
    let p = peer();
    // The shared globals (fast ticks, the tag-exclusive queue `tag`), and no room for a worker.
    let mut args = worker_globals(&p.server_url(), &tag, &worker_bin(), &dir.path().join("w"));
    args.extend(
        [
            "--max-workers",
            "0",
            "--metrics-addr",
            "127.0.0.1:0",
            "local",
            "--cpus",
            "1",
            "--memory-mb",
            "2048",
        ]
        .map(String::from),
    );
    let env = HashMap::from([
        ("CODALAB_USERNAME".to_string(), p.var("CLW_ROOT_USER")),
        ("CODALAB_PASSWORD".to_string(), p.var("CLW_ROOT_PASSWORD")),
    ]);
    let m = ManagerProc::spawn(dir.path(), &args, &env);
    let addr = m.metrics_addr();
    let url = format!("http://{addr}");
    // A few ticks, so that the chart has points.
    wait_until(Duration::from_secs(60), "three ticks with 4 staged", || {
        let s: serde_json::Value = serde_json::from_str(&m.get("/status")).unwrap();
        s["history"]
            .as_array()
            .is_some_and(|h| h.len() >= 3 && h.iter().rev().take(2).all(|x| x["staged"] == 4))
    });

    // The page as Chromium renders it.
    let dom = chromium(&["dump", &format!("{url}/")]);
    for want in [
        "<span id=\"staged-count\" class=\"big\">4</span>",
        "(1 unschedulable)",
        "<table id=\"workers\">",
        "<th>lost before check-in</th>",
        "<tr><td>default</td><td>0</td><td>0</td><td>0</td></tr>",
        &format!("<code>{big}</code>: fits no worker shape: 64 cpus &gt; largest 1"),
        "server ok; backend ok",
        "<svg id=\"chart\"",
        "<polyline",
    ] {
        assert!(dom.contains(want), "{want:?} not in the DOM:\n{dom}");
    }
    // Why each bundle waits, on the page: the big one can never run here, the three others
    // wait on the --max-workers 0 cap.
    let short = |u: &str| u.chars().take(10).collect::<String>();
    let capped = "--max-workers 0 reached: 0 jobs listed, room for 0 of 3 launches wanted";
    assert!(dom.contains("<h2>Waiting bundles: 4</h2>"), "{dom}");
    let row = format!(
        "<tr><td><code title=\"{big}\">{}</code></td><td class=\"l\">unschedulable</td>\
         <td class=\"l\">requests 64 CPUs, the largest shape has 1: 63 over</td><td>-</td></tr>",
        short(&big)
    );
    assert!(dom.contains(&row), "{row:?} not in the DOM:\n{dom}");
    for uuid in &uuids[..3] {
        let row = format!(
            "<tr><td><code title=\"{uuid}\">{}</code></td><td class=\"l\">over_cap</td>\
             <td class=\"l\">{capped}</td><td>-</td></tr>",
            short(uuid)
        );
        assert!(dom.contains(&row), "{row:?} not in the DOM:\n{dom}");
    }
    // The same in /status and /metrics.
    let s: serde_json::Value = serde_json::from_str(&m.get("/status")).unwrap();
    let bundles = s["bundles"].as_array().unwrap();
    assert_eq!(bundles.len(), 4, "{s}");
    assert_eq!(s["bundles_unlisted"], 0, "{s}");
    for b in bundles {
        if b["uuid"] == big.as_str() {
            assert_eq!(b["reason"], "unschedulable", "{b}");
            assert_eq!(
                b["over"],
                serde_json::json!([{"resource": "cpus", "requested": 64, "largest": 1}]),
                "{b}"
            );
        } else {
            assert!(uuids[..3].iter().any(|u| b["uuid"] == u.as_str()), "{b}");
            assert_eq!(
                (&b["reason"], &b["cap"], &b["max"], &b["current"]),
                (
                    &serde_json::json!("over_cap"),
                    &serde_json::json!("max_workers"),
                    &serde_json::json!(0),
                    &serde_json::json!(0)
                ),
                "{b}"
            );
        }
    }
    let metrics = m.get("/metrics");
    for line in [
        "cl_worker_manager_waiting_bundles{reason=\"over_cap\"} 3\n",
        "cl_worker_manager_waiting_bundles{reason=\"unschedulable\"} 1\n",
        "cl_worker_manager_waiting_bundles{reason=\"waiting_for_worker\"} 0\n",
    ] {
        assert!(metrics.contains(line), "{line:?} not in\n{metrics}");
    }
    // The staged table: 3 bundles of the default shape that need 3 workers, all throttled
    // (--max-workers 0), none held by the machine's capacity.
    assert!(
        dom.contains("<td>default</td><td class=\"l\">1 CPU, 0 GPU, 2.0 GiB</td><td>3</td><td>0</td><td>3</td><td>3</td><td>3</td><td>0</td></tr>"),
        "{dom}"
    );
    let png = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("status-page.png");
    let _ = std::fs::remove_file(&png);
    chromium(&["shot", &format!("{url}/"), &png.display().to_string()]);
    let bytes = std::fs::read(&png).unwrap();
    assert!(
        bytes.starts_with(b"\x89PNG") && bytes.len() > 10_000,
        "{} bytes",
        bytes.len()
    );

    // The same status as a table.
    let (code, out, err) = status_cmd(&url);
    assert_eq!(code, Some(0), "{out}\n{err}");
    for want in [
        "cl-worker-manager: local backend",
        "Health:     server ok; backend ok",
        "Breaker:    closed, 0 failed launches in a row, no back-off",
        "Staged bundles: 4 (1 unschedulable)",
        &format!("unschedulable {big}: fits no worker shape: 64 cpus > largest 1"),
        "Workers: 0 (0 pending, 0 running; min 0, max 0)",
        &format!("bundle {big} is unschedulable"),
    ] {
        assert!(out.contains(want), "{want:?} not in\n{out}");
    }
    eprintln!("cl-worker-manager status {url}:\n{out}");
    // With --bundles: the same, then one line per bundle with its reason; still exit 0.
    let (code, out, err) = status_cmd_with(&["--bundles", &url]);
    assert_eq!(code, Some(0), "{out}\n{err}");
    assert!(out.contains("\nWaiting bundles: 4\n"), "{out}");
    let line_of = |uuid: &str| {
        out.lines()
            .find(|l| l.trim_start().starts_with(uuid))
            .unwrap_or_else(|| panic!("no line for {uuid} in\n{out}"))
            .to_string()
    };
    let l = line_of(&big);
    assert!(
        l.contains(" unschedulable ")
            && l.ends_with("requests 64 CPUs, the largest shape has 1: 63 over"),
        "{l}"
    );
    for uuid in &uuids[..3] {
        let l = line_of(uuid);
        assert!(l.contains(" over_cap ") && l.ends_with(capped), "{l}");
    }

    // Nothing listening: EX_UNAVAILABLE (69), never 2 (a usage error, below).
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = closed.local_addr().unwrap().port();
    drop(closed);
    let (code, out, err) = status_cmd(&format!("http://127.0.0.1:{port}"));
    assert_eq!(code, Some(69), "{out}\n{err}");
    assert!(err.contains("cannot reach"), "{err}");
    let usage = std::process::Command::new(env!("CARGO_BIN_EXE_cl-worker-manager"))
        .args(["status", "--no-such-flag"])
        .output()
        .unwrap();
    assert_eq!(usage.status.code(), Some(2), "{usage:?}");

    drop(m);
    for uuid in &uuids {
        cl.run(&["rm", uuid]);
    }
}
