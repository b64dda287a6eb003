//! The runtime conformance suite (`worker/src/runtime/conformance.rs`) on the real runtimes:
//! Docker (the machine's engine), Podman (`podman system service`, tests/peers/podman.sh) and
//! the Kubernetes stand-in (tests/peers/k8s.sh: runs are pods on node `node-a`, run in Docker by
//! its node agent). The in-memory fake passes the same suite in the crate's unit tests.

use std::path::Path;
use std::sync::Arc;

use codalab_worker::metrics::Metrics;
use codalab_worker::runtime::conformance::{self, Behaviour, Harness};
use codalab_worker::runtime::docker::{DockerConfig, DockerRuntime};
use codalab_worker::runtime::kubernetes::{KubernetesConfig, KubernetesRuntime};
use codalab_worker::runtime::{BundleRuntime, RunSpec};
use tokio_util::sync::CancellationToken;

/// The test image (tests/peers/test-image.sh), under every engine.
const IMAGE: &str = "codalab/default-cpu:latest";
/// A registry that refuses at once (the discard port).
const MISSING: &str = "127.0.0.1:9/cl-worker-conformance/absent:1";

struct Docker {
    config: DockerConfig,
    rt: DockerRuntime,
    work_dir: tempfile::TempDir,
    worker_id: String,
    /// Podman here runs without cgroups (tests/peers/podman.sh).
    podman: bool,
}

impl Docker {
    async fn connect(name: &str, docker_host: Option<String>, podman: bool) -> Self {
        let worker_id = testkit::worker::unique(&format!("conf-{name}"));
        let config = DockerConfig {
            docker_host,
            // One set of networks for every run of the suite (as workers sharing an engine
            // share theirs): a run that fails before its shutdown leaves nothing new behind,
            // and the engine's address pools (about 30 networks) are not used up.
            network_prefix: "clw-conformance".into(),
            max_image_cache_bytes: None,
            max_image_bytes: None,
        };
        let work_dir = tempfile::tempdir().unwrap();
        let rt = DockerRuntime::connect(&config, work_dir.path(), Arc::new(Metrics::new()))
            .await
            .expect("connect");
        Docker {
            config,
            rt,
            work_dir,
            worker_id,
            podman,
        }
    }
}

impl Harness for Docker {
    type Runtime = DockerRuntime;

    fn runtime(&self) -> &DockerRuntime {
        &self.rt
    }

    async fn restarted(&self) -> DockerRuntime {
        let rt =
            DockerRuntime::connect(&self.config, self.work_dir.path(), Arc::new(Metrics::new()))
                .await
                .expect("connect again");
        rt.prepare().await.expect("prepare again");
        rt
    }

    fn spec(&self, b: Behaviour) -> RunSpec {
        conformance::spec_in(self.work_dir.path(), &self.worker_id, IMAGE, b)
    }

    fn missing_image(&self) -> (String, String) {
        // The engine's text names the registry it could not reach.
        (MISSING.into(), "127.0.0.1:9".into())
    }

    fn without_cgroups(&self) -> Option<&'static str> {
        self.podman.then_some(
            "the Podman peer runs with cgroups disabled on this machine's hybrid cgroup layout \
             (tests/peers/podman.sh): limits are accepted, not enforced, and nothing is measured",
        )
    }
}

async fn docker_suite(name: &str, host: Option<String>, podman: bool) {
    let h = Docker::connect(name, host, podman).await;
    conformance::run_all(&h).await;
    h.rt.shutdown().await;
}

#[tokio::test]
async fn docker_passes_the_runtime_conformance_suite() {
    testkit::peers::bash(&["tests/peers/test-image.sh"], &Default::default());
    docker_suite("docker", None, false).await;
}

#[tokio::test]
async fn podman_passes_the_runtime_conformance_suite() {
    let host = testkit::podman::service().to_string();
    docker_suite("podman", Some(host), true).await;
}

struct Kubernetes {
    config: KubernetesConfig,
    rt: KubernetesRuntime,
    work_dir: tempfile::TempDir,
    worker_id: String,
    stop: CancellationToken,
}

impl Kubernetes {
    async fn runtime(
        config: &KubernetesConfig,
        work_dir: &Path,
        worker_id: &str,
        stop: &CancellationToken,
    ) -> KubernetesRuntime {
        KubernetesRuntime::connect(config, work_dir, worker_id, stop.clone())
            .await
            .expect("connect")
    }
}

impl Harness for Kubernetes {
    type Runtime = KubernetesRuntime;

    fn runtime(&self) -> &KubernetesRuntime {
        &self.rt
    }

    async fn restarted(&self) -> KubernetesRuntime {
        Self::runtime(
            &self.config,
            self.work_dir.path(),
            &self.worker_id,
            &self.stop,
        )
        .await
    }

    fn spec(&self, b: Behaviour) -> RunSpec {
        conformance::spec_in(self.work_dir.path(), &self.worker_id, IMAGE, b)
    }

    fn missing_image(&self) -> (String, String) {
        // The kubelet's reason, as the pod's status gives it.
        (MISSING.into(), "ImagePullBackOff".into())
    }
}

#[tokio::test]
async fn kubernetes_stand_in_passes_the_runtime_conformance_suite() {
    let url = testkit::k8s::url();
    let config = KubernetesConfig {
        access: common::cluster::ClusterAccess {
            flag_prefix: "kubernetes-",
            cluster_host: Some(url),
            auth_token: None,
            auth_token_file: None,
            cert_path: None,
            cert: None,
            namespace: testkit::k8s::NS.into(),
            allow_insecure: false,
        },
        node: "node-a".into(),
        pod: None,
        kubelet_stats: true,
        no_gpus: false,
    };
    let worker_id = testkit::worker::unique("conf-k8s");
    let work_dir = tempfile::tempdir().unwrap();
    let stop = CancellationToken::new();
    let rt = Kubernetes::runtime(&config, work_dir.path(), &worker_id, &stop).await;
    let h = Kubernetes {
        config,
        rt,
        work_dir,
        worker_id,
        stop,
    };
    conformance::run_all(&h).await;
    h.stop.cancel();
}
