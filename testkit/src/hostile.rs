//! What the hostile suites share: a marker planted on the host that no run may read or change,
//! the runtimes a hostile bundle is tried on, and a worker on each.

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use crate::cl::{last_uuid, Cl};
use crate::podman;
use crate::worker::unique;
use crate::worker::WorkerProc;

/// A secret on the host, outside every work dir, that no run may read or change.
pub struct Marker {
    pub dir: PathBuf,
    pub secret: String,
}

impl Marker {
    pub fn plant(name: &str) -> Marker {
        let dir = PathBuf::from(format!("/tmp/{}", unique(&format!("clw-marker-{name}"))));
        fs::create_dir_all(&dir).unwrap();
        let secret = format!("secret-{}", unique("marker"));
        for f in ["secret", "x"] {
            fs::write(dir.join(f), &secret).unwrap();
            fs::set_permissions(dir.join(f), fs::Permissions::from_mode(0o600)).unwrap();
        }
        Marker { dir, secret }
    }

    /// The marker's files are as planted (nothing added, removed, replaced or written), and
    /// none of `seen` (what runs printed or uploaded) holds the secret.
    pub fn assert_untouched(&self, seen: &[&str]) {
        let mut names: Vec<_> = fs::read_dir(&self.dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        assert_eq!(names, ["secret", "x"], "the marker dir changed");
        for f in ["secret", "x"] {
            let p = self.dir.join(f);
            let m = fs::symlink_metadata(&p).unwrap();
            assert!(m.is_file(), "{} is no longer a file", p.display());
            assert_eq!(
                fs::read_to_string(&p).unwrap(),
                self.secret,
                "{} changed",
                p.display()
            );
        }
        for s in seen {
            assert!(!s.contains(&self.secret), "a run read the marker: {s}");
        }
    }
}

impl Drop for Marker {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.dir);
    }
}

/// `cl upload` of a directory; returns the new bundle's uuid.
pub fn upload_dir(cl: &Cl, dir: &Path) -> String {
    last_uuid(&cl.run(&["upload", dir.to_str().unwrap()]))
}

/// Where bundles run.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Rt {
    Docker,
    Podman,
    Kubernetes,
}

/// A worker whose bundles run on `rt`.
pub fn worker(rt: Rt, name: &str, extra: &[&str]) -> WorkerProc {
    match rt {
        Rt::Docker => WorkerProc::start(name, extra),
        Rt::Podman => {
            let mut args = vec!["--docker-host", podman::service()];
            args.extend_from_slice(extra);
            WorkerProc::start(name, &args)
        }
        Rt::Kubernetes => {
            let id = unique(&format!("clw-{name}"));
            let url = crate::k8s::url();
            let mut args = vec![
                "--bundle-runtime",
                "kubernetes",
                "--kubernetes-cluster-host",
                &url,
                "--kubernetes-namespace",
                crate::k8s::NS,
            ];
            args.extend_from_slice(extra);
            WorkerProc::start_env(
                &id,
                &id,
                tempfile::tempdir().unwrap(),
                &args,
                &[("CODALAB_KUBERNETES_NODE_NAME", "node-a".to_string())],
            )
        }
    }
}
