//! An image's size from its registry, before any pull (`--max-image-size`): the OCI distribution
//! API's manifest (`GET /v2/<repository>/manifests/<reference>`), whose config and layers carry
//! their sizes. Docker Hub and other registries that want a token get an anonymous one from the
//! realm their `WWW-Authenticate` names. A multi-platform index is followed to the manifest of
//! this machine's platform. The size is of the compressed layers, as Docker Hub's `full_size`
//! (what CodaLab checks) is.

use std::time::Duration;

use reqwest::header::{ACCEPT, WWW_AUTHENTICATE};
use reqwest::StatusCode;
use serde::Deserialize;

const MANIFEST_TYPES: &str = "application/vnd.oci.image.index.v1+json, \
     application/vnd.docker.distribution.manifest.list.v2+json, \
     application/vnd.oci.image.manifest.v1+json, \
     application/vnd.docker.distribution.manifest.v2+json";

/// A parsed image reference: where its registry is, the repository, and a tag or digest.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImageRef {
    /// `http://` or `https://` and the registry's host (Docker Hub: `registry-1.docker.io`).
    pub base: String,
    pub repository: String,
    pub reference: String,
}

/// Whether `image` is a reference in the distribution project's grammar (what Docker accepts):
/// `[host[:port]/]component(/component)*[:tag][@algorithm:hex]`, a host of letters, digits and
/// `-` between dots (or `[IPv6]`), a port of digits, components of lower-case letters and digits
/// joined by `.`, `_`, `__` or dashes, a tag of at most 128 word characters, `.` and `-` not
/// starting with either, a digest of at least 32 hexadecimal digits. Nothing else goes to a
/// registry or the engine: a name such as `localhost:2375/../containers/json?@x` would make
/// the worker send a request to a path of the engine's own API.
pub fn valid_reference(image: &str) -> bool {
    fn alnum_lower(s: &str) -> bool {
        !s.is_empty()
            && s.bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
    }
    fn component(c: &str) -> bool {
        // Runs of [a-z0-9] separated by `.`, `_`, `__` or one or more `-`.
        let is_alnum = |ch: char| ch.is_ascii_lowercase() || ch.is_ascii_digit();
        let mut rest = c;
        loop {
            let end = rest.find(|ch: char| !is_alnum(ch)).unwrap_or(rest.len());
            if !alnum_lower(&rest[..end]) {
                return false;
            }
            rest = &rest[end..];
            if rest.is_empty() {
                return true;
            }
            let sep_end = rest.find(is_alnum).unwrap_or(rest.len());
            let sep = &rest[..sep_end];
            let dashes = sep.bytes().all(|b| b == b'-');
            if !(sep == "." || sep == "_" || sep == "__" || dashes) {
                return false;
            }
            rest = &rest[sep_end..];
        }
    }
    fn port(p: &str) -> bool {
        !p.is_empty() && p.len() <= 5 && p.bytes().all(|b| b.is_ascii_digit())
    }
    fn host(h: &str) -> bool {
        if let Some(v6) = h.strip_prefix('[') {
            let Some((addr, rest)) = v6.split_once(']') else {
                return false;
            };
            let addr_ok =
                !addr.is_empty() && addr.bytes().all(|b| b.is_ascii_hexdigit() || b == b':');
            return addr_ok && (rest.is_empty() || rest.strip_prefix(':').is_some_and(port));
        }
        let (name, p) = match h.rsplit_once(':') {
            Some((n, p)) => (n, Some(p)),
            None => (h, None),
        };
        p.is_none_or(port)
            && !name.is_empty()
            && name.split('.').all(|label| {
                !label.is_empty()
                    && label
                        .bytes()
                        .all(|b| b.is_ascii_alphanumeric() || b == b'-')
                    && !label.starts_with('-')
                    && !label.ends_with('-')
            })
    }
    let (rest, digest) = match image.split_once('@') {
        Some((r, d)) => (r, Some(d)),
        None => (image, None),
    };
    if let Some(d) = digest {
        let Some((alg, hex)) = d.split_once(':') else {
            return false;
        };
        let alg_ok = alg.split(['-', '_', '+', '.']).all(|p| {
            p.chars().next().is_some_and(|c| c.is_ascii_alphabetic())
                && p.bytes().all(|b| b.is_ascii_alphanumeric())
        });
        if !alg_ok || hex.len() < 32 || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
            return false;
        }
    }
    let slash = rest.rfind('/').map_or(0, |i| i + 1);
    let (name, tag) = match rest[slash..].rfind(':') {
        Some(i) => (&rest[..slash + i], Some(&rest[slash + i + 1..])),
        None => (rest, None),
    };
    if let Some(t) = tag {
        let ok = !t.is_empty()
            && t.len() <= 128
            && !t.starts_with(['.', '-'])
            && t.bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-'));
        if !ok {
            return false;
        }
    }
    if name.is_empty() || name.len() > 255 {
        return false;
    }
    let mut parts = name.split('/');
    let first = parts.next().unwrap_or_default();
    let is_host = name.contains('/')
        && (first.contains('.')
            || first.contains(':')
            || first == "localhost"
            || first.starts_with('['));
    if is_host && !host(first) {
        return false;
    }
    let comps: Vec<&str> = if is_host {
        parts.collect()
    } else {
        name.split('/').collect()
    };
    !comps.is_empty() && comps.iter().all(|c| component(c))
}

/// Parses `[host[:port]/]path[:tag][@digest]` as Docker does: the first component is a
/// registry when it holds a `.` or `:` or is `localhost`; Docker Hub's one-component names are
/// under `library/`. Registries on the loopback address are spoken to over plain HTTP, as the
/// engine does by default; every other over HTTPS.
pub fn parse(image: &str) -> Option<ImageRef> {
    if !valid_reference(image) {
        return None;
    }
    let (name, reference) = match image.split_once('@') {
        Some((n, d)) => (n, d.to_owned()),
        None => {
            let slash = image.rfind('/').map_or(0, |i| i + 1);
            match image[slash..].rfind(':') {
                Some(i) => (&image[..slash + i], image[slash + i + 1..].to_owned()),
                None => (image, "latest".to_owned()),
            }
        }
    };
    if name.is_empty() || reference.is_empty() {
        return None;
    }
    let (host, path) = match name.split_once('/') {
        Some((h, rest)) if h.contains('.') || h.contains(':') || h == "localhost" => {
            (h.to_owned(), rest.to_owned())
        }
        _ => ("docker.io".to_owned(), name.to_owned()),
    };
    let (host, path) = if host == "docker.io" || host == "index.docker.io" {
        let path = if path.contains('/') {
            path
        } else {
            format!("library/{path}")
        };
        ("registry-1.docker.io".to_owned(), path)
    } else {
        (host, path)
    };
    let bare = host.rsplit_once(':').map_or(host.as_str(), |(h, _)| h);
    let loopback = bare == "localhost" || bare.starts_with("127.") || bare == "[::1]";
    let scheme = if loopback { "http" } else { "https" };
    Some(ImageRef {
        base: format!("{scheme}://{host}"),
        repository: path,
        reference,
    })
}

#[derive(Deserialize)]
struct Descriptor {
    #[serde(default)]
    size: u64,
    #[serde(default)]
    digest: String,
    #[serde(default)]
    platform: Option<Platform>,
}

#[derive(Deserialize)]
struct Platform {
    #[serde(default)]
    architecture: String,
    #[serde(default)]
    os: String,
}

#[derive(Deserialize)]
struct Manifest {
    #[serde(default)]
    config: Option<Descriptor>,
    #[serde(default)]
    layers: Vec<Descriptor>,
    /// An index (manifest list): one manifest per platform.
    #[serde(default)]
    manifests: Vec<Descriptor>,
}

/// This machine's platform as registries name it.
fn this_architecture() -> &'static str {
    match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        "powerpc64" => "ppc64le",
        other => other,
    }
}

/// Why the registry could not be asked for an image's size.
#[derive(Debug, thiserror::Error)]
pub enum RegistryError {
    #[error("{0:?} is not an image reference")]
    NotAReference(String),
    #[error(transparent)]
    Http(#[from] reqwest::Error),
    #[error("the registry answered {0}")]
    Status(StatusCode),
    #[error("the registry's answer is larger than {} MiB", MAX_BODY >> 20)]
    BodyTooLarge,
    #[error("unreadable manifest: {0}")]
    UnreadableManifest(#[source] serde_json::Error),
    #[error("the registry asks for credentials ({challenge:?})")]
    Credentials { challenge: String },
    #[error("no realm in the registry's challenge")]
    NoRealm,
    #[error("token realm {realm} is not an HTTPS URL")]
    RealmNotHttps { realm: String },
    #[error("unreadable token: {0}")]
    UnreadableToken(#[source] serde_json::Error),
    #[error("the token realm gave no token")]
    NoToken,
    #[error("the registry refused the anonymous token")]
    TokenRefused,
}

/// The compressed size of `image` as its registry tells it; `Ok(None)` when the registry does
/// not have it for this platform. Errors say why the registry could not be asked.
pub async fn image_size(image: &str) -> Result<Option<u64>, RegistryError> {
    let Some(r) = parse(image) else {
        return Err(RegistryError::NotAReference(image.to_owned()));
    };
    common::install_crypto_provider();
    // No redirects: a registry named by a bundle does not get to point the worker elsewhere
    // (a redirect is "cannot tell", and the size is then checked after the pull).
    let http = reqwest::Client::builder()
        .connect_timeout(Duration::from_secs(10))
        .timeout(Duration::from_secs(30))
        .redirect(reqwest::redirect::Policy::none())
        .build()?;
    let mut token = None;
    let mut reference = r.reference.clone();
    // An index, then the platform's manifest: two levels at most.
    for _ in 0..2 {
        let url = format!("{}/v2/{}/manifests/{reference}", r.base, r.repository);
        let m: Manifest = match get(&http, &url, &mut token).await? {
            Some(m) => m,
            None => return Ok(None),
        };
        if m.manifests.is_empty() {
            let total =
                m.config.map_or(0, |c| c.size) + m.layers.iter().map(|l| l.size).sum::<u64>();
            return Ok((total > 0).then_some(total));
        }
        let arch = this_architecture();
        let Some(d) = m.manifests.iter().find(|d| {
            d.platform
                .as_ref()
                .is_some_and(|p| p.os == "linux" && p.architecture == arch)
        }) else {
            return Ok(None);
        };
        reference = d.digest.clone();
    }
    Ok(None)
}

/// GETs a manifest, getting an anonymous token once where the registry asks for one.
async fn get(
    http: &reqwest::Client,
    url: &str,
    token: &mut Option<String>,
) -> Result<Option<Manifest>, RegistryError> {
    for _ in 0..2 {
        let mut req = http.get(url).header(ACCEPT, MANIFEST_TYPES);
        if let Some(t) = token.as_ref() {
            req = req.bearer_auth(t);
        }
        let resp = req.send().await?;
        match resp.status() {
            s if s.is_success() => {
                let body = read_capped(resp).await?;
                return serde_json::from_slice::<Manifest>(&body)
                    .map(Some)
                    .map_err(RegistryError::UnreadableManifest);
            }
            StatusCode::NOT_FOUND => return Ok(None),
            StatusCode::UNAUTHORIZED if token.is_none() => {
                let challenge = resp
                    .headers()
                    .get(WWW_AUTHENTICATE)
                    .and_then(|v| v.to_str().ok())
                    .unwrap_or_default()
                    .to_owned();
                *token = Some(anonymous_token(http, &challenge).await?);
            }
            s => return Err(RegistryError::Status(s)),
        }
    }
    Err(RegistryError::TokenRefused)
}

/// Manifests and tokens are small; a registry (the bundle's choice) sending more is refused
/// before it fills the worker's memory.
const MAX_BODY: usize = 4 << 20;

async fn read_capped(mut resp: reqwest::Response) -> Result<Vec<u8>, RegistryError> {
    let mut body = Vec::new();
    while let Some(chunk) = resp.chunk().await? {
        if body.len() + chunk.len() > MAX_BODY {
            return Err(RegistryError::BodyTooLarge);
        }
        body.extend_from_slice(&chunk);
    }
    Ok(body)
}

/// `Bearer realm="…",service="…",scope="…"` → an anonymous token from the realm.
async fn anonymous_token(http: &reqwest::Client, challenge: &str) -> Result<String, RegistryError> {
    let params = challenge_params(challenge).ok_or_else(|| RegistryError::Credentials {
        challenge: challenge.to_owned(),
    })?;
    let realm = params
        .iter()
        .find(|(k, _)| k == "realm")
        .map(|(_, v)| v.clone())
        .ok_or(RegistryError::NoRealm)?;
    // The realm is the registry's word, and the registry is the bundle's choice: only HTTPS,
    // and no credentials of any kind are sent there.
    let realm = reqwest::Url::parse(&realm)
        .ok()
        .filter(|u| u.scheme() == "https" && u.host_str().is_some())
        .ok_or(RegistryError::RealmNotHttps { realm })?;
    let query: Vec<(String, String)> = params.into_iter().filter(|(k, _)| k != "realm").collect();
    #[derive(Deserialize)]
    struct Token {
        #[serde(default)]
        token: String,
        #[serde(default)]
        access_token: String,
    }
    let resp = http
        .get(realm)
        .query(&query)
        .send()
        .await?
        .error_for_status()?;
    let t: Token = serde_json::from_slice(&read_capped(resp).await?)
        .map_err(RegistryError::UnreadableToken)?;
    let t = if t.token.is_empty() {
        t.access_token
    } else {
        t.token
    };
    if t.is_empty() {
        return Err(RegistryError::NoToken);
    }
    Ok(t)
}

/// The parameters of a `Bearer` challenge.
fn challenge_params(challenge: &str) -> Option<Vec<(String, String)>> {
    let rest = challenge.trim().strip_prefix("Bearer ")?;
    let mut out = Vec::new();
    let mut s = rest.trim();
    while !s.is_empty() {
        let (key, after) = s.split_once('=')?;
        let after = after.trim_start();
        let (value, tail) = if let Some(q) = after.strip_prefix('"') {
            let end = q.find('"')?;
            (&q[..end], &q[end + 1..])
        } else {
            let end = after.find(',').unwrap_or(after.len());
            (&after[..end], &after[end..])
        };
        out.push((key.trim().to_owned(), value.to_owned()));
        s = tail.trim_start_matches([',', ' ']);
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn references_are_parsed_as_docker_does() {
        let p = |s: &str| {
            let r = parse(s).unwrap();
            (r.base, r.repository, r.reference)
        };
        let hub = "https://registry-1.docker.io".to_owned();
        assert_eq!(
            p("ubuntu"),
            (hub.clone(), "library/ubuntu".into(), "latest".into())
        );
        assert_eq!(
            p("codalab/default-cpu:latest"),
            (hub.clone(), "codalab/default-cpu".into(), "latest".into())
        );
        assert_eq!(
            p("docker.io/python:3.9"),
            (hub, "library/python".into(), "3.9".into())
        );
        assert_eq!(
            p("127.0.0.1:5000/big/img:v1"),
            (
                "http://127.0.0.1:5000".into(),
                "big/img".into(),
                "v1".into()
            )
        );
        assert_eq!(
            p("localhost:5000/img"),
            (
                "http://localhost:5000".into(),
                "img".into(),
                "latest".into()
            )
        );
        let digest = format!("sha256:{}", "ab".repeat(32));
        assert_eq!(
            p(&format!("ghcr.io/o/r@{digest}")),
            ("https://ghcr.io".into(), "o/r".into(), digest)
        );
        assert_eq!(parse(""), None);
        assert_eq!(parse("img:"), None);
    }

    #[test]
    fn only_references_in_the_grammar_are_accepted() {
        for ok in [
            "ubuntu",
            "ubuntu:22.04",
            "codalab/default-cpu:latest",
            "my-registry.example.org:5000/team/img_name__x:v1.2-rc",
            "localhost:5000/a/b",
            "[::1]:5000/img",
            "a.b-c/d",
            "nvidia/cuda:11.5.2-base-ubuntu20.04",
            &format!("img@sha256:{}", "0".repeat(64)),
            &format!("img:tag@sha256:{}", "f".repeat(64)),
        ] {
            assert!(valid_reference(ok), "{ok}");
        }
        for bad in [
            "localhost:2375/../containers/json?@x",
            "localhost:2375/containers/json?x=1",
            "host:2375/a/../b",
            "Upper/case",
            "img:",
            ":tag",
            "img:-tag",
            "img@sha256:abc",
            "img@sha256:../../x",
            "a//b",
            "a/b/",
            "-a/b",
            "a..b/c",
            "exa mple/img",
            "host:port/img",
            "[::1/img",
            "img#frag",
            "img?q",
            "img\n",
            &"a".repeat(300),
        ] {
            assert!(!valid_reference(bad), "{bad:?}");
            assert_eq!(parse(bad), None, "{bad:?}");
        }
    }

    /// A one-connection HTTP server on loopback answering `head` and then `body_len` bytes.
    async fn registry_answering(head: String, body_len: usize) -> u16 {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        tokio::spawn(async move {
            let (mut sock, _) = listener.accept().await.unwrap();
            let mut buf = [0u8; 4096];
            let _ = sock.read(&mut buf).await;
            let _ = sock.write_all(head.as_bytes()).await;
            let chunk = vec![b' '; 64 << 10];
            let mut sent = 0;
            while sent < body_len {
                if sock.write_all(&chunk).await.is_err() {
                    return;
                }
                sent += chunk.len();
            }
        });
        port
    }

    /// A registry is the bundle's choice: an endless manifest is cut at 4 MiB, and a redirect
    /// (to the cloud's metadata service, say) is not followed.
    #[tokio::test]
    async fn a_hostile_registry_cannot_fill_memory_or_redirect_the_worker() {
        let port = registry_answering(
            "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n\r\n".into(),
            64 << 20,
        )
        .await;
        let e = image_size(&format!("127.0.0.1:{port}/big:latest"))
            .await
            .unwrap_err();
        assert!(matches!(e, RegistryError::BodyTooLarge), "{e:?}");
        assert!(e.to_string().contains("larger than 4 MiB"), "{e}");

        // Where the redirect points: any connection there would be the worker following it.
        let target_listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let target = target_listener.local_addr().unwrap().port();
        let asked = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let flag = asked.clone();
        tokio::spawn(async move {
            if target_listener.accept().await.is_ok() {
                flag.store(true, std::sync::atomic::Ordering::SeqCst);
            }
        });
        let port = registry_answering(
            format!(
                "HTTP/1.1 302 Found\r\nLocation: http://127.0.0.1:{target}/\r\n\
                 Content-Length: 0\r\n\r\n"
            ),
            0,
        )
        .await;
        let e = image_size(&format!("127.0.0.1:{port}/moved:latest"))
            .await
            .unwrap_err();
        assert!(
            matches!(e, RegistryError::Status(StatusCode::FOUND)),
            "{e:?}"
        );
        assert!(e.to_string().contains("302"), "{e}");
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
        assert!(!asked.load(std::sync::atomic::Ordering::SeqCst));
    }

    #[test]
    fn bearer_challenges_are_parsed() {
        assert_eq!(
            challenge_params(
                r#"Bearer realm="https://auth.docker.io/token",service="registry.docker.io",scope="repository:library/ubuntu:pull""#
            ),
            Some(vec![
                ("realm".into(), "https://auth.docker.io/token".into()),
                ("service".into(), "registry.docker.io".into()),
                ("scope".into(), "repository:library/ubuntu:pull".into()),
            ])
        );
        assert_eq!(challenge_params("Basic realm=\"x\""), None);
    }
}
