use super::*;
use serde_json::json;
use wiremock::matchers::{body_string_contains, header, method, path};
use wiremock::{Mock, MockServer, ResponseTemplate};

fn creds() -> Credentials {
    Credentials {
        username: "alice".into(),
        password: "pw&=x".into(),
    }
}

async fn client(server: &MockServer) -> RestClient {
    let mut cfg = ClientConfig::new(server.uri());
    cfg.max_attempts = 3;
    RestClient::new(cfg, creds()).unwrap()
}

/// The token endpoint, answering every grant with an hour-long token.
async fn mount_token(server: &MockServer) {
    Mock::given(method("POST"))
        .and(path("/rest/oauth2/token"))
        .respond_with(token_ok(3600))
        .mount(server)
        .await;
}

fn token_ok(expires_in: u64) -> ResponseTemplate {
    ResponseTemplate::new(200).set_body_json(json!({"access_token": "tok", "token_type": "Bearer",
        "expires_in": expires_in, "refresh_token": "r", "scope": "default"}))
}

#[test]
fn quote_like_python() {
    assert_eq!(quote("host(123)"), "host%28123%29");
    assert_eq!(quote("a/b c"), "a/b%20c");
    assert_eq!(quote("w-1_x.y~"), "w-1_x.y~");
}

#[tokio::test]
async fn password_grant_exactly() {
    let server = MockServer::start().await;
    Mock::given(method("POST"))
        .and(path("/rest/oauth2/token"))
        // base64("codalab_worker_client:")
        .and(header(
            "authorization",
            "Basic Y29kYWxhYl93b3JrZXJfY2xpZW50Og==",
        ))
        .and(header("x-requested-with", "XMLHttpRequest"))
        .and(header("content-type", "application/x-www-form-urlencoded"))
        .and(body_string_contains("grant_type=password"))
        .and(body_string_contains("username=alice"))
        .and(body_string_contains("password=pw%26%3Dx"))
        .respond_with(token_ok(3600))
        .expect(1)
        .mount(&server)
        .await;
    Mock::given(method("POST"))
        .and(path("/rest/workers/w%281%29/checkin"))
        .and(header("authorization", "Bearer tok"))
        .and(header("x-requested-with", "XMLHttpRequest"))
        .respond_with(ResponseTemplate::new(200).set_body_json(json!([null])))
        .expect(2)
        .mount(&server)
        .await;
    let c = client(&server).await;
    c.login().await.unwrap();
    let body = sample_checkin();
    assert!(c.checkin("w(1)", &body).await.unwrap().is_empty());
    // The token is still fresh: no second grant.
    assert!(c.checkin("w(1)", &body).await.unwrap().is_empty());
}

#[tokio::test]
async fn a_short_token_is_not_granted_again_for_every_request() {
    let server = MockServer::start().await;
    Mock::given(method("POST"))
        .and(path("/rest/oauth2/token"))
        .respond_with(token_ok(1)) // a one-second lifetime, clamped to a minute
        .expect(1)
        .mount(&server)
        .await;
    Mock::given(method("POST"))
        .and(path("/rest/workers/w/checkin"))
        .respond_with(ResponseTemplate::new(200).set_body_json(json!([null])))
        .mount(&server)
        .await;
    let c = client(&server).await;
    c.login().await.unwrap();
    c.checkin("w", &sample_checkin()).await.unwrap();
    c.checkin("w", &sample_checkin()).await.unwrap();
}

#[test]
fn token_lifetimes_are_clamped() {
    let s = |x: Option<f64>| token_renewal(x).as_secs_f64();
    // Renewed five minutes before expiry, or half-way through a short lifetime.
    assert_eq!(s(Some(3600.0)), 3300.0);
    assert_eq!(s(None), 3300.0);
    assert_eq!(s(Some(200.0)), 100.0);
    assert_eq!(s(Some(1.0)), 30.0);
    assert_eq!(s(Some(-5.0)), 30.0);
    assert_eq!(s(Some(f64::NAN)), 3300.0);
    // Huge lifetimes neither panic nor overflow the clock.
    let month = 30.0 * 24.0 * 3600.0;
    assert_eq!(s(Some(1e300)), month - 300.0);
    assert_eq!(s(Some(f64::INFINITY)), month - 300.0);
    let _ = std::time::Instant::now() + token_renewal(Some(f64::MAX));
}

#[tokio::test]
async fn bad_credentials_are_an_auth_error_without_retry() {
    let server = MockServer::start().await;
    Mock::given(method("POST"))
        .and(path("/rest/oauth2/token"))
        .respond_with(ResponseTemplate::new(401).set_body_json(
            json!({"error": "invalid_grant", "error_description": "Invalid credentials given."}),
        ))
        .expect(1)
        .mount(&server)
        .await;
    let e = client(&server).await.login().await.unwrap_err();
    assert!(matches!(e, Error::Auth { .. }), "{e}");
    assert!(e.to_string().contains("Invalid credentials given."), "{e}");
    assert!(!e.to_string().contains("pw&=x"));
}

#[tokio::test]
async fn checkin_is_not_resent_on_5xx() {
    let server = MockServer::start().await;
    mount_token(&server).await;
    Mock::given(method("POST"))
        .and(path("/rest/workers/w/checkin"))
        .respond_with(ResponseTemplate::new(502))
        .expect(1)
        .mount(&server)
        .await;
    let e = client(&server)
        .await
        .checkin("w", &sample_checkin())
        .await
        .unwrap_err();
    assert!(e.is_retryable());
    assert_eq!(e.status(), Some(StatusCode::BAD_GATEWAY));
}

#[tokio::test]
async fn gets_retry_on_5xx_but_not_4xx() {
    let server = MockServer::start().await;
    mount_token(&server).await;
    Mock::given(method("GET"))
        .and(path("/rest/bundles/0x1/contents/info/sub/dir"))
        .respond_with(ResponseTemplate::new(503))
        .up_to_n_times(2)
        .expect(2)
        .mount(&server)
        .await;
    Mock::given(method("GET"))
        .and(path("/rest/bundles/0x1/contents/info/sub/dir"))
        .respond_with(
            ResponseTemplate::new(200).set_body_json(json!({"data": {"type": "directory"}})),
        )
        .expect(1)
        .mount(&server)
        .await;
    Mock::given(method("GET"))
        .and(path("/rest/bundles/0x2/contents/info/"))
        .respond_with(ResponseTemplate::new(404))
        .expect(1)
        .mount(&server)
        .await;
    let c = client(&server).await;
    let info = c.get_target_info("0x1", "sub/dir").await.unwrap();
    assert_eq!(info["type"], "directory");
    let e = c.get_target_info("0x2", "").await.unwrap_err();
    assert_eq!(e.status(), Some(StatusCode::NOT_FOUND));
    assert!(!e.is_retryable());
}

#[tokio::test]
async fn unreachable_server_is_a_retryable_network_error() {
    let mut cfg = ClientConfig::new("http://127.0.0.1:9");
    cfg.max_attempts = 1;
    let c = RestClient::new(cfg, creds()).unwrap();
    let e = c.login().await.unwrap_err();
    assert!(matches!(e, Error::Network { .. }), "{e}");
    assert!(e.is_retryable());
    assert!(e.to_string().contains("cannot reach"), "{e}");
}

#[tokio::test]
async fn start_bundle_false_and_true() {
    let server = MockServer::start().await;
    mount_token(&server).await;
    Mock::given(method("POST"))
        .and(path("/rest/workers/w/start_bundle/0x1"))
        .and(body_string_contains("\"hostname\":\"h\""))
        .and(body_string_contains("\"start_time\":17"))
        .respond_with(ResponseTemplate::new(200).set_body_json(json!(true)))
        .mount(&server)
        .await;
    Mock::given(method("POST"))
        .and(path("/rest/workers/w/start_bundle/0x2"))
        .respond_with(ResponseTemplate::new(200).set_body_json(json!(false)))
        .mount(&server)
        .await;
    let c = client(&server).await;
    assert!(c.start_bundle("w", "0x1", "h", 17).await.unwrap());
    assert!(!c.start_bundle("w", "0x2", "h", 17).await.unwrap());
}

/// A 5xx answer (the server's transaction rolled back, e.g. a MariaDB deadlock) is sent again;
/// a 4xx answer is not.
#[tokio::test]
async fn start_bundle_is_sent_again_after_a_server_error_only() {
    let server = MockServer::start().await;
    mount_token(&server).await;
    Mock::given(method("POST"))
        .and(path("/rest/workers/w/start_bundle/0x1"))
        .respond_with(ResponseTemplate::new(500).set_body_string(
            "Unexpected Internal Error ((MySQLdb._exceptions.OperationalError) (1213, \
             'Deadlock found when trying to get lock; try restarting transaction')",
        ))
        .up_to_n_times(1)
        .expect(1)
        .mount(&server)
        .await;
    Mock::given(method("POST"))
        .and(path("/rest/workers/w/start_bundle/0x1"))
        .respond_with(ResponseTemplate::new(200).set_body_json(json!(true)))
        .expect(1)
        .mount(&server)
        .await;
    Mock::given(method("POST"))
        .and(path("/rest/workers/w/start_bundle/0x2"))
        .respond_with(ResponseTemplate::new(403).set_body_string("not yours"))
        .expect(1)
        .mount(&server)
        .await;
    let c = client(&server).await;
    assert!(c.start_bundle("w", "0x1", "h", 17).await.unwrap());
    let e = c.start_bundle("w", "0x2", "h", 17).await.unwrap_err();
    assert_eq!(e.status(), Some(StatusCode::FORBIDDEN));
    server.verify().await;
}

#[tokio::test]
async fn search_pages_past_the_servers_cap() {
    use wiremock::matchers::query_param;
    let server = MockServer::start().await;
    mount_token(&server).await;
    let page = |ids: &[&str]| {
        let data: Vec<Value> = ids
            .iter()
            .map(|id| json!({"type": "bundles", "id": id, "attributes": {"state": "staged"}}))
            .collect();
        ResponseTemplate::new(200).set_body_json(json!({"data": data, "meta": {}}))
    };
    for (offset, ids) in [
        (0, vec!["0x1", "0x2"]),
        (2, vec!["0x2", "0x3"]),
        (4, vec!["0x4"]),
    ] {
        Mock::given(method("GET"))
            .and(path("/rest/bundles"))
            .and(query_param("keywords", format!(".offset={offset}")))
            .respond_with(page(&ids))
            .expect(1)
            .mount(&server)
            .await;
    }
    let c = client(&server).await;
    let found = c
        .search_bundles(&["state=staged".to_string(), ".mine".to_string()], 2)
        .await
        .unwrap();
    let ids: Vec<_> = found.iter().map(|b| b.uuid.as_str()).collect();
    assert_eq!(ids, ["0x1", "0x2", "0x3", "0x4"]);
    let reqs = server.received_requests().await.unwrap();
    let q = reqs
        .iter()
        .find(|r| r.method.as_str() == "GET")
        .unwrap()
        .url
        .query()
        .unwrap()
        .to_owned();
    assert!(
        q.contains("keywords=state%3Dstaged") && q.contains("keywords=.mine"),
        "{q}"
    );
    assert!(
        q.contains("keywords=.limit%3D2") && q.contains("include=owner"),
        "{q}"
    );
}

#[tokio::test]
async fn count_bundles_reads_the_servers_aggregate() {
    use wiremock::matchers::query_param;
    let server = MockServer::start().await;
    mount_token(&server).await;
    Mock::given(method("GET"))
        .and(path("/rest/bundles"))
        .and(query_param("keywords", ".count"))
        .and(query_param("keywords", "state=staged"))
        .respond_with(
            ResponseTemplate::new(200)
                .set_body_json(json!({"meta": {"result": 10000, "version": "1.7.5"}})),
        )
        .expect(1)
        .mount(&server)
        .await;
    let c = client(&server).await;
    let n = c
        .count_bundles(&["state=staged".to_string()])
        .await
        .unwrap();
    assert_eq!(n, 10000);
    // An answer without the count is an error, not zero.
    server.reset().await;
    mount_token(&server).await;
    Mock::given(method("GET"))
        .and(path("/rest/bundles"))
        .respond_with(ResponseTemplate::new(200).set_body_json(json!({"data": []})))
        .mount(&server)
        .await;
    let e = c
        .count_bundles(&["state=staged".to_string()])
        .await
        .unwrap_err();
    assert!(e.to_string().contains("no count"), "{e}");
}

fn sample_checkin() -> CheckinRequest {
    CheckinRequest {
        tag: None,
        group_name: None,
        cpus: 1,
        gpus: 0,
        memory_bytes: 1,
        free_disk_bytes: 1,
        dependencies: vec![],
        hostname: "h".into(),
        runs: vec![],
        shared_file_system: false,
        tag_exclusive: false,
        exit_after_num_runs: 1,
        is_terminating: false,
        preemptible: false,
    }
}
