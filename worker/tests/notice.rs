//! `--preemption-notice`: small stand-ins of EC2's instance metadata (IMDSv2), Azure's
//! Scheduled Events and GCE's metadata server, written from the clouds' documented formats,
//! give notice of a reclaim mid-run; the worker hands its run back (`staged`, nothing
//! uploaded, its container killed and removed) and exits. A rebalance recommendation makes it
//! take no new runs and exit once the one it has is done.

mod standin;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use codalab_worker::agent::ExitReason;
use codalab_worker::notice::{Endpoints, Source, Watch};
use codalab_worker::runtime::fake::{Call, Exit, FakeRuntime};
use serde_json::json;
use standin::{
    config, first_report, run_message, spawn_worker, stopped, until, until_called, Server,
};
use wiremock::matchers::{header, method, path};
use wiremock::{Mock, MockServer, Request, Respond, ResponseTemplate};

const UUID: &str = "0x0c0c0c0c0c0c0c0c0c0c0c0c0c0c0c0c";

/// Answers `before` until the switch is on, then `after`.
struct Switch {
    on: Arc<AtomicBool>,
    before: ResponseTemplate,
    after: ResponseTemplate,
}

impl Respond for Switch {
    fn respond(&self, _: &Request) -> ResponseTemplate {
        if self.on.load(Ordering::SeqCst) {
            self.after.clone()
        } else {
            self.before.clone()
        }
    }
}

fn switch(on: &Arc<AtomicBool>, before: ResponseTemplate, after: ResponseTemplate) -> Switch {
    Switch {
        on: on.clone(),
        before,
        after,
    }
}

/// EC2's IMDSv2: a session token by PUT, then the spot instance-action and the rebalance
/// recommendation (404 until set), both only with the token.
async fn imds(reclaim: &Arc<AtomicBool>, rebalance: &Arc<AtomicBool>) -> MockServer {
    let m = MockServer::start().await;
    Mock::given(method("PUT"))
        .and(path("/latest/api/token"))
        .and(header("X-aws-ec2-metadata-token-ttl-seconds", "21600"))
        .respond_with(ResponseTemplate::new(200).set_body_string("tok-1"))
        .mount(&m)
        .await;
    Mock::given(method("GET"))
        .and(path("/latest/meta-data/spot/instance-action"))
        .and(header("X-aws-ec2-metadata-token", "tok-1"))
        .respond_with(switch(
            reclaim,
            ResponseTemplate::new(404).set_body_string("Not Found"),
            ResponseTemplate::new(200)
                .set_body_json(json!({"action": "terminate", "time": "2026-11-27T08:22:00Z"})),
        ))
        .mount(&m)
        .await;
    Mock::given(method("GET"))
        .and(path("/latest/meta-data/events/recommendations/rebalance"))
        .and(header("X-aws-ec2-metadata-token", "tok-1"))
        .respond_with(switch(
            rebalance,
            ResponseTemplate::new(404).set_body_string("Not Found"),
            ResponseTemplate::new(200).set_body_json(json!({"noticeTime": "2026-11-27T08:20:00Z"})),
        ))
        .mount(&m)
        .await;
    // Without the token: 401, as IMDSv2 answers.
    Mock::given(method("GET"))
        .respond_with(ResponseTemplate::new(401))
        .mount(&m)
        .await;
    m
}

/// Azure's instance metadata: the instance document, this VM's name, and Scheduled Events
/// (a `Freeze` of this VM and a `Preempt` of another until the switch, then a `Preempt` of
/// this one). Every request needs `Metadata: true`.
async fn azure(preempt: &Arc<AtomicBool>) -> MockServer {
    let m = MockServer::start().await;
    Mock::given(method("GET"))
        .and(path("/metadata/instance"))
        .and(header("Metadata", "true"))
        .respond_with(ResponseTemplate::new(200).set_body_json(
            json!({"compute": {"name": "pool-node-7", "priority": "Spot"}, "network": {}}),
        ))
        .mount(&m)
        .await;
    Mock::given(method("GET"))
        .and(path("/metadata/instance/compute/name"))
        .and(header("Metadata", "true"))
        .respond_with(ResponseTemplate::new(200).set_body_string("pool-node-7"))
        .mount(&m)
        .await;
    let event = |id: &str, kind: &str, vm: &str| {
        json!({"EventId": id, "EventType": kind, "ResourceType": "VirtualMachine",
               "Resources": [vm], "EventStatus": "Scheduled",
               "NotBefore": "Fri, 27 Nov 2026 08:30:17 GMT", "Description": "",
               "EventSource": "Platform", "DurationInSeconds": -1})
    };
    Mock::given(method("GET"))
        .and(path("/metadata/scheduledevents"))
        .and(header("Metadata", "true"))
        .respond_with(switch(
            preempt,
            ResponseTemplate::new(200).set_body_json(json!({"DocumentIncarnation": 1,
                "Events": [event("A", "Freeze", "pool-node-7"), event("B", "Preempt", "pool-node-2")]})),
            ResponseTemplate::new(200).set_body_json(json!({"DocumentIncarnation": 2,
                "Events": [event("C", "Preempt", "pool-node-7")]})),
        ))
        .mount(&m)
        .await;
    Mock::given(method("GET"))
        .respond_with(ResponseTemplate::new(400))
        .mount(&m)
        .await;
    m
}

/// GCE's metadata server: `Metadata-Flavor: Google` asked and answered.
async fn gce(preempted: &Arc<AtomicBool>) -> MockServer {
    let m = MockServer::start().await;
    let google = |t: ResponseTemplate| t.insert_header("Metadata-Flavor", "Google");
    Mock::given(method("GET"))
        .and(path("/computeMetadata/v1/instance/preempted"))
        .and(header("Metadata-Flavor", "Google"))
        .respond_with(switch(
            preempted,
            google(ResponseTemplate::new(200).set_body_string("FALSE")),
            google(ResponseTemplate::new(200).set_body_string("TRUE")),
        ))
        .mount(&m)
        .await;
    Mock::given(method("GET"))
        .and(path("/computeMetadata/v1/instance/maintenance-event"))
        .and(header("Metadata-Flavor", "Google"))
        .respond_with(google(ResponseTemplate::new(200).set_body_string("NONE")))
        .mount(&m)
        .await;
    Mock::given(method("GET"))
        .and(path("/computeMetadata/v1/"))
        .and(header("Metadata-Flavor", "Google"))
        .respond_with(google(
            ResponseTemplate::new(200).set_body_string("instance/\nproject/\n"),
        ))
        .mount(&m)
        .await;
    m
}

/// Nothing listens here: a service that is not there.
const NOWHERE: &str = "http://127.0.0.1:9";

fn watch(source: Source, aws: &str, azure: &str, gcp: &str) -> Watch {
    Watch {
        source,
        endpoints: Endpoints {
            aws: aws.into(),
            azure: azure.into(),
            gcp: gcp.into(),
        },
        period: Duration::from_millis(200),
    }
}

/// One run under way on a worker watching `w`; `flip` gives the notice; the run must come
/// back `staged`, its container killed and removed, nothing uploaded, and the worker stop.
async fn reclaimed_mid_run(w: Watch, flip: &Arc<AtomicBool>, pass_down: bool) {
    let server = Server::start(Duration::from_millis(200)).await;
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = config("spot", &dir.path().join("wd"), Duration::from_secs(1));
    cfg.agent.preemption_notice = Some(w);
    cfg.agent.pass_down_termination = pass_down;
    let rt = FakeRuntime::new();
    server.send(run_message(UUID, "sleep 1000"));
    let worker = spawn_worker(&server, cfg, rt.clone()).await;
    until_called(&rt, Call::Start(UUID.into())).await;
    // Polled for a while with nothing to say: the run goes on.
    tokio::time::sleep(Duration::from_millis(700)).await;
    assert!(!rt.calls().contains(&Call::Kill(UUID.into())));
    flip.store(true, Ordering::SeqCst);
    let reason = stopped(worker).await;
    assert_eq!(reason, ExitReason::Reclaimed);
    let calls = rt.calls();
    assert!(calls.contains(&Call::Kill(UUID.into())), "{calls:?}");
    assert!(calls.contains(&Call::Remove(UUID.into())), "{calls:?}");
    assert!(rt.runs().is_empty(), "a container left behind");
    let checkins = server.checkins();
    let (c, _) = first_report(&checkins, UUID, "staged");
    assert_eq!(c.body["is_terminating"], true);
    assert_eq!(
        checkins.last().unwrap().run(UUID).unwrap()["state"],
        "staged"
    );
    assert!(
        server.uploads().is_empty(),
        "a handed-back run uploads nothing"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ec2_spot_interruption_notice_hands_the_run_back() {
    let (reclaim, rebalance) = (
        Arc::new(AtomicBool::new(false)),
        Arc::new(AtomicBool::new(false)),
    );
    let m = imds(&reclaim, &rebalance).await;
    // Without --pass-down-termination too: the machine and its containers are going.
    reclaimed_mid_run(
        watch(Source::Aws, &m.uri(), NOWHERE, NOWHERE),
        &reclaim,
        false,
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_azure_preempt_event_of_this_vm_hands_the_run_back_found_by_auto() {
    let on = Arc::new(AtomicBool::new(false));
    let m = azure(&on).await;
    // auto: no AWS token service answers, Azure's instance document does. Another VM's
    // Preempt and this one's Freeze (before the switch) are no notice.
    reclaimed_mid_run(watch(Source::Auto, NOWHERE, &m.uri(), NOWHERE), &on, true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gce_preemption_hands_the_run_back() {
    let on = Arc::new(AtomicBool::new(false));
    let m = gce(&on).await;
    reclaimed_mid_run(watch(Source::Gcp, NOWHERE, NOWHERE, &m.uri()), &on, false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ec2_rebalance_recommendation_drains_the_worker() {
    // The recommendation comes once the run has started (from the start, a loaded machine
    // could let the worker see it before it took the run, which it then hands back).
    let (reclaim, rebalance) = (
        Arc::new(AtomicBool::new(false)),
        Arc::new(AtomicBool::new(false)),
    );
    let m = imds(&reclaim, &rebalance).await;
    let server = Server::start(Duration::from_millis(200)).await;
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = config("rebalanced", &dir.path().join("wd"), Duration::from_secs(1));
    cfg.agent.preemption_notice = Some(watch(Source::Aws, &m.uri(), NOWHERE, NOWHERE));
    cfg.agent.exit_after_num_runs = 10;
    let rt = FakeRuntime::new();
    server.send(run_message(UUID, "sleep 1000"));
    let worker = spawn_worker(&server, cfg, rt.clone()).await;
    until_called(&rt, Call::Start(UUID.into())).await;
    rebalance.store(true, Ordering::SeqCst);
    // The recommendation: the worker says it is terminating and keeps its run.
    until("a checkin saying terminating", || {
        server
            .checkins()
            .iter()
            .any(|c| c.body["is_terminating"] == true)
    })
    .await;
    assert!(!rt.calls().contains(&Call::Kill(UUID.into())));
    // A run offered now is handed straight back, never started.
    const OTHER: &str = "0x0d0d0d0d0d0d0d0d0d0d0d0d0d0d0d0d";
    server.send(run_message(OTHER, "true"));
    until("the second run handed back", || {
        server
            .checkins()
            .iter()
            .any(|c| c.run(OTHER).is_some_and(|r| r["state"] == "staged"))
    })
    .await;
    assert!(!rt.calls().contains(&Call::Start(OTHER.into())));
    // The first run ends and is uploaded as usual; then the worker exits.
    assert!(rt.exit(UUID, Exit::Code(0)));
    let reason = stopped(worker).await;
    assert_eq!(reason, ExitReason::Drained);
    assert_eq!(server.uploads().len(), 1, "the finished run's results");
    assert_eq!(server.uploads()[0].0, UUID);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_no_metadata_service_auto_polls_nothing_and_the_run_goes_on() {
    let server = Server::start(Duration::from_millis(200)).await;
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = config("on-prem", &dir.path().join("wd"), Duration::from_secs(1));
    cfg.agent.preemption_notice = Some(watch(Source::Auto, NOWHERE, NOWHERE, NOWHERE));
    let rt = FakeRuntime::new();
    rt.exit_on_start(UUID, Exit::Code(0));
    server.send(run_message(UUID, "true"));
    let worker = spawn_worker(&server, cfg, rt.clone()).await;
    assert_eq!(stopped(worker).await, ExitReason::NumRuns);
    assert_eq!(server.uploads().len(), 1);
}
