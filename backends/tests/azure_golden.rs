//! Our Azure Batch client against Microsoft's own Batch SDK (PyPI `azure-batch`, run by
//! tests/peers/azure-batch.sh): for every operation the backend uses, the SDK's request and ours
//! for the same inputs and a fixed date must be equal — method, path, query, headers, JSON body
//! byte for byte and the SharedKey `Authorization` value — and the same recorded responses must
//! parse to the same states, exit codes and failure info.
//!
//! Our requests are recorded by a wiremock server answering with the same recorded JSON
//! (tests/peers/azure/fixtures) as the SDK's capture server.

use std::collections::BTreeMap;
use std::io::Write;
use std::process::{Command, Stdio};

use backends::azure_batch::client::{Auth, BatchClient, BatchError, API_VERSION};
use backends::azure_batch::model::{NodeRemove, Task, TaskPage};
use backends::{AzureBatchConfig, JobSpec, Resources};
use serde_json::{json, Value};
use testkit::peers::{bash, repo_root};
use wiremock::matchers::{method, path, path_regex, query_param};
use wiremock::{Mock, MockServer, ResponseTemplate};

const HEADERS: [&str; 9] = [
    "accept",
    "authorization",
    "client-request-id",
    "content-length",
    "content-type",
    "date",
    "ocp-date",
    "x-ms-date",
    "x-ms-version",
];

fn fixture(name: &str) -> String {
    std::fs::read_to_string(repo_root().join("tests/peers/azure/fixtures").join(name)).unwrap()
}

fn defaults() -> Value {
    serde_json::from_str(
        &std::fs::read_to_string(repo_root().join("tests/peers/azure/golden-inputs.json")).unwrap(),
    )
    .unwrap()
}

/// The backend's settings, with the log container of the golden inputs.
fn cfg(d: &Value) -> AzureBatchConfig {
    AzureBatchConfig {
        job_id: d["job_id"].as_str().unwrap().into(),
        task_prefix: "cl_worker_".into(),
        image: "codalab/worker:1.7.5".into(),
        user: "root".into(),
        log_container_url: d["task"]["output_files"][0]["container_url"]
            .as_str()
            .unwrap()
            .into(),
        log_identity: None,
        work_dir_prefix: Some("/mnt/work".into()),
        bundle_mount: None,
        password_file: Some("/mnt/work/.worker-password".into()),
        plaintext_credentials: None,
        pool_id: Some(d["pool_id"].as_str().unwrap().into()),
        remove_unhealthy_after: None,
    }
}

fn spec() -> JobSpec {
    JobSpec {
        worker_id: "0123456789abcdef".into(),
        shape_name: "default".into(),
        resources: Resources::new(2, 0, 4096 << 20),
        command: [
            "cl-worker",
            "--server",
            "https://worksheets.example.org",
            "--verbose",
            "--work-dir",
            "/mnt/work/cl_worker_0123456789abcdef_work_dir",
            "--id",
            "host-0123456789abcdef",
            "--tag",
            "gpu's queue",
        ]
        .map(String::from)
        .to_vec(),
        env: vec![("CODALAB_SENTRY_ENVIRONMENT".into(), "golden".into())],
    }
}

/// The golden inputs for the task and the listing the backend sends.
fn inputs(d: &Value, c: &AzureBatchConfig) -> Value {
    let task = serde_json::to_value(c.task(&spec())).unwrap();
    let q = c.list_query();
    let out = &task["outputFiles"][0];
    let mut i = d.clone();
    i["task"] = json!({
        "id": task["id"],
        "display_name": task["displayName"],
        "command_line": task["commandLine"],
        "image_name": task["containerSettings"]["imageName"],
        "container_run_options": task["containerSettings"]["containerRunOptions"],
        "working_directory": null,
        "max_task_retry_count": task["constraints"]["maxTaskRetryCount"],
        "max_wall_clock_time": null,
        "required_slots": null,
        "environment": task["environmentSettings"].as_array().unwrap().iter()
            .map(|e| json!([e["name"], e["value"]])).collect::<Vec<_>>(),
        "user_identity": {"auto_user": {
            "scope": task["userIdentity"]["autoUser"]["scope"],
            "elevation_level": task["userIdentity"]["autoUser"]["elevationLevel"],
        }},
        "output_files": [{
            "file_pattern": out["filePattern"],
            "container_url": out["destination"]["container"]["containerUrl"],
            "path": out["destination"]["container"]["path"],
            "upload_condition": out["uploadOptions"]["uploadCondition"],
        }],
    });
    i["list"] = json!({
        "filter": q.filter,
        "select": q.select,
        "max_results": q.max_results,
        "next_link": next_link(c),
    });
    i["get_task_id"] = task["id"].clone();
    i["terminate_task_id"] = task["id"].clone();
    i["delete_task_id"] = task["id"].clone();
    i
}

/// Page 2 of the listing, as the service would link it.
fn next_link(c: &AzureBatchConfig) -> String {
    format!(
        "/jobs/{}/tasks?api-version={API_VERSION}&maxresults=1000&%24filter=startswith%28id%2C%27cl_worker_%27%29&%24select=id%2CdisplayName%2Cstate%2CexecutionInfo&%24skiptoken=clw-page-2",
        c.job_id
    )
}

/// The SDK's requests for `inputs` (`golden.py`), one JSON object each.
fn golden(inputs: &Value, ops: &str, auth: &str) -> Vec<Value> {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("inputs.json");
    std::fs::write(&file, inputs.to_string()).unwrap();
    let out = bash(
        &[
            "tests/peers/azure-batch.sh",
            "golden",
            "--inputs",
            file.to_str().unwrap(),
            "--ops",
            ops,
            "--auth",
            auth,
        ],
        &Default::default(),
    );
    out.lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

/// A recorded request of ours in golden.py's shape.
fn record(r: &wiremock::Request) -> Value {
    let mut query: Vec<(String, String)> = r
        .url
        .query_pairs()
        .map(|(k, v)| (k.into(), v.into()))
        .collect();
    query.sort();
    let headers: BTreeMap<&str, Option<String>> = HEADERS
        .iter()
        .map(|h| {
            (
                *h,
                r.headers.get(*h).map(|v| v.to_str().unwrap().to_string()),
            )
        })
        .collect();
    let body_text = (!r.body.is_empty()).then(|| String::from_utf8(r.body.clone()).unwrap());
    json!({
        "method": r.method.as_str(),
        "path": r.url.path(),
        "query": query,
        "headers": headers,
        "body": body_text.as_deref().map(|b| serde_json::from_str::<Value>(b).unwrap()),
        "body_text": body_text,
    })
}

/// The parts of a golden record that must be equal.
fn comparable(g: &Value) -> Value {
    let mut headers = g["headers"].clone();
    headers.as_object_mut().unwrap().remove("user-agent");
    json!({
        "method": g["method"], "path": g["path"], "query": g["query"], "headers": headers,
        "body": g["body"], "body_text": g["body_text"],
    })
}

async fn capture_server(job: &str, pool: &str, c: &AzureBatchConfig) -> MockServer {
    let server = MockServer::start().await;
    let tasks = format!("/jobs/{job}/tasks");
    let json = |body: String| ResponseTemplate::new(200).set_body_raw(body, "application/json");
    // As golden.py's capture server: tasks-list.json split in two pages.
    let all: Value = serde_json::from_str(&fixture("tasks-list.json")).unwrap();
    let value = all["value"].as_array().unwrap();
    let page1 =
        json!({"value": value[..3], "odata.nextLink": format!("{}{}", server.uri(), next_link(c))});
    let page2 = json!({"value": value[3..]});
    Mock::given(method("GET"))
        .and(path(&tasks))
        .and(query_param("$skiptoken", "clw-page-2"))
        .respond_with(json(page2.to_string()))
        .with_priority(1)
        .mount(&server)
        .await;
    Mock::given(method("GET"))
        .and(path(&tasks))
        .respond_with(json(page1.to_string()))
        .with_priority(2)
        .mount(&server)
        .await;
    Mock::given(method("POST"))
        .and(path(&tasks))
        .respond_with(ResponseTemplate::new(201))
        .mount(&server)
        .await;
    Mock::given(method("POST"))
        .and(path_regex("/terminate$"))
        .respond_with(ResponseTemplate::new(204))
        .mount(&server)
        .await;
    Mock::given(method("DELETE"))
        .respond_with(ResponseTemplate::new(200))
        .mount(&server)
        .await;
    Mock::given(method("GET"))
        .and(path(format!("/pools/{pool}")))
        .respond_with(json(fixture("pool.json")))
        .mount(&server)
        .await;
    Mock::given(method("GET"))
        .and(path(format!("/jobs/{job}")))
        .respond_with(json(fixture("job.json")))
        .mount(&server)
        .await;
    server
}

/// Our client of the service at `uri` with the golden inputs' account key, date and request id.
fn sharedkey_client(d: &Value, uri: &str) -> BatchClient {
    BatchClient::with_default_transport(
        uri,
        Auth::shared_key(
            d["account_name"].as_str().unwrap(),
            d["account_key"].as_str().unwrap(),
        ),
    )
    .unwrap()
    .with_fixed_date_and_request_id(
        d["ocp_date"].as_str().unwrap(),
        d["client_request_id"].as_str().unwrap(),
    )
}

/// The requests `server` received, each as golden.py records one.
async fn recorded(server: &MockServer) -> Vec<Value> {
    server
        .received_requests()
        .await
        .unwrap()
        .iter()
        .map(record)
        .collect()
}

fn assert_same(ours: &[Value], sdk: &[Value]) {
    assert_eq!(ours.len(), sdk.len(), "ours: {ours:#?}\nSDK: {sdk:#?}");
    for (o, g) in ours.iter().zip(sdk) {
        let want = comparable(g);
        assert_eq!(
            o, &want,
            "{}: ours differs from the SDK's (string-to-sign {})",
            g["op"], g["string_to_sign"]
        );
    }
}

#[tokio::test]
async fn every_request_equals_the_sdks_with_sharedkey() {
    let d = defaults();
    let c = cfg(&d);
    let i = inputs(&d, &c);
    let sdk = golden(
        &i,
        "add_task,list_tasks,terminate_task,delete_task,get_pool,get_job",
        "sharedkey",
    );
    let ops: Vec<&str> = sdk.iter().map(|r| r["op"].as_str().unwrap()).collect();
    assert_eq!(
        ops,
        [
            "add_task",
            "list_tasks",
            "list_tasks_next",
            "terminate_task",
            "delete_task",
            "get_pool",
            "get_job"
        ]
    );
    let (job, pool) = (c.job_id.clone(), c.pool_id.clone().unwrap());
    let server = capture_server(&job, &pool, &c).await;
    let client = sharedkey_client(&d, &server.uri());
    let task = c.task(&spec());
    client.add_task(&job, &task).await.unwrap();
    let (listed, pages) = client.list_tasks(&job, &c.list_query()).await.unwrap();
    assert_eq!(pages, 2);
    let sdk_ids: Vec<String> = serde_json::from_value(sdk[2]["sdk_result"].clone()).unwrap();
    assert_eq!(
        listed.iter().map(|t| t.id.clone()).collect::<Vec<_>>(),
        sdk_ids
    );
    client.terminate_task(&job, &task.id).await.unwrap();
    client.delete_task(&job, &task.id).await.unwrap();
    let p = client.get_pool(&pool).await.unwrap();
    assert_eq!(
        p.current_dedicated_nodes,
        sdk[5]["sdk_result"]["current_dedicated_nodes"]
            .as_u64()
            .map(|n| n as u32)
    );
    assert_eq!(
        p.allocation_state.as_deref(),
        sdk[5]["sdk_result"]["allocation_state"].as_str()
    );
    let j = client.get_job(&job).await.unwrap();
    assert_eq!(
        j.pool_info.unwrap().pool_id.as_deref(),
        sdk[6]["sdk_result"]["pool_id"].as_str()
    );
    let ours = recorded(&server).await;
    assert_same(&ours, &sdk);
    // And the SDK's task body carries no credential: the password is in a read-only file.
    let body = sdk[0]["body_text"].as_str().unwrap();
    assert!(
        !body.contains("CODALAB_PASSWORD") && !body.contains(d["account_key"].as_str().unwrap()),
        "{body}"
    );
}

#[tokio::test]
async fn entra_id_requests_equal_the_sdks() {
    let d = defaults();
    let c = cfg(&d);
    let i = inputs(&d, &c);
    let sdk = golden(&i, "list_tasks,get_pool,get_job", "bearer");
    let server = capture_server(&c.job_id, c.pool_id.as_deref().unwrap(), &c).await;
    let token = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(
        token.path(),
        format!("{}\n", d["bearer_token"].as_str().unwrap()),
    )
    .unwrap();
    let client = BatchClient::with_default_transport(&server.uri(), Auth::token_file(token.path()))
        .unwrap()
        .with_fixed_date_and_request_id(
            d["ocp_date"].as_str().unwrap(),
            d["client_request_id"].as_str().unwrap(),
        );
    client.list_tasks(&c.job_id, &c.list_query()).await.unwrap();
    client
        .get_pool(c.pool_id.as_deref().unwrap())
        .await
        .unwrap();
    client.get_job(&c.job_id).await.unwrap();
    let ours = recorded(&server).await;
    assert_same(&ours, &sdk);
    assert_eq!(
        ours[0]["headers"]["authorization"],
        json!(format!("Bearer {}", d["bearer_token"].as_str().unwrap()))
    );
}

/// The pool's self-healing: the filtered listing of its broken nodes and their removal, as the
/// SDK sends them, and the recorded listing parsed to the same nodes.
#[tokio::test]
async fn node_listing_and_removal_equal_the_sdks() {
    let d = defaults();
    let c = cfg(&d);
    let mut i = inputs(&d, &c);
    let q = backends::azure_batch::unhealthy_nodes_query();
    i["nodes"] = json!({"filter": q.filter, "select": q.select, "max_results": q.max_results});
    let sdk = golden(&i, "list_nodes,remove_nodes", "sharedkey");
    let ops: Vec<&str> = sdk.iter().map(|r| r["op"].as_str().unwrap()).collect();
    assert_eq!(ops, ["list_nodes", "remove_nodes"]);
    let pool = c.pool_id.clone().unwrap();
    let server = MockServer::start().await;
    Mock::given(method("GET"))
        .and(path(format!("/pools/{pool}/nodes")))
        .respond_with(
            ResponseTemplate::new(200).set_body_raw(fixture("nodes-list.json"), "application/json"),
        )
        .mount(&server)
        .await;
    Mock::given(method("POST"))
        .and(path(format!("/pools/{pool}/removenodes")))
        .respond_with(ResponseTemplate::new(202))
        .mount(&server)
        .await;
    let client = sharedkey_client(&d, &server.uri());
    let (nodes, pages) = client.list_nodes(&pool, &q).await.unwrap();
    assert_eq!(pages, 1);
    let parsed: Vec<Value> = nodes
        .iter()
        .map(|n| json!({"id": n.id, "state": n.state}))
        .collect();
    assert_eq!(Value::from(parsed), sdk[0]["sdk_result"]);
    assert_eq!(nodes[0].errors[0].code.as_deref(), Some("DiskFull"));
    let failure = nodes[1].start_task_info.as_ref().unwrap();
    assert_eq!(failure.exit_code, Some(1));
    let remove = NodeRemove {
        node_list: serde_json::from_value(d["remove"]["node_ids"].clone()).unwrap(),
        node_deallocation_option: "terminate".into(),
    };
    client.remove_nodes(&pool, &remove).await.unwrap();
    let ours = recorded(&server).await;
    assert_same(&ours, &sdk);
}

/// What the SDK parses from one recorded response (`parse.py`).
fn sdk_parse(kind: &str, body: &str) -> Value {
    let env = bash(&["tests/peers/azure-batch.sh", "env"], &Default::default());
    let python = testkit::peers::exports(&env)["CLW_AZBATCH_PYTHON"].clone();
    let mut child = Command::new(python)
        .arg(repo_root().join("tests/peers/azure/parse.py"))
        .args(["--kind", kind])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(body.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success());
    serde_json::from_slice(&out.stdout).unwrap()
}

fn our_task(t: &Task) -> Value {
    let ei = t.execution_info.clone().unwrap_or_default();
    json!({
        "id": t.id,
        "state": serde_json::to_value(&t.state).ok(),
        "exit_code": ei.exit_code,
        "result": ei.result,
        "failure_info": ei.failure_info.map(|f| json!({
            "category": f.category, "code": f.code, "message": f.message,
            "details": f.details.iter().map(|d| json!([d.name, d.value])).collect::<Vec<_>>(),
        })),
    })
}

#[test]
fn recorded_responses_parse_as_the_sdk_parses_them() {
    bash(
        &["tests/peers/azure-batch.sh", "install"],
        &Default::default(),
    );
    for name in [
        "tasks-list.json",
        "tasks-list-page1.json",
        "tasks-list-select.json",
    ] {
        let raw = fixture(name);
        let sdk = sdk_parse("tasks", &raw);
        let page: TaskPage = serde_json::from_str(&raw).unwrap();
        assert_eq!(
            sdk["next_link"].as_str(),
            page.next_link.as_deref(),
            "{name}"
        );
        let theirs: Vec<Value> = sdk["tasks"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| {
                json!({
                    "id": t["id"], "state": t["state"], "exit_code": t["exit_code"], "result": t["result"],
                    "failure_info": t["failure_info"],
                })
            })
            .collect();
        let ours: Vec<Value> = page.value.iter().map(our_task).collect();
        assert_eq!(ours, theirs, "{name}");
    }
    let raw = fixture("pool-resizing.json");
    let sdk = sdk_parse("pool", &raw);
    let pool: backends::azure_batch::model::Pool = serde_json::from_str(&raw).unwrap();
    assert_eq!(json!(pool.allocation_state), sdk["allocation_state"]);
    assert_eq!(
        json!(pool.current_dedicated_nodes),
        sdk["current_dedicated_nodes"]
    );
    assert_eq!(
        json!(pool.target_dedicated_nodes),
        sdk["target_dedicated_nodes"]
    );
    assert_eq!(
        json!(pool.current_low_priority_nodes),
        sdk["current_low_priority_nodes"]
    );
    assert_eq!(
        json!(pool.target_low_priority_nodes),
        sdk["target_low_priority_nodes"]
    );
    assert_eq!(json!(pool.task_slots_per_node), sdk["task_slots_per_node"]);
    assert_eq!(json!(pool.enable_auto_scale), sdk["enable_auto_scale"]);
    for name in [
        "error-auth-failed.json",
        "error-job-not-found.json",
        "error-server-busy.json",
        "error-task-exists.json",
    ] {
        let raw = fixture(name);
        let sdk = sdk_parse("error", &raw);
        let e = BatchError::from_response(400, raw.as_bytes());
        assert_eq!(json!(e.code), sdk["code"], "{name}");
        assert_eq!(json!(e.message), sdk["message"], "{name}");
        let details: Vec<Value> = e.details.iter().map(|(k, v)| json!([k, v])).collect();
        assert_eq!(json!(details), sdk["details"], "{name}");
    }
}
