//! The API's unit tests, and kube-rs's own client against it.

use super::*;

/// Routing, selectors, query strings and the defaults filled in on create.
mod unit {
    use super::*;

    #[test]
    fn routes() {
        assert_eq!(parse_route("/version"), Route::Version);
        assert_eq!(
            parse_route("/api/v1"),
            Route::Resources(String::new(), "v1".into())
        );
        let Route::Resource(rp) = parse_route("/api/v1/namespaces/default/pods/p1/status") else {
            panic!()
        };
        assert_eq!(
            (
                rp.namespace.as_deref(),
                rp.resource.as_str(),
                rp.name.as_deref(),
                rp.sub.as_deref()
            ),
            (Some("default"), "pods", Some("p1"), Some("status"))
        );
        let Route::Resource(rp) = parse_route("/api/v1/namespaces/default") else {
            panic!()
        };
        assert_eq!(
            (rp.namespace, rp.resource.as_str(), rp.name.as_deref()),
            (None, "namespaces", Some("default"))
        );
        let Route::Resource(rp) = parse_route("/api/v1/nodes/a") else {
            panic!()
        };
        assert_eq!(
            (rp.resource.as_str(), rp.name.as_deref()),
            ("nodes", Some("a"))
        );
        let Route::Resource(rp) = parse_route("/apis/batch/v1/namespaces/x/jobs") else {
            panic!()
        };
        assert_eq!((rp.group.as_str(), rp.kind()), ("batch", Some("Job")));
    }

    #[test]
    fn field_selectors() {
        assert_eq!(
            parse_field_selector("status.phase==Running,spec.nodeName!=a,metadata.name=x").unwrap(),
            vec![
                FieldReq {
                    field: "status.phase".into(),
                    value: "Running".into(),
                    equal: true
                },
                FieldReq {
                    field: "spec.nodeName".into(),
                    value: "a".into(),
                    equal: false
                },
                FieldReq {
                    field: "metadata.name".into(),
                    value: "x".into(),
                    equal: true
                },
            ]
        );
        assert!(parse_field_selector("status.phase").is_err());
        let pod = json!({"spec": {}, "status": {"phase": "Pending"}});
        assert_eq!(field_value("Pod", &pod, "spec.nodeName"), Some(None));
        assert_eq!(
            field_value("Pod", &pod, "status.phase"),
            Some(Some("Pending".into()))
        );
        assert_eq!(field_value("Pod", &pod, "spec.bogus"), None);
    }

    #[test]
    fn percent_coding() {
        assert_eq!(
            pct_decode("app%3Dcl-worker%2Cx+in+%28a%29"),
            "app=cl-worker,x in (a)"
        );
        assert_eq!(pct_decode("100%"), "100%");
        assert_eq!(pct_encode("a=b,c"), "a%3Db%2Cc");
    }
}

/// kube-rs (the client the Rust backend uses) against the front over real HTTP, without the
/// node agent: pods stay Pending.
mod kube_rs_tests {
    use std::sync::atomic::AtomicU64;
    use std::sync::{Arc, Mutex};

    use k8s_openapi::api::core::v1::{Node, Pod};
    use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
    use kube::config::{KubeConfigOptions, Kubeconfig};

    use crate::state::{Faults, Shared};

    async fn serve(token: Option<&str>) -> (u16, tempfile::TempDir) {
        let dir = tempfile::tempdir().unwrap();
        let client = kube_fake_client::ClientBuilder::new()
            .with_status_subresource::<Pod>()
            .with_status_subresource::<Node>()
            .build()
            .await
            .unwrap();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let shared = Arc::new(Shared {
            client,
            token: token.map(str::to_string),
            namespaces: vec!["default".into()],
            objects_dir: dir.path().to_path_buf(),
            state_dir: dir.path().to_path_buf(),
            seq: AtomicU64::new(0),
            faults: Mutex::new(Faults::default()),
            wake: tokio::sync::Notify::new(),
            grace: Mutex::new(Default::default()),
            instance: "test".into(),
            version: (1, 36),
            port,
        });
        let app = axum::Router::new()
            .fallback(super::handle)
            .with_state(shared);
        tokio::spawn(async move { axum::serve(listener, app).await });
        (port, dir)
    }

    async fn client(port: u16, token: &str) -> kube::Client {
        // kube-fake-client's dependencies turn on rustls' aws-lc-rs next to ring: with both,
        // rustls cannot pick a provider by itself.
        let _ = rustls::crypto::ring::default_provider().install_default();
        let yaml = format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: s\n  cluster: {{server: 'http://127.0.0.1:{port}'}}\n\
             contexts:\n- name: s\n  context: {{cluster: s, user: u}}\ncurrent-context: s\n\
             users:\n- name: u\n  user: {{token: '{token}'}}\n"
        );
        let kc = Kubeconfig::from_yaml(&yaml).unwrap();
        let config = kube::Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default())
            .await
            .unwrap();
        kube::Client::try_from(config).unwrap()
    }

    fn pod(name: &str, app: &str) -> Pod {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "labels": {"app": app}},
            "spec": {"restartPolicy": "Never", "containers": [{"name": "c", "image": "img",
                     "resources": {"limits": {"cpu": "1", "memory": "64Mi"}}}]},
        }))
        .unwrap()
    }

    #[tokio::test]
    async fn kube_rs_crud_selectors_conflicts_and_auth() {
        let (port, dir) = serve(Some("s3cret")).await;
        let bad: Api<Pod> = Api::namespaced(client(port, "wrong").await, "default");
        match bad.list(&ListParams::default()).await {
            Err(kube::Error::Api(e)) => assert_eq!(e.code, 401),
            other => panic!("wrong token: {other:?}"),
        }
        let c = client(port, "s3cret").await;
        let pods: Api<Pod> = Api::namespaced(c.clone(), "default");
        let created = pods
            .create(&PostParams::default(), &pod("w1", "cl-worker"))
            .await
            .unwrap();
        assert!(created.metadata.uid.is_some());
        assert_eq!(
            created.status.as_ref().and_then(|s| s.phase.as_deref()),
            Some("Pending")
        );
        // Defaulting: requests from limits.
        let req = created.spec.as_ref().unwrap().containers[0]
            .resources
            .as_ref()
            .unwrap()
            .requests
            .clone();
        assert_eq!(req.unwrap()["cpu"].0, "1");
        pods.create(&PostParams::default(), &pod("other", "x"))
            .await
            .unwrap();
        match pods
            .create(&PostParams::default(), &pod("w1", "cl-worker"))
            .await
        {
            Err(kube::Error::Api(e)) => {
                assert_eq!((e.code, e.reason.as_str()), (409, "AlreadyExists"))
            }
            other => panic!("duplicate: {other:?}"),
        }
        let listed = pods
            .list(&ListParams::default().labels("app=cl-worker"))
            .await
            .unwrap();
        assert_eq!(listed.items.len(), 1);
        // The manager's way of counting workers.
        let patched = pods
            .patch_status(
                "w1",
                &PatchParams::default(),
                &Patch::Merge(serde_json::json!({"status": {"phase": "Running"}})),
            )
            .await
            .unwrap();
        assert_eq!(patched.status.unwrap().phase.as_deref(), Some("Running"));
        let running = pods
            .list(&ListParams::default().fields("status.phase==Running"))
            .await
            .unwrap();
        assert_eq!(
            running
                .items
                .iter()
                .map(|p| p.metadata.name.clone().unwrap())
                .collect::<Vec<_>>(),
            ["w1"]
        );
        let not_running = pods
            .list(&ListParams::default().fields("status.phase!=Running"))
            .await
            .unwrap();
        assert_eq!(not_running.items.len(), 1);
        // A stale resourceVersion on replace is a 409 Conflict.
        let mut stale = created.clone();
        stale.metadata.labels = Some([("app".to_string(), "changed".to_string())].into());
        match pods.replace("w1", &PostParams::default(), &stale).await {
            Err(kube::Error::Api(e)) => assert_eq!(e.code, 409),
            other => panic!("stale replace: {other:?}"),
        }
        // Unknown namespace.
        let elsewhere: Api<Pod> = Api::namespaced(c.clone(), "nope");
        match elsewhere
            .create(&PostParams::default(), &pod("w2", "x"))
            .await
        {
            Err(kube::Error::Api(e)) => assert_eq!(e.code, 404),
            other => panic!("unknown namespace: {other:?}"),
        }
        pods.delete("w1", &Default::default()).await.unwrap();
        assert!(pods.get_opt("w1").await.unwrap().is_none());
        // Both accepted creates were recorded for the validation oracle.
        let recorded = std::fs::read_dir(dir.path()).unwrap().count();
        assert_eq!(recorded, 2);
        // Watches are refused rather than answered with a list.
        match pods.watch(&kube::api::WatchParams::default(), "0").await {
            Err(_) => {}
            Ok(stream) => {
                use futures::TryStreamExt;
                let first = Box::pin(stream).try_next().await;
                assert!(first.is_err(), "watch answered {first:?}");
            }
        }
    }
}
