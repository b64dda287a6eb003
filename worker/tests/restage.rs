//! SIGTERM with `--pass-down-termination`: the worker hands its run back to the server
//! (`staged`) and stops. Alone in its file: the signal goes to the whole test process.

mod standin;

use std::time::Duration;

use codalab_worker::agent::ExitReason;
use codalab_worker::runtime::fake::{Call, FakeRuntime};
use standin::{
    assert_never_overlapping, config, first_report, run_message, spawn_worker, stopped,
    until_called, Server,
};

const UUID: &str = "0x0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn termination_restages_the_run_and_stops() {
    let server = Server::start(Duration::from_millis(200)).await;
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = config("restager", &dir.path().join("wd"), Duration::from_secs(1));
    cfg.agent.pass_down_termination = true;
    let rt = FakeRuntime::new();
    server.send(run_message(UUID, "sleep 1000"));
    let worker = spawn_worker(&server, cfg, rt.clone()).await;
    until_called(&rt, Call::Start(UUID.into())).await;

    nix::sys::signal::kill(nix::unistd::getpid(), nix::sys::signal::Signal::SIGTERM).unwrap();
    let reason = stopped(worker).await;
    assert_eq!(reason, ExitReason::Signal);
    let calls = rt.calls();
    assert!(calls.contains(&Call::Kill(UUID.into())), "{calls:?}");
    assert!(calls.contains(&Call::Remove(UUID.into())), "{calls:?}");
    // Handed back: the networks go (the last worker of the prefix would leave them otherwise).
    assert_eq!(calls.last(), Some(&Call::Shutdown));
    let checkins = server.checkins();
    assert_never_overlapping(&checkins);
    let (staged, _) = first_report(&checkins, UUID, "staged");
    assert_eq!(staged.body["is_terminating"], true);
    // The worker stops as soon as the server has the run back.
    assert_eq!(
        checkins.last().unwrap().run(UUID).unwrap()["state"],
        "staged"
    );
    assert!(
        server.uploads().is_empty(),
        "a restaged run uploads nothing"
    );
    assert!(rt.runs().is_empty());
}
