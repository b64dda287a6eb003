//! The manager at a large installation, by simulation: `Manager<FakeBackend>` with N workers and
//! 10 N staged bundles across 5 shapes, ticking in-process on one thread. A tick does what the
//! manager's own tick does between its HTTP calls: decode the staged-bundle pages and the worker
//! list as the server sends them, absorb the backend's listing, plan, submit and cancel, and
//! update the status page and the metrics. The simulated cluster starts each job one tick after
//! its launch, and its worker checks in a tick later with every CPU busy (bundles keep arriving
//! as fast as they start, so 10 N stay staged and the manager stays at `--max-workers`).
//!
//! Prints one JSON object: ticks and CPU to grow from 0 to N workers, the CPU of a steady tick
//! (this thread's, from `/proc/thread-self/schedstat`) as the manager runs it (the first page
//! of 100 staged bundles, the rest only counted when it cannot change the plan) and with all
//! 10 N staged bundles read and planned, and the process's memory.
//!
//!     cargo run --release -p codalab-worker-manager --example scale_sim -- 2000
//!
//! `bench/run.sh --only sim` runs it for 200, 500, 1,000 and 2,000 workers.

use std::sync::Arc;

use backends::fake::{FakeBackend, FakeCluster};
use backends::{Backend, JobState, WorkerProfile};
use clap::Parser;
use manager::cli::GlobalArgs;
use manager::control::{free_by_worker, staged_bundle, Manager, SEARCH_PAGE};
use manager::metrics::Metrics;
use manager::policy::{self, Shape, StagedBundle};
use protocol::{Bundle, ClientConfig, Credentials, Document, Resource, RestClient};
use serde_json::{json, Value};

const GIB: u64 = 1 << 30;
/// Steady ticks measured once the installation is at its size.
const STEADY_TICKS: usize = 11;

/// The five worker shapes and, for each, what its bundles request (each fits its own shape
/// best).
fn shapes() -> Vec<(Shape, (u32, u32, &'static str))> {
    vec![
        (Shape::new("cpu-1", 1, 0, 4 * GIB), (1, 0, "2g")),
        (Shape::new("cpu-8", 8, 0, 32 * GIB), (4, 0, "16g")),
        (Shape::new("mem-256", 8, 0, 256 * GIB), (2, 0, "200g")),
        (Shape::new("gpu-1", 8, 1, 64 * GIB), (4, 1, "32g")),
        (Shape::new("gpu-8", 64, 8, 512 * GIB), (32, 4, "256g")),
    ]
}

/// The staged bundles as the server's search sends them: pages of [`SEARCH_PAGE`] JSON:API
/// documents, with their owner included.
fn staged_pages(n: usize) -> Vec<Vec<u8>> {
    let kinds = shapes();
    let bundles: Vec<Value> = (0..n)
        .map(|i| {
            let (cpus, gpus, memory) = kinds[i % kinds.len()].1;
            let uuid = format!("0x{i:032x}");
            json!({
                "type": "bundles",
                "id": uuid,
                "attributes": {
                    "uuid": uuid,
                    "bundle_type": "run",
                    "command": format!("python train.py --seed {i}"),
                    "state": "staged",
                    "owner_id": "0",
                    "is_anonymous": false,
                    "data_hash": null,
                    "frozen": null,
                    "metadata": {
                        "name": format!("run-{i}"),
                        "description": "",
                        "tags": [],
                        "allow_failed_dependencies": false,
                        "request_docker_image": "codalab/default-cpu:latest",
                        "request_time": "",
                        "request_memory": memory,
                        "request_disk": "",
                        "request_cpus": cpus,
                        "request_gpus": gpus,
                        "request_queue": "",
                        "request_priority": 0,
                        "request_network": false,
                        "exclude_patterns": [],
                        "store": "",
                        "created": 1_790_000_000 + i,
                        "staged_status": "Bundle's dependencies are all ready. Waiting for the bundle to be assigned to a worker to be run."
                    },
                    "dependencies": [],
                    "permission": 2,
                    "permission_spec": "all",
                },
                "relationships": {"owner": {"data": {"type": "users", "id": "0"}}},
            })
        })
        .collect();
    bundles
        .chunks(SEARCH_PAGE)
        .map(|page| {
            serde_json::to_vec(&json!({
                "data": page,
                "included": [{"type": "users", "id": "0",
                              "attributes": {"user_name": "codalab"}}],
                "meta": {"version": "1.7.5"},
            }))
            .unwrap()
        })
        .collect()
}

fn decode_page(body: &[u8]) -> Vec<StagedBundle> {
    let doc: Document<Vec<Resource>> = serde_json::from_slice(body).expect("a staged page");
    doc.data
        .into_iter()
        .map(|r| staged_bundle(&Bundle::from_resource(r)))
        .collect()
}

/// `/rest/workers/info` with these checked-in workers, every CPU of theirs busy.
fn workers_body(workers: &[(String, Shape)]) -> Vec<u8> {
    let data: Vec<Value> = workers
        .iter()
        .map(|(id, s)| {
            json!({
                "worker_id": format!("host-{id}"),
                "cpus": s.resources.cpus, "gpus": s.resources.gpus, "memory_bytes": s.resources.memory_bytes,
                "free_disk_bytes": 500 * GIB,
                "cpus_in_use": s.resources.cpus, "gpus_in_use": s.resources.gpus,
                "checkin_time": 1_790_000_000.0,
                "run_uuids": ["0x0"],
                "tag": null, "group_uuid": null, "tag_exclusive": false,
                "exit_after_num_runs": 999_999_999, "is_terminating": false,
                "preemptible": false, "shared_file_system": false,
            })
        })
        .collect();
    serde_json::to_vec(&json!({"data": data})).unwrap()
}

/// This thread's CPU time so far, in seconds.
fn thread_cpu() -> f64 {
    let s = std::fs::read_to_string("/proc/thread-self/schedstat").expect("schedstat");
    let ns: f64 = s.split_whitespace().next().unwrap().parse().unwrap();
    ns / 1e9
}

/// A field of `/proc/self/status` in MiB.
fn status_mib(field: &str) -> f64 {
    let s = std::fs::read_to_string("/proc/self/status").unwrap();
    let kib: f64 = s
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.trim_start_matches(':').split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0.0);
    kib / 1024.0
}

#[derive(Parser)]
struct Flags {
    #[command(flatten)]
    global: GlobalArgs,
}

/// The simulated server and batch system around one manager.
struct World {
    cluster: Arc<FakeCluster>,
    pages: Vec<Vec<u8>>,
    staged: usize,
    checked_in: Vec<(String, Shape)>,
    workers: Vec<u8>,
}

impl World {
    /// Between ticks: pending jobs start, jobs that were running check in.
    async fn advance(&mut self) {
        let shapes: Vec<Shape> = shapes().into_iter().map(|(s, _)| s).collect();
        let listed = FakeBackend::new(self.cluster.clone()).list().await.unwrap();
        let known: std::collections::HashSet<String> =
            self.checked_in.iter().map(|(id, _)| id.clone()).collect();
        for j in listed {
            match j.state {
                JobState::Pending => self.cluster.set_state(&j.id, JobState::Running),
                JobState::Running if !known.contains(&j.worker_id) => {
                    let shape = shapes.iter().find(|s| s.name == j.shape_name).unwrap();
                    self.checked_in.push((j.worker_id, shape.clone()));
                }
                _ => {}
            }
        }
        self.workers = workers_body(&self.checked_in);
    }
}

/// One tick as the manager makes it, without its HTTP: `all` reads every staged page, else the
/// first page decides whether the rest is read or only counted. Returns this thread's CPU
/// seconds and the launches made.
async fn tick(m: &mut Manager<FakeBackend>, w: &World, all: bool) -> (f64, u32) {
    let t0 = thread_cpu();
    let mut staged = decode_page(&w.pages[0]);
    let listed = m.backend.list().await;
    let info: Value = serde_json::from_slice(&w.workers).unwrap();
    let free = free_by_worker(&info);
    let jobs = m.absorb_listing(listed, &free);
    let mut unread = 0;
    if staged.len() == SEARCH_PAGE {
        if !all && policy::staged_prefix_decides(&m.config, &staged, &jobs) {
            unread = (w.staged - staged.len()) as u64;
        } else {
            for p in &w.pages[1..] {
                staged.extend(decode_page(p));
            }
        }
    }
    let plan = m.plan_with(staged, jobs, unread);
    m.metrics.observe_plan(&plan);
    m.execute(&plan).await;
    let status = m.status_after_tick(Some(&plan), common::now_unix());
    m.metrics.set_status(status);
    let launched = plan.shapes.iter().map(|s| s.launches_granted).sum();
    (thread_cpu() - t0, launched)
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

async fn simulate(n: usize) -> Value {
    let rss_start = status_mib("VmRSS");
    let staged = 10 * n;
    let pages = staged_pages(staged);
    let world_mib = pages.iter().map(Vec::len).sum::<usize>() as f64 / (1 << 20) as f64;
    let cluster = FakeCluster::new();
    let mut w = World {
        cluster: cluster.clone(),
        pages,
        staged,
        checked_in: Vec::new(),
        workers: workers_body(&[]),
    };
    let max = n.to_string();
    let g = Flags::try_parse_from([
        "cl-worker-manager",
        "--server",
        "http://127.0.0.1:9",
        "--min-workers",
        "0",
        "--max-workers",
        &max,
        "--min-seconds-between-workers",
        "0",
    ])
    .expect("flags")
    .global;
    let mut config = manager::app::policy_config(&g, Shape::from_flags(1, 0, 1024)).unwrap();
    config.shapes = shapes().into_iter().map(|(s, _)| s).collect();
    config.launch_rate_per_sec = n as f64;
    config.launch_burst = n as u32;
    config.validate().unwrap();
    // Never called: the simulation hands the manager the server's answers itself.
    let client = RestClient::new(
        ClientConfig::new("http://127.0.0.1:9".to_string()),
        Credentials {
            username: "codalab".into(),
            password: "unused".into(),
        },
    )
    .unwrap();
    let mut m = Manager::new(
        client,
        FakeBackend::new(cluster),
        WorkerProfile::new(Box::new(|id| format!("/tmp/cl_worker_{id}_work_dir"))),
        config,
        g.settings(),
        g.staged_keywords("codalab"),
        Arc::new(Metrics::new()),
    );

    // Growth: from no worker until all N have checked in.
    let (mut grow_ticks, mut grow_cpu, mut grow_max, mut launched) = (0, 0.0, 0.0f64, 0);
    while w.checked_in.len() < n {
        assert!(
            grow_ticks < 50,
            "{} of {n} workers after 50 ticks",
            w.checked_in.len()
        );
        let (cpu, l) = tick(&mut m, &w, false).await;
        launched += l;
        grow_ticks += 1;
        grow_cpu += cpu;
        grow_max = grow_max.max(cpu);
        w.advance().await;
    }
    assert_eq!(launched as usize, n, "launches");
    let mut as_run = Vec::new();
    let mut all_read = Vec::new();
    for _ in 0..STEADY_TICKS {
        let (cpu, l) = tick(&mut m, &w, false).await;
        assert_eq!(l, 0, "a launch past --max-workers");
        as_run.push(cpu);
        let (cpu, l) = tick(&mut m, &w, true).await;
        assert_eq!(l, 0, "a launch past --max-workers");
        all_read.push(cpu);
        w.advance().await;
    }
    json!({
        "workers": n,
        "staged": staged,
        "shapes": shapes().len(),
        "growth_ticks": grow_ticks,
        "growth_cpu_s": grow_cpu,
        "growth_max_tick_cpu_s": grow_max,
        "tick_cpu_s": median(as_run),
        "tick_all_read_cpu_s": median(all_read),
        "rss_start_mib": rss_start,
        "rss_mib": status_mib("VmRSS"),
        "peak_rss_mib": status_mib("VmHWM"),
        "server_bodies_mib": world_mib,
    })
}

fn main() {
    let n: usize = std::env::args()
        .nth(1)
        .map(|a| a.parse().expect("the number of workers"))
        .unwrap_or(2000);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    println!("{}", rt.block_on(simulate(n)));
}
