//! The AWS Batch job definition of the workers: container properties from the settings, and
//! the fingerprint that decides whether an ACTIVE revision can be reused.

use std::collections::BTreeSet;

use aws_sdk_batch::types::{
    ContainerProperties, Host, KeyValuePair, MountPoint, ResourceRequirement, ResourceType, Secret,
    Volume,
};

use super::AwsBatchConfig;

impl AwsBatchConfig {
    pub(super) fn resources(cpus: u32, gpus: u32, memory_mb: u64) -> Vec<ResourceRequirement> {
        let mut r = vec![
            ResourceRequirement::builder()
                .r#type(ResourceType::Vcpu)
                .value(cpus.max(1).to_string())
                .build(),
            ResourceRequirement::builder()
                .r#type(ResourceType::Memory)
                .value(memory_mb.max(4).to_string())
                .build(),
        ];
        if gpus > 0 {
            r.push(
                ResourceRequirement::builder()
                    .r#type(ResourceType::Gpu)
                    .value(gpus.to_string())
                    .build(),
            );
        }
        r
    }

    /// The container properties of the job definition.
    pub fn container_properties(&self) -> ContainerProperties {
        let mut volumes = vec![Volume::builder()
            .name("docker-socket")
            .host(Host::builder().source_path("/var/run/docker.sock").build())
            .build()];
        let mut mounts = vec![MountPoint::builder()
            .source_volume("docker-socket")
            .container_path("/var/run/docker.sock")
            .read_only(false)
            .build()];
        // The work dirs' parent (`--worker-work-dir-prefix`, `/tmp` by default, as the workers'
        // `<prefix>/cl_worker_<id>_work_dir`), and with a shared file system the bundle store
        // (`CODALAB_BUNDLE_MOUNT`), each at the same path inside and outside: the worker hands
        // these paths to the host's Docker for its runs' mounts.
        let prefix = self.work_dir_prefix.as_deref().unwrap_or("/tmp");
        for (name, path) in [
            ("work-dir", Some(prefix)),
            ("bundle-mount", self.bundle_mount.as_deref()),
        ] {
            let Some(path) = path else { continue };
            volumes.push(
                Volume::builder()
                    .name(name)
                    .host(Host::builder().source_path(path).build())
                    .build(),
            );
            mounts.push(
                MountPoint::builder()
                    .source_volume(name)
                    .container_path(path)
                    .read_only(false)
                    .build(),
            );
        }
        let mut env = vec![KeyValuePair::builder()
            .name("CODALAB_USERNAME")
            .value(&self.username)
            .build()];
        let mut secrets = Vec::new();
        match (&self.password_secret_arn, &self.plaintext_password) {
            (Some(arn), _) => secrets.push(
                Secret::builder()
                    .name("CODALAB_PASSWORD")
                    .value_from(arn)
                    .build(),
            ),
            (None, Some(pw)) => env.push(
                KeyValuePair::builder()
                    .name("CODALAB_PASSWORD")
                    .value(pw)
                    .build(),
            ),
            (None, None) => {}
        }
        ContainerProperties::builder()
            .image(&self.image)
            .user(&self.user)
            .set_resource_requirements(Some(Self::resources(self.cpus, self.gpus, self.memory_mb)))
            .set_volumes(Some(volumes))
            .set_mount_points(Some(mounts))
            .set_environment(Some(env))
            .set_secrets(Some(secrets))
            .set_execution_role_arn(self.execution_role_arn.clone())
            .set_job_role_arn(self.job_role_arn.clone())
            .build()
    }
}

/// The parts of container properties that decide whether a revision can be reused, in a
/// comparable form (order-insensitive where AWS does not care about order).
pub(super) fn fingerprint(p: &ContainerProperties) -> String {
    let set = |v: Vec<String>| v.into_iter().collect::<BTreeSet<_>>();
    let res = set(p
        .resource_requirements()
        .iter()
        .map(|r| {
            format!(
                "{}={}",
                r.r#type().map_or("", |t| t.as_str()),
                r.value().unwrap_or("")
            )
        })
        .collect());
    let env = set(p
        .environment()
        .iter()
        .map(|e| format!("{}={}", e.name().unwrap_or(""), e.value().unwrap_or("")))
        .collect());
    let secrets = set(p
        .secrets()
        .iter()
        .map(|s| {
            format!(
                "{}={}",
                s.name().unwrap_or(""),
                s.value_from().unwrap_or("")
            )
        })
        .collect());
    let volumes = set(p
        .volumes()
        .iter()
        .map(|v| {
            format!(
                "{}={}",
                v.name().unwrap_or(""),
                v.host().and_then(|h| h.source_path()).unwrap_or("")
            )
        })
        .collect());
    let mounts = set(p
        .mount_points()
        .iter()
        .map(|m| {
            // An unset readOnly is AWS's default, false.
            format!(
                "{}={}:{}",
                m.source_volume().unwrap_or(""),
                m.container_path().unwrap_or(""),
                if m.read_only().unwrap_or(false) {
                    "ro"
                } else {
                    "rw"
                }
            )
        })
        .collect());
    let mut f = format!(
        "image={:?} user={:?} res={res:?} env={env:?} secrets={secrets:?} volumes={volumes:?} mounts={mounts:?}",
        p.image().unwrap_or(""),
        p.user().unwrap_or(""),
    );
    // Only when set, so that revisions registered before these flags existed are still reused.
    if let Some(r) = p.execution_role_arn() {
        f.push_str(&format!(" execution_role={r:?}"));
    }
    if let Some(r) = p.job_role_arn() {
        f.push_str(&format!(" job_role={r:?}"));
    }
    f
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;

    pub(crate) fn cfg() -> AwsBatchConfig {
        AwsBatchConfig {
            job_queue: "q".into(),
            job_definition_name: "codalab-worker".into(),
            image: "codalab/worker:latest".into(),
            user: "root".into(),
            cpus: 2,
            gpus: 1,
            memory_mb: 4096,
            job_filter: None,
            work_dir_prefix: Some("/efs/cl".into()),
            bundle_mount: None,
            username: "codalab".into(),
            password_secret_arn: Some("arn:aws:secretsmanager:us-east-1:1:secret:pw".into()),
            plaintext_password: None,
            execution_role_arn: None,
            job_role_arn: None,
        }
    }

    #[test]
    fn roles_reach_the_definition_and_a_definition_without_them_is_still_reused() {
        let without = cfg().container_properties();
        assert_eq!(without.execution_role_arn(), None);
        assert_eq!(without.job_role_arn(), None);
        assert!(!fingerprint(&without).contains("role"));
        let mut c = cfg();
        c.execution_role_arn = Some("arn:aws:iam::1:role/exec".into());
        c.job_role_arn = Some("arn:aws:iam::1:role/job".into());
        let with = c.container_properties();
        assert_eq!(with.execution_role_arn(), Some("arn:aws:iam::1:role/exec"));
        assert_eq!(with.job_role_arn(), Some("arn:aws:iam::1:role/job"));
        assert_ne!(fingerprint(&with), fingerprint(&without));
        c.job_role_arn = None;
        assert_ne!(fingerprint(&c.container_properties()), fingerprint(&with));
    }

    /// The worker starts its runs through the host's Docker with paths under its work dir:
    /// that dir is on the host at the same path whatever the flags (CodaLab's `/tmp` without
    /// a prefix), and so is the bundle store with a shared file system.
    #[test]
    fn the_work_dir_and_the_bundle_store_are_mounted_at_the_same_path_whatever_the_flags() {
        let paths = |c: &AwsBatchConfig| -> Vec<(String, String, String)> {
            let p = c.container_properties();
            p.mount_points()
                .iter()
                .map(|m| {
                    let v = p
                        .volumes()
                        .iter()
                        .find(|v| v.name() == m.source_volume())
                        .unwrap();
                    (
                        v.host().unwrap().source_path().unwrap().to_owned(),
                        m.container_path().unwrap().to_owned(),
                        format!("{:?}", m.read_only()),
                    )
                })
                .collect()
        };
        let mut c = cfg();
        c.work_dir_prefix = None;
        let rw = "Some(false)".to_string();
        let same = |p: &str| (p.to_owned(), p.to_owned(), rw.clone());
        assert_eq!(paths(&c), [same("/var/run/docker.sock"), same("/tmp")]);
        c.bundle_mount = Some("/mnt/codalab/bundles".into());
        assert_eq!(
            paths(&c),
            [
                same("/var/run/docker.sock"),
                same("/tmp"),
                same("/mnt/codalab/bundles")
            ]
        );
    }

    #[test]
    fn definition_uses_secrets_and_mounts() {
        let p = cfg().container_properties();
        assert_eq!(p.secrets().len(), 1);
        assert_eq!(p.secrets()[0].name(), Some("CODALAB_PASSWORD"));
        assert!(p
            .environment()
            .iter()
            .all(|e| e.name() != Some("CODALAB_PASSWORD")));
        let mounts: Vec<_> = p
            .mount_points()
            .iter()
            .map(|m| m.container_path().unwrap())
            .collect();
        assert_eq!(mounts, ["/var/run/docker.sock", "/efs/cl"]);
        let f = fingerprint(&p);
        assert!(
            f.contains("GPU=1") && f.contains("VCPU=2") && f.contains("MEMORY=4096"),
            "{f}"
        );
        // Order-insensitive: the same properties in another order are the same revision.
        let mut q = p.clone();
        q.resource_requirements = q.resource_requirements.map(|mut r| {
            r.reverse();
            r
        });
        assert_eq!(fingerprint(&q), f);
        let mut c = cfg();
        c.image = "other".into();
        assert_ne!(fingerprint(&c.container_properties()), f);
        // Mounts say readOnly=false outright (moto needs the field); a definition registered
        // without it is the same, a read-only mount is not.
        assert!(p
            .mount_points()
            .iter()
            .all(|m| m.read_only() == Some(false)));
        let with_ro = |ro: Option<bool>| {
            let mut q = p.clone();
            q.mount_points = q.mount_points.map(|ms| {
                ms.into_iter()
                    .map(|mut m| {
                        m.read_only = ro;
                        m
                    })
                    .collect()
            });
            fingerprint(&q)
        };
        assert_eq!(with_ro(None), f);
        assert_ne!(with_ro(Some(true)), f);
    }
}
