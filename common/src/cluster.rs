//! How both binaries reach a Kubernetes API server: the manager's `kubernetes` backend
//! (`--cluster-host`, …) and the worker's Kubernetes runtime (`--kubernetes-cluster-host`, …)
//! take the same four Python flags plus a token file, and read them the same way.

use std::path::{Path, PathBuf};
use std::time::Duration;

/// The API server URL of CodaLab's local kind set-up, which Python talks to anonymously and
/// without checking its certificate.
pub const KIND_CONTROL_PLANE: &str = "https://codalab-control-plane:6443";

/// The extended resource of NVIDIA GPUs; GKE taints GPU node pools with it
/// (`nvidia.com/gpu=present:NoSchedule`), so every pod asking for GPUs tolerates that taint.
pub const GPU_RESOURCE: &str = "nvidia.com/gpu";
/// Label of every pod this project creates: `cl-worker-manager` on worker pods, `cl-worker`
/// on run pods.
pub const LABEL_MANAGED_BY: &str = "app.kubernetes.io/managed-by";
/// Label holding a worker id: on worker pods the manager's, on run pods the worker's.
pub const LABEL_WORKER_ID: &str = "codalab.org/worker-id";

/// Where a kubelet projects a pod's service account token.
pub const SERVICE_ACCOUNT_TOKEN: &str = "/var/run/secrets/kubernetes.io/serviceaccount/token";

/// The flags that say where the API is and how to authenticate. `flag_prefix` names them in
/// messages: `""` for the manager's `--cluster-host`, `"kubernetes-"` for the worker's.
#[derive(Debug, Clone, Default)]
pub struct ClusterAccess {
    pub flag_prefix: &'static str,
    pub cluster_host: Option<String>,
    pub auth_token: Option<String>,
    pub auth_token_file: Option<PathBuf>,
    pub cert_path: Option<String>,
    pub cert: Option<String>,
    pub namespace: String,
    /// `--allow-insecure-cluster-host` (manager) / `--allow-insecure-kubernetes-cluster-host`
    /// (worker): send a bearer token to a plain-HTTP API server on another machine.
    pub allow_insecure: bool,
}

/// Why the flags make no kube-rs configuration. The messages are whole sentences naming the
/// flag (`--cluster-host`, `--kubernetes-cluster-host`, …).
#[derive(Debug, thiserror::Error)]
pub enum ClusterConfigError {
    /// No cluster host, and none of the usual places has a configuration.
    #[error(
        "no Kubernetes configuration ({source}): pass {flag}, set KUBECONFIG, or run in a cluster"
    )]
    Infer {
        flag: String,
        source: kube::config::InferConfigError,
    },
    #[error("{flag} {host:?}: {source}")]
    Host {
        flag: String,
        host: String,
        source: http::uri::InvalidUri,
    },
    #[error("{flag} {}: {source}", path.display())]
    TokenFile {
        flag: String,
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{flag} {path}: {source}")]
    CertFile {
        flag: String,
        path: String,
        source: std::io::Error,
    },
    #[error("{flag}: not a PEM certificate: {source}")]
    NotPem {
        flag: String,
        source: rustls::pki_types::pem::Error,
    },
    #[error("{flag}: no PEM certificate found")]
    NoCertificate { flag: String },
    /// A bearer token would go in clear to an API server on another machine.
    #[error(
        "the Kubernetes API {url} is plain HTTP on another machine, and a bearer token would \
         cross the network in clear: use https:// (with {cert_path} or {cert}), or pass \
         {insecure} to accept that"
    )]
    Plaintext {
        url: String,
        cert_path: String,
        cert: String,
        insecure: String,
    },
}

/// `--cert-path` and `--cert` as Python reads them: `/dev/null` means "not given".
fn given(v: &Option<String>) -> Option<&str> {
    v.as_deref().filter(|s| !s.is_empty() && *s != "/dev/null")
}

impl ClusterAccess {
    fn flag(&self, name: &str) -> String {
        format!("--{}{name}", self.flag_prefix)
    }

    /// The kube-rs configuration: from the flags when a cluster host is given, else inferred
    /// (in-cluster service account, `KUBECONFIG`, `~/.kube/config`). With a host and no token
    /// flag, the pod's own service account token is used when there is one. Errors are whole
    /// sentences naming the flag.
    pub async fn config(
        &self,
        service_account_token: &Path,
    ) -> Result<kube::Config, ClusterConfigError> {
        let mut config = match &self.cluster_host {
            None => kube::Config::infer()
                .await
                .map_err(|source| ClusterConfigError::Infer {
                    flag: self.flag("cluster-host"),
                    source,
                })?,
            Some(host) => {
                let uri: http::Uri = host.parse().map_err(|source| ClusterConfigError::Host {
                    flag: self.flag("cluster-host"),
                    host: host.clone(),
                    source,
                })?;
                kube::Config::new(uri)
            }
        };
        if self.cluster_host.as_deref() == Some(KIND_CONTROL_PLANE) {
            tracing::warn!(
                "{} {KIND_CONTROL_PLANE}: CodaLab's local kind cluster, reached anonymously and \
                 without checking its certificate",
                self.flag("cluster-host")
            );
            config.accept_invalid_certs = true;
        } else {
            if self.auth_token.is_some() {
                tracing::warn!(
                    "{}: a token on the command line is visible to every user of this machine \
                     (ps); prefer {}",
                    self.flag("auth-token"),
                    self.flag("auth-token-file")
                );
            }
            if let Some(file) = &self.auth_token_file {
                std::fs::metadata(file).map_err(|source| ClusterConfigError::TokenFile {
                    flag: self.flag("auth-token-file"),
                    path: file.clone(),
                    source,
                })?;
                config.auth_info.token_file = Some(file.display().to_string());
                config.auth_info.token = None;
            } else if let Some(token) = &self.auth_token {
                config.auth_info.token = Some(token.clone().into());
            } else if self.cluster_host.is_some() && service_account_token.is_file() {
                // Bound tokens rotate: kube-rs re-reads the file.
                config.auth_info.token_file = Some(service_account_token.display().to_string());
            }
            if let Some(path) = given(&self.cert_path) {
                let pem = std::fs::read(path).map_err(|source| ClusterConfigError::CertFile {
                    flag: self.flag("cert-path"),
                    path: path.to_owned(),
                    source,
                })?;
                config.root_cert = Some(certificates(&pem, &self.flag("cert-path"))?);
            } else if let Some(text) = given(&self.cert) {
                let pem = text.replace("\\n", "\n");
                config.root_cert = Some(certificates(pem.as_bytes(), &self.flag("cert"))?);
            }
        }
        // The platform verifier needs the system's CA certificates even when no TLS is used,
        // and a minimal worker image has none: plain HTTP needs no roots at all.
        if config.cluster_url.scheme_str() == Some("http") && config.root_cert.is_none() {
            config.root_cert = Some(Vec::new());
        }
        self.check_plaintext(&config)?;
        config.default_namespace = self.namespace.clone();
        // Callers retry briefly themselves; kube-rs's own retry can wait for many minutes.
        config.default_retry = false;
        config.read_timeout = Some(Duration::from_secs(30));
        Ok(config)
    }
}

impl ClusterAccess {
    /// The flag that lets a token go to a plain-HTTP API server on another machine.
    pub fn insecure_flag(&self) -> String {
        format!("--allow-insecure-{}cluster-host", self.flag_prefix)
    }

    /// A bearer token sent over plain HTTP to another machine can be read on the way, and the
    /// API server's answers forged: refused unless the insecure flag is given, then warned about.
    fn check_plaintext(&self, config: &kube::Config) -> Result<(), ClusterConfigError> {
        let url = config.cluster_url.to_string();
        let has_token = config.auth_info.token.is_some() || config.auth_info.token_file.is_some();
        if !(has_token && protocol::net::is_plaintext_remote(&url)) {
            return Ok(());
        }
        if !self.allow_insecure {
            return Err(ClusterConfigError::Plaintext {
                url,
                cert_path: self.flag("cert-path"),
                cert: self.flag("cert"),
                insecure: self.insecure_flag(),
            });
        }
        tracing::warn!(
            "{}: the bearer token goes to {url} in clear",
            self.insecure_flag()
        );
        Ok(())
    }
}

/// The DER certificates of a PEM text.
fn certificates(pem: &[u8], flag: &str) -> Result<Vec<Vec<u8>>, ClusterConfigError> {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::CertificateDer;
    let certs: Vec<Vec<u8>> = CertificateDer::pem_slice_iter(pem)
        .map(|c| c.map(|c| c.to_vec()))
        .collect::<Result<_, _>>()
        .map_err(|source| ClusterConfigError::NotPem {
            flag: flag.to_owned(),
            source,
        })?;
    if certs.is_empty() {
        return Err(ClusterConfigError::NoCertificate {
            flag: flag.to_owned(),
        });
    }
    Ok(certs)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn flags_make_the_config() {
        let dir = tempfile::tempdir().unwrap();
        let sa = dir.path().join("token");
        std::fs::write(&sa, "t0").unwrap();
        let a = ClusterAccess {
            flag_prefix: "kubernetes-",
            cluster_host: Some("http://127.0.0.1:1".into()),
            cert_path: Some("/dev/null".into()),
            namespace: "codalab".into(),
            ..Default::default()
        };
        let c = a.config(&sa).await.unwrap();
        assert_eq!(c.cluster_url.to_string(), "http://127.0.0.1:1/");
        assert_eq!(c.default_namespace, "codalab");
        assert_eq!(
            c.auth_info.token_file.as_deref(),
            Some(sa.to_str().unwrap())
        );
        // Plain HTTP: no CA roots are needed (none is loaded from the system).
        assert_eq!(c.root_cert, Some(vec![]));
        // A token flag wins over the pod's own token.
        let c = ClusterAccess {
            auth_token: Some("secret".into()),
            ..a.clone()
        }
        .config(&sa)
        .await
        .unwrap();
        assert!(c.auth_info.token_file.is_none() && c.auth_info.token.is_some());
        let e = ClusterAccess {
            cert: Some("not a pem".into()),
            ..a.clone()
        }
        .config(&sa)
        .await
        .unwrap_err();
        assert!(
            matches!(e, ClusterConfigError::NoCertificate { .. }),
            "{e:?}"
        );
        assert!(
            e.to_string()
                .starts_with("--kubernetes-cert: no PEM certificate"),
            "{e}"
        );
        let e = ClusterAccess {
            auth_token_file: Some(dir.path().join("missing")),
            ..a
        }
        .config(&sa)
        .await
        .unwrap_err();
        assert!(
            e.to_string().starts_with("--kubernetes-auth-token-file "),
            "{e}"
        );
    }

    #[tokio::test]
    async fn a_token_over_plain_http_to_another_machine_needs_the_opt_in() {
        let dir = tempfile::tempdir().unwrap();
        let sa = dir.path().join("token");
        std::fs::write(&sa, "t0").unwrap();
        let a = ClusterAccess {
            flag_prefix: "kubernetes-",
            cluster_host: Some("http://10.1.2.3:8080".into()),
            namespace: "codalab".into(),
            ..Default::default()
        };
        let e = a.config(&sa).await.unwrap_err().to_string();
        assert!(e.contains("plain HTTP"), "{e}");
        assert!(
            e.contains("--allow-insecure-kubernetes-cluster-host"),
            "{e}"
        );
        let c = ClusterAccess {
            allow_insecure: true,
            ..a.clone()
        }
        .config(&sa)
        .await
        .unwrap();
        assert!(c.auth_info.token_file.is_some());
        // Without a token, or on this machine, or over https, nothing is refused.
        let none = dir.path().join("no-token");
        assert!(a.config(&none).await.is_ok());
        for host in ["http://127.0.0.1:8080", "https://10.1.2.3:6443"] {
            let a = ClusterAccess {
                cluster_host: Some(host.into()),
                ..a.clone()
            };
            assert!(a.config(&sa).await.is_ok(), "{host}");
        }
    }
}
