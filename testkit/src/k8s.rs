//! The Kubernetes stand-in of the end-to-end tests (`tests/peers/k8s.sh`): started once per
//! test binary, reached with curl, with the worker image and the credentials Secret the tests
//! share.

use std::collections::HashMap;
use std::process::Command;
use std::sync::OnceLock;

use serde_json::{json, Value};

use crate::peers::{bash, exports, peer};

/// The namespace the tests use.
pub const NS: &str = "codalab";
/// The credentials Secret of the workers.
pub const SECRET: &str = "codalab-worker-credentials";

/// The stand-in's environment (`k8s.sh env`), started once.
pub fn k8s() -> &'static HashMap<String, String> {
    static ENV: OnceLock<HashMap<String, String>> = OnceLock::new();
    ENV.get_or_init(|| {
        bash(&["tests/peers/k8s.sh", "start"], &HashMap::new());
        exports(&bash(&["tests/peers/k8s.sh", "env"], &HashMap::new()))
    })
}

pub fn url() -> String {
    k8s()["CLW_K8S_URL"].clone()
}

/// One API request with curl: the status and the JSON body. The request body goes through
/// curl's stdin, never its argv (a Secret's would be readable by every user).
pub fn api(method: &str, path: &str, body: Option<&Value>) -> (u16, Value) {
    use std::io::Write;
    let mut c = Command::new("curl");
    c.args(["-sS", "-X", method, "-w", "\n%{http_code}"]);
    if body.is_some() {
        c.args([
            "-H",
            "Content-Type: application/json",
            "--data-binary",
            "@-",
        ]);
    }
    let mut child = c
        .arg(format!("{}{path}", url()))
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    if let Some(b) = body {
        stdin.write_all(b.to_string().as_bytes()).unwrap();
    }
    drop(stdin);
    let out = child.wait_with_output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let (body, code) = text.rsplit_once('\n').unwrap_or(("", "0"));
    (
        code.trim().parse().unwrap_or(0),
        serde_json::from_str(body).unwrap_or(Value::Null),
    )
}

/// The credentials Secret of the workers (the CodaLab root user), created if missing.
pub fn ensure_secret() {
    let p = peer();
    let secret = json!({
        "apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": SECRET, "namespace": NS},
        "type": "Opaque",
        "stringData": {"username": p.var("CLW_ROOT_USER"), "password": p.var("CLW_ROOT_PASSWORD")},
    });
    let (code, body) = api(
        "POST",
        &format!("/api/v1/namespaces/{NS}/secrets"),
        Some(&secret),
    );
    assert!(code == 201 || code == 409, "{code} {body}");
}

pub fn fault(kind: &str, on: bool, selector: &str) {
    bash(
        &[
            "tests/peers/k8s.sh",
            kind,
            if on { "on" } else { "off" },
            selector,
        ],
        k8s(),
    );
}

/// Every string value in `v` (object keys left out).
pub fn strings(v: &Value, out: &mut Vec<String>) {
    match v {
        Value::String(s) => out.push(s.clone()),
        Value::Array(a) => a.iter().for_each(|x| strings(x, out)),
        Value::Object(o) => o.values().for_each(|x| strings(x, out)),
        _ => {}
    }
}

/// Polls `cond` every 500 ms until it holds; panics with `what` after `timeout`.
pub use crate::wait_until;

/// The recorded create requests of the pods `names` (paths of the stand-in's record), one each.
fn created_files(names: &[String]) -> Vec<String> {
    created_files_of("Pod", names)
}

fn created_files_of(kind: &str, names: &[String]) -> Vec<String> {
    let dir = std::path::Path::new(&k8s()["CLW_K8S_STATE"]).join("objects");
    let files: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .filter_map(|e| {
            let p = e.ok()?.path();
            let f = p.file_name()?.to_str()?.to_string();
            names
                .iter()
                .any(|n| {
                    f.contains(&format!("-create-{kind}-")) && f.ends_with(&format!("-{n}.json"))
                })
                .then(|| p.display().to_string())
        })
        .collect();
    assert_eq!(
        files.len(),
        names.len(),
        "recorded creates of {names:?}: {files:?}"
    );
    files
}

/// The pods `names` as the client sent them when it created them: read from the stand-in's
/// record, so a pod already deleted can still be checked.
pub fn created_pods(names: &[String]) -> Vec<Value> {
    created_files(names)
        .iter()
        .map(|f| serde_json::from_slice(&std::fs::read(f).unwrap()).unwrap())
        .collect()
}

/// kubernetes-validate --strict on the recorded create requests of the pods `names`.
pub fn validate_created(names: &[String]) {
    validate_created_of("Pod", names);
}

/// The same for objects of `kind` (a `Lease`, …).
pub fn validate_created_of(kind: &str, names: &[String]) {
    let files = created_files_of(kind, names);
    let mut args = vec!["tests/peers/k8s.sh", "validate"];
    args.extend(files.iter().map(String::as_str));
    bash(&args, k8s());
}
