//! Two managers, one in charge, on the Kubernetes stand-in: the lease is a coordination.k8s.io/v1
//! `Lease` in the stand-in's API (`--lease kubernetes:codalab/<name>`), the scenario of
//! `testkit::failover` (SIGKILL of the holder mid-burst, SIGSTOP past its lease, a clean stop).

use testkit::failover::{policy_file, run, stage_sleepers, Failover};
use testkit::k8s::*;
use testkit::{cl::*, worker::*};

use super::{pod_names, start_manager, Cleanup};

#[test]
fn two_managers_on_a_kubernetes_lease_one_launches_and_the_other_takes_over() {
    let name = unique("k8s-lease");
    let _clean = Cleanup(name.clone());
    let cl = Cl::new("k8s-lease");
    let tag = unique("clw-k8s-lease");
    let lease_name = format!("{name}-lease");
    let lease = format!("kubernetes:{NS}/{lease_name}");
    let prefix = tempfile::tempdir().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let policy = policy_file(dir.path());
    let lease_s = 6;
    let start = |id: &str| {
        let d = dir.path().join(id);
        std::fs::create_dir_all(&d).unwrap();
        start_manager(
            &d,
            prefix.path(),
            &tag,
            &name,
            &[
                "--max-workers",
                "4",
                "--sleep-time",
                "1",
                "--config",
                &policy,
                "--lease",
                &lease,
                "--lease-duration-seconds",
                &lease_s.to_string(),
                "--lease-identity",
                id,
            ],
            &[],
        )
    };
    let stage = |n: usize| stage_sleepers(&cl, &tag, "500m", n);
    let jobs = || pod_names(&name);
    let report = run(&Failover {
        lease_s,
        start: &start,
        stage: &stage,
        jobs: &jobs,
    });
    // The lease as the API server holds it: `b`'s since `c` handed it back; two takeovers
    // (a → b, b → c; a hand-back and its taking count as none); as created, it passes
    // kubernetes-validate in strict mode.
    let (code, l) = api(
        "GET",
        &format!("/apis/coordination.k8s.io/v1/namespaces/{NS}/leases/{lease_name}"),
        None,
    );
    assert_eq!(code, 200, "{l}");
    assert_eq!(l["spec"]["holderIdentity"], "b", "{l}");
    assert_eq!(l["spec"]["leaseDurationSeconds"], lease_s, "{l}");
    assert_eq!(l["spec"]["leaseTransitions"], 2, "{l} ({report:?})");
    validate_created_of("Lease", &[lease_name]);
}
