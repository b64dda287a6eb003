//! The lease in a Kubernetes `Lease` object (coordination.k8s.io/v1), as Kubernetes' own
//! controllers keep theirs: `holderIdentity`, `leaseDurationSeconds`, `acquireTime`,
//! `renewTime`, `leaseTransitions`. A write is a create (refused with 409 when it exists) or
//! a replace carrying the `resourceVersion` read (refused with 409 when it changed): the API
//! server's compare-and-swap.

use futures::future::BoxFuture;
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use kube::api::PostParams;
use kube::Api;

use super::{Read, Record, Store, StoreError, Write};

pub struct KubeStore {
    api: Api<Lease>,
    namespace: String,
    name: String,
}

impl KubeStore {
    pub fn new(client: kube::Client, namespace: &str, name: &str) -> Self {
        KubeStore {
            api: Api::namespaced(client, namespace),
            namespace: namespace.into(),
            name: name.into(),
        }
    }
}

fn micro(unix: f64) -> Option<MicroTime> {
    let micros = (unix * 1e6).round() as i64;
    jiff::Timestamp::from_microsecond(micros)
        .ok()
        .map(MicroTime)
}

fn unix(t: &Option<MicroTime>) -> f64 {
    t.as_ref()
        .map_or(0.0, |t| t.0.as_microsecond() as f64 / 1e6)
}

/// The record a `Lease`'s spec holds (a spec without a holder is a released lease).
pub fn record_of(spec: &LeaseSpec) -> Record {
    Record {
        holder: spec.holder_identity.clone().unwrap_or_default(),
        duration_s: f64::from(spec.lease_duration_seconds.unwrap_or(0)),
        acquired_at: unix(&spec.acquire_time),
        renewed_at: unix(&spec.renew_time),
        transitions: spec.lease_transitions.unwrap_or(0).max(0) as u32,
    }
}

/// The `Lease` of `record` (`resourceVersion` set for a replace).
pub fn lease_of(name: &str, namespace: &str, record: &Record, version: Option<&str>) -> Lease {
    Lease {
        metadata: ObjectMeta {
            name: Some(name.into()),
            namespace: Some(namespace.into()),
            resource_version: version.map(str::to_owned),
            labels: Some(
                [(
                    "app.kubernetes.io/managed-by".to_owned(),
                    "cl-worker-manager".to_owned(),
                )]
                .into(),
            ),
            ..Default::default()
        },
        spec: Some(LeaseSpec {
            holder_identity: Some(record.holder.clone()),
            // Whole seconds, never 0 (an API server refuses it); rounded up so that no one
            // takes it earlier than the holder allows.
            lease_duration_seconds: Some(record.duration_s.ceil().max(1.0) as i32),
            acquire_time: micro(record.acquired_at),
            renew_time: micro(record.renewed_at),
            lease_transitions: Some(record.transitions.min(i32::MAX as u32) as i32),
            ..Default::default()
        }),
    }
}

fn error(what: &str, e: kube::Error) -> StoreError {
    StoreError(format!("{what}: {e}"))
}

fn conflict(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(s) if s.code == 409)
}

impl Store for KubeStore {
    fn describe(&self) -> String {
        format!("kubernetes:{}/{}", self.namespace, self.name)
    }

    fn read(&self) -> BoxFuture<'_, Result<Read, StoreError>> {
        Box::pin(async move {
            let lease = self
                .api
                .get_opt(&self.name)
                .await
                .map_err(|e| error("get lease", e))?;
            Ok(match lease {
                None => Read {
                    record: None,
                    version: None,
                },
                Some(l) => Read {
                    record: Some(record_of(&l.spec.unwrap_or_default())),
                    version: l.metadata.resource_version,
                },
            })
        })
    }

    fn write<'a>(&'a self, write: &'a Write) -> BoxFuture<'a, Result<bool, StoreError>> {
        Box::pin(async move {
            let pp = PostParams::default();
            let result = match write {
                Write::Create(r) => {
                    let lease = lease_of(&self.name, &self.namespace, r, None);
                    self.api.create(&pp, &lease).await.map(|_| ())
                }
                Write::Replace { record, version } => {
                    let lease = lease_of(&self.name, &self.namespace, record, Some(version));
                    self.api.replace(&self.name, &pp, &lease).await.map(|_| ())
                }
            };
            match result {
                Ok(()) => Ok(true),
                Err(e) if conflict(&e) => Ok(false),
                Err(e) => Err(error("write lease", e)),
            }
        })
    }
}
