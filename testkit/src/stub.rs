//! A CodaLab server stand-in (wiremock) for tests of one behaviour without the real server
//! (the real one is in [`crate::peers`]): login, the staged-bundle search and the worker list,
//! in the real server's wire format.

use std::sync::{Arc, Mutex};

use serde_json::{json, Value};
use wiremock::matchers::{method, path};
use wiremock::{Mock, MockServer, Request, Respond, ResponseTemplate};

/// Answers the OAuth2 password grant (`POST /rest/oauth2/token`) with a bearer token valid for
/// an hour, whatever the credentials.
pub async fn token_endpoint(server: &MockServer) {
    Mock::given(method("POST"))
        .and(path("/rest/oauth2/token"))
        .respond_with(ResponseTemplate::new(200).set_body_json(
            json!({"access_token": "t", "token_type": "Bearer", "expires_in": 3600}),
        ))
        .mount(server)
        .await;
}

/// What the stand-in serves: the staged bundles (uuid, request_cpus), what some of them need
/// (uuid → image and dependencies, `(parent_uuid, parent_path)`) and whether the bundle search
/// answers at all.
#[derive(Default)]
pub struct Served {
    pub staged: Vec<(String, u32)>,
    pub needs: std::collections::HashMap<String, (String, Vec<(String, String)>)>,
    pub down: bool,
}

struct Search(Arc<Mutex<Served>>);

impl Respond for Search {
    fn respond(&self, req: &Request) -> ResponseTemplate {
        let s = self.0.lock().unwrap();
        if s.down {
            return ResponseTemplate::new(503).set_body_string("down for maintenance");
        }
        let keywords: Vec<String> = req
            .url
            .query_pairs()
            .filter(|(k, _)| k == "keywords")
            .map(|(_, v)| v.into_owned())
            .collect();
        assert!(
            keywords.iter().any(|k| k == "state=staged"),
            "the manager searches staged bundles: {keywords:?}"
        );
        if keywords.iter().any(|k| k == ".count") {
            return ResponseTemplate::new(200)
                .set_body_json(json!({"meta": {"result": s.staged.len()}, "data": []}));
        }
        let data: Vec<Value> = s
            .staged
            .iter()
            .map(|(uuid, cpus)| {
                let mut b = json!({"type": "bundles", "id": uuid, "attributes": {
                    "uuid": uuid, "state": "staged", "bundle_type": "run",
                    "metadata": {"request_cpus": cpus, "request_gpus": 0,
                                 "request_memory": "1g", "request_queue": ""},
                    "dependencies": []}});
                if let Some((image, deps)) = s.needs.get(uuid) {
                    let a = &mut b["attributes"];
                    a["metadata"]["request_docker_image"] = json!(image);
                    // As the server's BundleDependencySchema writes them.
                    a["dependencies"] = deps
                        .iter()
                        .map(|(p, path)| {
                            json!({"child_uuid": uuid, "child_path": "d",
                            "parent_uuid": p, "parent_path": path, "parent_name": "dep"})
                        })
                        .collect();
                }
                b
            })
            .collect();
        ResponseTemplate::new(200).set_body_json(json!({"data": data}))
    }
}

/// A stand-in answering login, the staged-bundle search (what `Served` holds) and a worker
/// list where no worker has checked in (every job is pending capacity).
pub async fn server() -> (MockServer, Arc<Mutex<Served>>) {
    let server = MockServer::start().await;
    let served = Arc::new(Mutex::new(Served::default()));
    token_endpoint(&server).await;
    Mock::given(method("GET"))
        .and(path("/rest/bundles"))
        .respond_with(Search(served.clone()))
        .mount(&server)
        .await;
    Mock::given(method("GET"))
        .and(path("/rest/workers/info"))
        .respond_with(ResponseTemplate::new(200).set_body_json(json!({"data": []})))
        .mount(&server)
        .await;
    (server, served)
}
