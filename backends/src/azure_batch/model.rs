//! The Batch REST shapes the backend sends and reads (API version
//! [`API_VERSION`](super::client::API_VERSION)): only the fields it uses. Names are the
//! service's camelCase ones; unknown fields in responses are ignored.

use serde::{Deserialize, Serialize};

/// The body of *Add Task* (`POST /jobs/{job}/tasks`). Fields are in the order they are sent.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct TaskAdd {
    pub id: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub display_name: Option<String>,
    pub command_line: String,
    pub container_settings: ContainerSettings,
    pub constraints: TaskConstraints,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub environment_settings: Vec<EnvironmentSetting>,
    pub user_identity: UserIdentity,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub output_files: Vec<OutputFile>,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ContainerSettings {
    pub image_name: String,
    pub container_run_options: String,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct TaskConstraints {
    pub max_task_retry_count: u32,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct EnvironmentSetting {
    pub name: String,
    pub value: String,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct UserIdentity {
    pub auto_user: AutoUser,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct AutoUser {
    pub scope: String,
    pub elevation_level: String,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct OutputFile {
    pub file_pattern: String,
    pub destination: OutputFileDestination,
    pub upload_options: UploadOptions,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct OutputFileDestination {
    pub container: ContainerDestination,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ContainerDestination {
    pub container_url: String,
    pub path: String,
    /// A managed identity of the pool that may write to the container (instead of a SAS).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub identity_reference: Option<IdentityReference>,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct IdentityReference {
    pub resource_id: String,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct UploadOptions {
    pub upload_condition: String,
}

/// One page of *List Tasks*.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct TaskPage {
    #[serde(default)]
    pub value: Vec<Task>,
    #[serde(rename = "odata.nextLink")]
    pub next_link: Option<String>,
}

/// A task as listed (with `$select=id,displayName,state,executionInfo`).
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Task {
    pub id: String,
    #[serde(default)]
    pub display_name: Option<String>,
    pub state: TaskState,
    #[serde(default)]
    pub execution_info: Option<ExecutionInfo>,
}

/// `active`, `preparing`, `running`, `completed`; a state this API version does not know is
/// kept as [`TaskState::Other`] rather than failing the whole listing.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum TaskState {
    Active,
    Preparing,
    Running,
    Completed,
    #[serde(other)]
    Other,
}

#[derive(Debug, Clone, PartialEq, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ExecutionInfo {
    #[serde(default)]
    pub exit_code: Option<i64>,
    /// `success` or `failure`.
    #[serde(default)]
    pub result: Option<String>,
    #[serde(default)]
    pub failure_info: Option<FailureInfo>,
}

#[derive(Debug, Clone, PartialEq, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct FailureInfo {
    /// `usererror` or `servererror`.
    #[serde(default)]
    pub category: Option<String>,
    #[serde(default)]
    pub code: Option<String>,
    #[serde(default)]
    pub message: Option<String>,
    #[serde(default)]
    pub details: Vec<NameValue>,
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct NameValue {
    #[serde(default)]
    pub name: Option<String>,
    #[serde(default)]
    pub value: Option<String>,
}

/// A pool, as `--pool-id` reports it.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Pool {
    pub id: String,
    #[serde(default)]
    pub state: Option<String>,
    /// `steady`, `resizing` or `stopping`.
    #[serde(default)]
    pub allocation_state: Option<String>,
    #[serde(default)]
    pub current_dedicated_nodes: Option<u32>,
    #[serde(default)]
    pub current_low_priority_nodes: Option<u32>,
    #[serde(default)]
    pub target_dedicated_nodes: Option<u32>,
    #[serde(default)]
    pub target_low_priority_nodes: Option<u32>,
    #[serde(default)]
    pub task_slots_per_node: Option<u32>,
    #[serde(default)]
    pub enable_auto_scale: Option<bool>,
    #[serde(default)]
    pub vm_size: Option<String>,
    /// The errors of the pool's last resize (quota, allocation failures); kept by the service
    /// until the next resize.
    #[serde(default)]
    pub resize_errors: Vec<ResizeError>,
}

/// One of a pool's `resizeErrors`.
#[derive(Debug, Clone, PartialEq, Default, Deserialize)]
pub struct ResizeError {
    #[serde(default)]
    pub code: Option<String>,
    #[serde(default)]
    pub message: Option<String>,
}

/// One page of *List Nodes*.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct NodePage {
    #[serde(default)]
    pub value: Vec<Node>,
    #[serde(rename = "odata.nextLink")]
    pub next_link: Option<String>,
}

/// A compute node as listed (with `$select=id,state,stateTransitionTime,errors,startTaskInfo`).
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Node {
    pub id: String,
    /// `idle`, `running`, `unusable`, `starttaskfailed`, …
    #[serde(default)]
    pub state: Option<String>,
    /// RFC 3339.
    #[serde(default)]
    pub state_transition_time: Option<String>,
    /// Why the node is `unusable` (the service's words).
    #[serde(default)]
    pub errors: Vec<NodeError>,
    #[serde(default)]
    pub start_task_info: Option<StartTaskInfo>,
}

#[derive(Debug, Clone, PartialEq, Default, Deserialize)]
pub struct NodeError {
    #[serde(default)]
    pub code: Option<String>,
    #[serde(default)]
    pub message: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct StartTaskInfo {
    #[serde(default)]
    pub exit_code: Option<i64>,
    #[serde(default)]
    pub failure_info: Option<FailureInfo>,
}

/// The body of *Remove Nodes* (`POST /pools/{pool}/removenodes`). Fields are in the order
/// they are sent.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeRemove {
    /// At most 100 ids per request.
    pub node_list: Vec<String>,
    /// `requeue`, `terminate`, `taskcompletion` or `retaineddata`.
    pub node_deallocation_option: String,
}

/// A job (the pre-flight check reads its state and pool).
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Job {
    pub id: String,
    #[serde(default)]
    pub state: Option<String>,
    #[serde(default)]
    pub pool_info: Option<PoolInfo>,
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PoolInfo {
    #[serde(default)]
    pub pool_id: Option<String>,
}

/// The service's error body.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct ErrorBody {
    #[serde(default)]
    pub code: Option<String>,
    #[serde(default)]
    pub message: Option<ErrorMessage>,
    #[serde(default)]
    pub values: Vec<ErrorDetail>,
}

#[derive(Debug, Clone, Default, Deserialize)]
pub struct ErrorMessage {
    #[serde(default)]
    pub value: Option<String>,
}

#[derive(Debug, Clone, Default, Deserialize)]
pub struct ErrorDetail {
    #[serde(default)]
    pub key: Option<String>,
    #[serde(default)]
    pub value: Option<String>,
}
