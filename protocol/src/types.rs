//! Wire types of the CodaLab worker protocol (checkin body, run entries, server messages,
//! JSON-API bundle documents). Field names are exactly the server's.

use serde::{Deserialize, Deserializer, Serialize};
use serde_json::{Map, Value};

/// The profile stages reported in `bundle_profile_stats`. The server reads `elapsed` of the first
/// four; all five are always sent.
pub const PROFILE_STAGES: [&str; 5] = [
    "RUN_STAGE.PREPARING",
    "RUN_STAGE.RUNNING",
    "RUN_STAGE.CLEANING_UP",
    "RUN_STAGE.UPLOADING_RESULTS",
    "RUN_STAGE.FINALIZING",
];

/// Default of `--exit-after-num-runs` and the server's default for the checkin field.
pub const DEFAULT_EXIT_AFTER_NUM_RUNS: i64 = 999_999_999;

/// Body of `POST /rest/workers/<id>/checkin`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct CheckinRequest {
    pub tag: Option<String>,
    pub group_name: Option<String>,
    pub cpus: u64,
    pub gpus: u64,
    pub memory_bytes: u64,
    /// Always an integer: a `null` crashes the server's scheduler.
    pub free_disk_bytes: u64,
    /// `[[parent_uuid, parent_path], ...]`
    pub dependencies: Vec<(String, String)>,
    pub hostname: String,
    pub runs: Vec<RunReport>,
    pub shared_file_system: bool,
    pub tag_exclusive: bool,
    /// Runs this worker will still accept (remaining, not the configured total).
    pub exit_after_num_runs: i64,
    pub is_terminating: bool,
    pub preemptible: bool,
}

/// Timing of one profile stage.
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq)]
pub struct StageTiming {
    pub start: f64,
    pub end: f64,
    pub elapsed: f64,
}

/// One active run as reported in every checkin (`BundleCheckinState`).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct RunReport {
    pub uuid: String,
    pub run_status: String,
    pub bundle_start_time: f64,
    pub container_time_total: f64,
    pub container_time_user: f64,
    pub container_time_system: f64,
    pub docker_image: Option<String>,
    /// Server state: `preparing`, `running`, `finalizing` or `staged`.
    pub state: String,
    /// The worker id.
    pub remote: String,
    pub exitcode: Option<i64>,
    pub failure_message: Option<String>,
    pub bundle_profile_stats: Map<String, Value>,
    pub cpu_usage: f64,
    pub memory_usage: f64,
    pub disk_utilization: u64,
}

/// A dependency of a run bundle, as carried in the `run` message.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct DependencyInfo {
    pub child_path: String,
    pub parent_uuid: String,
    #[serde(default, deserialize_with = "null_default")]
    pub parent_path: String,
    #[serde(default)]
    pub child_uuid: Option<String>,
    #[serde(default)]
    pub parent_name: Option<String>,
    /// Only for shared-file-system workers: the parent's bundle-store path.
    #[serde(default)]
    pub location: Option<String>,
}

/// `BundleInfo` of a `run` message. Unknown keys are kept so that state can be persisted.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct BundleInfo {
    pub uuid: String,
    #[serde(default, deserialize_with = "null_default")]
    pub command: String,
    #[serde(default, deserialize_with = "null_default")]
    pub dependencies: Vec<DependencyInfo>,
    #[serde(default)]
    pub location: Option<String>,
    #[serde(default, deserialize_with = "null_default")]
    pub metadata: Map<String, Value>,
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

impl BundleInfo {
    /// `metadata.exclude_patterns`, treating a missing or null value as empty.
    pub fn exclude_patterns(&self) -> Vec<String> {
        match self.metadata.get("exclude_patterns") {
            Some(Value::Array(items)) => items
                .iter()
                .filter_map(|v| v.as_str().map(str::to_owned))
                .collect(),
            _ => Vec::new(),
        }
    }

    /// `metadata.store`, or the empty string (the server then uses its default store).
    pub fn store(&self) -> String {
        self.metadata
            .get("store")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_owned()
    }
}

/// `RunResources` of a `run` message.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct RunResources {
    #[serde(default = "one", deserialize_with = "null_one")]
    pub cpus: u64,
    #[serde(default, deserialize_with = "null_default")]
    pub gpus: u64,
    #[serde(default, deserialize_with = "null_default")]
    pub docker_image: String,
    /// Seconds; 0 means no limit.
    #[serde(default, deserialize_with = "null_default")]
    pub time: f64,
    /// Bytes; 0 means no limit.
    #[serde(default, deserialize_with = "null_default")]
    pub memory: u64,
    /// Bytes; 0 means no limit.
    #[serde(default, deserialize_with = "null_default")]
    pub disk: u64,
    #[serde(default)]
    pub network: Option<bool>,
    #[serde(default)]
    pub tag: Option<String>,
    #[serde(default, deserialize_with = "null_default")]
    pub tag_exclusive: bool,
    #[serde(default)]
    pub runs_left: Option<i64>,
}

fn one() -> u64 {
    1
}

fn null_one<'de, D: Deserializer<'de>>(d: D) -> Result<u64, D::Error> {
    Ok(Option::<u64>::deserialize(d)?.unwrap_or(1))
}

/// Deserializes `null` as the type's default.
fn null_default<'de, D, T>(d: D) -> Result<T, D::Error>
where
    D: Deserializer<'de>,
    T: Deserialize<'de> + Default,
{
    Ok(Option::<T>::deserialize(d)?.unwrap_or_default())
}

/// Arguments of a `read` message.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Default)]
pub struct ReadArgs {
    #[serde(rename = "type")]
    pub kind: String,
    #[serde(default)]
    pub depth: Option<u64>,
    #[serde(default)]
    pub offset: Option<u64>,
    #[serde(default)]
    pub length: Option<u64>,
    #[serde(default)]
    pub num_head_lines: Option<u64>,
    #[serde(default)]
    pub num_tail_lines: Option<u64>,
    #[serde(default)]
    pub max_line_length: Option<u64>,
    #[serde(default)]
    pub truncation_text: Option<String>,
}

/// A message from the server, delivered as an element of a checkin response.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ServerMessage {
    Run {
        bundle: BundleInfo,
        resources: RunResources,
    },
    Kill {
        uuid: String,
        #[serde(default)]
        kill_message: Option<String>,
    },
    MarkFinalized {
        uuid: String,
    },
    Read {
        socket_id: i64,
        uuid: String,
        #[serde(default, deserialize_with = "null_default")]
        path: String,
        read_args: ReadArgs,
    },
    Netcat {
        socket_id: i64,
        uuid: String,
        port: u16,
        #[serde(default, deserialize_with = "null_default")]
        message: String,
    },
    Write {
        uuid: String,
        subpath: String,
        #[serde(default, deserialize_with = "null_default")]
        string: String,
    },
}

/// The kill text used when a `kill` message carries none (a user's `cl kill`).
pub const DEFAULT_KILL_MESSAGE: &str = "Kill requested";

impl ServerMessage {
    /// The bundle this message is about.
    pub fn uuid(&self) -> &str {
        match self {
            ServerMessage::Run { bundle, .. } => &bundle.uuid,
            ServerMessage::Kill { uuid, .. }
            | ServerMessage::MarkFinalized { uuid }
            | ServerMessage::Read { uuid, .. }
            | ServerMessage::Netcat { uuid, .. }
            | ServerMessage::Write { uuid, .. } => uuid,
        }
    }
}

/// An element of a checkin response that could not be understood.
#[derive(Debug, Clone, PartialEq)]
pub struct MalformedMessage {
    pub raw: Value,
    pub error: String,
}

/// Splits a checkin response into messages. The body is a list (quota kills first, then one
/// message or `null`); servers before 1.5.11 sent a single object. `null`s are skipped; elements
/// that do not parse are returned as errors so that the caller can log them and go on.
pub fn parse_checkin_response(body: Value) -> Vec<Result<ServerMessage, MalformedMessage>> {
    let items = match body {
        Value::Array(items) => items,
        Value::Null => Vec::new(),
        other => vec![other],
    };
    items
        .into_iter()
        .filter(|v| !v.is_null())
        .map(|raw| {
            serde_json::from_value::<ServerMessage>(raw.clone()).map_err(|e| MalformedMessage {
                raw,
                error: e.to_string(),
            })
        })
        .collect()
}

/// `parse_size`: `<number>[k|m|g|t]`, 1024-based, case-insensitive unit.
pub fn parse_size(s: &str) -> Result<u64, String> {
    let err = || format!("Invalid size: {s}, expected <number>[<k|m|g|t>]");
    let s = s.trim();
    let last = s.chars().last().ok_or_else(err)?;
    if last.is_ascii_digit() {
        return s.parse::<u64>().map_err(|_| err());
    }
    let n: f64 = s[..s.len() - last.len_utf8()].parse().map_err(|_| err())?;
    let mult: f64 = match last.to_ascii_lowercase() {
        'k' => 1024.0,
        'm' => 1024.0 * 1024.0,
        'g' => 1024.0 * 1024.0 * 1024.0,
        't' => 1024.0 * 1024.0 * 1024.0 * 1024.0,
        _ => return Err(err()),
    };
    if !(n.is_finite() && n >= 0.0) {
        return Err(err());
    }
    Ok((n * mult) as u64)
}

/// A JSON-API resource object (`{"type", "id", "attributes", "relationships"}`).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Resource {
    #[serde(rename = "type")]
    pub kind: String,
    pub id: String,
    #[serde(default)]
    pub attributes: Map<String, Value>,
    #[serde(default)]
    pub relationships: Option<Value>,
}

/// A JSON-API document whose `data` is one resource or a list of resources.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Document<T> {
    pub data: T,
    #[serde(default)]
    pub included: Vec<Resource>,
    #[serde(default)]
    pub meta: Option<Value>,
}

/// A bundle as returned by `GET /rest/bundles[/<uuid>]`.
#[derive(Debug, Clone, PartialEq)]
pub struct Bundle {
    pub uuid: String,
    pub attributes: Map<String, Value>,
}

impl Bundle {
    pub fn from_resource(r: Resource) -> Self {
        Bundle {
            uuid: r.id,
            attributes: r.attributes,
        }
    }

    pub fn state(&self) -> Option<&str> {
        self.attributes.get("state").and_then(Value::as_str)
    }

    /// A metadata field (`exitcode`, `failure_message`, `run_status`, ...).
    pub fn metadata(&self, key: &str) -> Option<&Value> {
        self.attributes
            .get("metadata")
            .and_then(|m| m.get(key))
            .filter(|v| !v.is_null())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn run_message() -> Value {
        json!({
            "type": "run",
            "bundle": {
                "uuid": "0xabc", "bundle_type": "run", "owner_id": "0", "command": "echo hi",
                "state": "starting", "frozen": null, "is_anonymous": false,
                "metadata": {"name": "run-echo", "exclude_patterns": null, "store": null},
                "args": "run 'echo hi'",
                "dependencies": [{"child_uuid": "0xabc", "child_path": "d", "parent_uuid": "0xdef",
                                  "parent_path": "", "parent_name": "f.txt"}],
                "location": null
            },
            "resources": {"cpus": 1, "gpus": 0, "docker_image": "codalab/default-cpu:latest",
                          "time": 0, "memory": 2147483648u64, "disk": 0, "network": true,
                          "tag": "", "tag_exclusive": false, "runs_left": null}
        })
    }

    #[test]
    fn parses_list_with_null_and_run() {
        let msgs = parse_checkin_response(json!([run_message()]));
        assert_eq!(msgs.len(), 1);
        match msgs[0].as_ref().unwrap() {
            ServerMessage::Run { bundle, resources } => {
                assert_eq!(bundle.uuid, "0xabc");
                assert_eq!(bundle.command, "echo hi");
                assert_eq!(bundle.dependencies[0].child_path, "d");
                assert!(bundle.exclude_patterns().is_empty());
                assert_eq!(bundle.store(), "");
                assert_eq!(bundle.extra["owner_id"], json!("0"));
                assert_eq!(resources.memory, 2 << 30);
                assert_eq!(resources.network, Some(true));
            }
            other => panic!("unexpected {other:?}"),
        }
        assert!(parse_checkin_response(json!([null])).is_empty());
        assert!(parse_checkin_response(Value::Null).is_empty());
    }

    #[test]
    fn parses_single_object_of_old_servers() {
        let msgs = parse_checkin_response(json!({"type": "mark_finalized", "uuid": "0x1"}));
        assert_eq!(
            msgs,
            vec![Ok(ServerMessage::MarkFinalized { uuid: "0x1".into() })]
        );
    }

    #[test]
    fn quota_kills_then_message() {
        let msgs = parse_checkin_response(json!([
            {"type": "kill", "uuid": "0x1", "kill_message": "Kill requested: User time quota exceeded."},
            {"type": "kill", "uuid": "0x2"},
            null
        ]));
        assert_eq!(msgs.len(), 2);
        assert_eq!(
            msgs[1],
            Ok(ServerMessage::Kill {
                uuid: "0x2".into(),
                kill_message: None
            })
        );
    }

    #[test]
    fn malformed_elements_are_reported_not_fatal() {
        let msgs = parse_checkin_response(json!([
            {"type": "run", "bundle": 42},
            {"type": "teleport", "uuid": "0x1"},
            "garbage",
            {"type": "mark_finalized", "uuid": "0x9"}
        ]));
        assert_eq!(msgs.len(), 4);
        assert!(msgs[0].is_err() && msgs[1].is_err() && msgs[2].is_err());
        assert_eq!(msgs[0].as_ref().unwrap_err().raw["bundle"], json!(42));
        assert!(msgs[3].is_ok());
    }

    #[test]
    fn resources_tolerate_nulls() {
        let r: RunResources = serde_json::from_value(json!({"cpus": null, "gpus": null,
            "docker_image": "img", "time": null, "memory": null, "disk": null}))
        .unwrap();
        assert_eq!(
            (r.cpus, r.gpus, r.time, r.memory, r.disk),
            (1, 0, 0.0, 0, 0)
        );
    }

    #[test]
    fn read_message_shape() {
        let m: ServerMessage = serde_json::from_value(json!({"type": "read", "socket_id": 7,
            "uuid": "0x1", "path": "stdout", "read_args": {"type": "stream_file"}}))
        .unwrap();
        match m {
            ServerMessage::Read {
                socket_id,
                read_args,
                ..
            } => {
                assert_eq!(socket_id, 7);
                assert_eq!(read_args.kind, "stream_file");
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn checkin_body_field_names() {
        let req = CheckinRequest {
            tag: None,
            group_name: None,
            cpus: 2,
            gpus: 0,
            memory_bytes: 1,
            free_disk_bytes: 2,
            dependencies: vec![("0x1".into(), "".into())],
            hostname: "h".into(),
            runs: vec![],
            shared_file_system: false,
            tag_exclusive: false,
            exit_after_num_runs: DEFAULT_EXIT_AFTER_NUM_RUNS,
            is_terminating: false,
            preemptible: false,
        };
        let v = serde_json::to_value(&req).unwrap();
        let mut keys: Vec<_> = v.as_object().unwrap().keys().cloned().collect();
        keys.sort();
        assert_eq!(
            keys,
            [
                "cpus",
                "dependencies",
                "exit_after_num_runs",
                "free_disk_bytes",
                "gpus",
                "group_name",
                "hostname",
                "is_terminating",
                "memory_bytes",
                "preemptible",
                "runs",
                "shared_file_system",
                "tag",
                "tag_exclusive"
            ]
        );
        assert_eq!(v["dependencies"], json!([["0x1", ""]]));
    }

    #[test]
    fn bundle_document() {
        let doc: Document<Resource> = serde_json::from_value(json!({"data": {"type": "bundles",
            "id": "0x1", "attributes": {"state": "ready", "metadata": {"exitcode": 0,
            "failure_message": null}}}}))
        .unwrap();
        let b = Bundle::from_resource(doc.data);
        assert_eq!(b.state(), Some("ready"));
        assert_eq!(b.metadata("exitcode"), Some(&json!(0)));
        assert_eq!(b.metadata("failure_message"), None);
    }
}
