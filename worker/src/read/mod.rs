//! Serving `read`, `netcat` and `write` messages for running bundles.
//!
//! Every message is handled in a task of its own and answers its response socket exactly once:
//! through `/reply` (JSON: target info or `{"error_code", "error_message"}`) or through
//! `/reply_data` (header `{}` and a body: gzip, tar.gz or raw netcat bytes).
//!
//! Paths are resolved inside the bundle directory with `openat` and `O_NOFOLLOW`, one component
//! at a time, from a descriptor of the bundle directory. A symlink met on the way is followed
//! only while it stays inside the bundle, so a run cannot make the worker read or write host
//! files through links it planted (also not by swapping a directory for a link mid-read).
//! Special files (FIFOs, devices, sockets) are never opened.

mod info;
mod netcat;
mod resolve;
mod stream;
mod summary;
mod write;

use std::collections::HashSet;
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::path::PathBuf;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::time::Duration;

use flate2::write::GzEncoder;
use flate2::Compression;
use protocol::{ReadArgs, RestClient, ServerMessage};
use serde_json::{json, Value};
use tokio::sync::mpsc;

use crate::archive::ChannelWriter;
use crate::runtime::BundleRuntime;

use self::info::*;
use self::netcat::*;
use self::resolve::*;
use self::stream::*;
use self::summary::*;
use self::write::*;

/// What a message about a run needs to know of it (a snapshot taken by the event loop).
#[derive(Debug, Clone)]
pub struct Target {
    pub uuid: String,
    pub bundle_path: PathBuf,
    /// `child_path` of every dependency (links in the bundle dir, hidden from reads).
    pub dependency_paths: Vec<String>,
    pub container_id: Option<String>,
}

/// The text CodaLab's server recognises (it then retries the read once against the bundle store).
pub const NO_LONGER_RUNNING: &str = "Bundle no longer running";

/// Names `tar` always leaves out of directory streams, at any depth (as CodaLab does).
const ALWAYS_IGNORE: [&str; 3] = [".git", "._*", "__MACOSX"];

/// The server waits 60 s for the answer to a netcat message; answer well within that.
const NETCAT_DEADLINE: Duration = Duration::from_secs(45);
/// Once some bytes came back, this much silence ends the netcat response (a server that keeps
/// the connection open, like an HTTP/1.1 keep-alive server, would otherwise hold it until the
/// deadline).
const NETCAT_IDLE: Duration = Duration::from_secs(10);
const NETCAT_CONNECT: Duration = Duration::from_secs(10);
/// The largest netcat answer the worker holds (in memory) and forwards; a run that sends more
/// gets an error instead, so it cannot make the worker hold gigabytes.
const NETCAT_MAX_REPLY: usize = 16 << 20;

/// The memory every `read`, `netcat` and `write` a worker serves at once may hold together:
/// each reserves what it can hold at most before it starts, and keeps it until its answer has
/// gone out (a streamed answer: until its body ends). One read's bounds are its own (a netcat
/// answer, a summary's ends, a listing's entries); this bounds how many run at once, so that
/// many concurrent requests cannot add up to the worker's memory.
pub const READ_BUDGET: u64 = 192 << 20;
/// How long a request waits for its share of [`READ_BUDGET`] before it is refused (the server
/// waits 60 s for an answer).
const READ_BUDGET_WAIT: Duration = Duration::from_secs(20);

static BUDGET: std::sync::LazyLock<Arc<tokio::sync::Semaphore>> = std::sync::LazyLock::new(|| {
    Arc::new(tokio::sync::Semaphore::new((READ_BUDGET >> 10) as usize))
});

/// The most one request of this kind holds in memory at once.
fn worst_case(kind: &str) -> u64 {
    match kind {
        // Names and link targets, and their JSON.
        "get_target_info" => 2 * info::MAX_INFO_BYTES as u64,
        // Each end's bytes, decoded, split and joined.
        "summarize_file" => 10 * summary::MAX_SUMMARY_END,
        "netcat" => NETCAT_MAX_REPLY as u64 + (1 << 20),
        // A stream's channel (16 chunks of 256 KiB) and its compressor.
        _ => 5 << 20,
    }
}

/// Reserves `bytes` of [`READ_BUDGET`], waiting [`READ_BUDGET_WAIT`] at most.
async fn reserve(bytes: u64) -> Result<tokio::sync::OwnedSemaphorePermit, Failure> {
    let kib = (bytes.min(READ_BUDGET) >> 10).max(1) as u32;
    match tokio::time::timeout(READ_BUDGET_WAIT, BUDGET.clone().acquire_many_owned(kib)).await {
        Ok(Ok(p)) => Ok(p),
        _ => Err(Failure::new(
            503,
            format!(
                "the worker is serving as many reads of running bundles as its memory allows \
                 ({} MiB); try again shortly",
                READ_BUDGET >> 20
            ),
        )),
    }
}

/// Handles one `read`, `netcat` or `write` message in a task of its own, so that the event loop
/// never waits on it. `target` is `None` when the run is unknown.
pub fn spawn<R: BundleRuntime>(
    client: RestClient,
    runtime: R,
    worker_id: String,
    target: Option<Target>,
    message: ServerMessage,
    written: impl FnOnce() + Send + 'static,
) {
    tokio::spawn(async move {
        match message {
            ServerMessage::Read {
                socket_id,
                uuid,
                path,
                read_args,
            } => {
                let permit = reserve(worst_case(&read_args.kind)).await;
                let reply = match (target, permit.as_ref()) {
                    (None, _) => Reply::Error(Failure::internal(NO_LONGER_RUNNING)),
                    (_, Err(f)) => Reply::Error(f.clone()),
                    (Some(t), Ok(_)) => read(t, path.clone(), read_args.clone()).await,
                };
                reply.log(&format!("read {:?} of {uuid}/{path}", read_args.kind));
                send(&client, &worker_id, socket_id, &uuid, reply).await;
                drop(permit);
            }
            ServerMessage::Netcat {
                socket_id,
                uuid,
                port,
                message,
            } => {
                let permit = reserve(worst_case("netcat")).await;
                let reply = match (target, permit.as_ref()) {
                    (None, _) => Reply::Error(Failure::internal(NO_LONGER_RUNNING)),
                    (_, Err(f)) => Reply::Error(f.clone()),
                    (Some(t), Ok(_)) => {
                        match netcat(&runtime, &t, port, message.as_bytes()).await {
                            Ok(bytes) => Reply::Data(reqwest::Body::from(bytes)),
                            Err(f) => Reply::Error(f),
                        }
                    }
                };
                reply.log(&format!("netcat {uuid}:{port}"));
                send(&client, &worker_id, socket_id, &uuid, reply).await;
                drop(permit);
            }
            ServerMessage::Write {
                uuid,
                subpath,
                string,
            } => {
                let Some(t) = target else {
                    tracing::warn!("ignoring write to {uuid}/{subpath}: no such run");
                    return;
                };
                let sp = subpath.clone();
                // A write has no answer to refuse it with: it waits for its share (small) rather
                // than be lost.
                let kib = ((2 * string.len() as u64).min(READ_BUDGET) >> 10).max(1) as u32;
                let Ok(permit) = BUDGET.clone().acquire_many_owned(kib).await else {
                    return; // (the budget is never closed)
                };
                let r = tokio::task::spawn_blocking(move || {
                    let _permit = permit;
                    write_string(&t.bundle_path, &t.dependency_paths, &sp, string.as_bytes())
                })
                .await
                .unwrap_or_else(|e| Err(format!("write task failed: {e}")));
                match r {
                    Ok(()) => {
                        tracing::info!("wrote {uuid}/{subpath}");
                        // The run uploads its results again if they may have left already.
                        written();
                    }
                    Err(e) => tracing::warn!("refused write to {uuid}/{subpath}: {e}"),
                }
            }
            _ => {}
        }
    });
}

/// An error answer: an HTTP status and a message for the user.
#[derive(Debug, Clone, PartialEq)]
pub struct Failure {
    pub code: u16,
    pub message: String,
}

impl Failure {
    fn new(code: u16, message: impl Into<String>) -> Self {
        Failure {
            code,
            message: message.into(),
        }
    }
    fn not_found(message: impl Into<String>) -> Self {
        Self::new(404, message)
    }
    fn bad_request(message: impl Into<String>) -> Self {
        Self::new(400, message)
    }
    fn internal(message: impl Into<String>) -> Self {
        Self::new(500, message)
    }
}

/// The one answer a `read`/`netcat` message gets.
enum Reply {
    Json(Value),
    Data(reqwest::Body),
    Error(Failure),
}

impl Reply {
    fn log(&self, what: &str) {
        match self {
            Reply::Json(_) | Reply::Data(_) => tracing::debug!("{what}: answered"),
            Reply::Error(f) => tracing::info!("{what}: error {} {}", f.code, f.message),
        }
    }
}

async fn send(client: &RestClient, worker_id: &str, socket_id: i64, uuid: &str, reply: Reply) {
    let r = match reply {
        Reply::Json(v) => client.reply(worker_id, socket_id, &v).await,
        Reply::Error(f) => {
            let v = json!({"error_code": f.code, "error_message": f.message});
            client.reply(worker_id, socket_id, &v).await
        }
        Reply::Data(body) => {
            client
                .reply_data(worker_id, socket_id, &json!({}), body)
                .await
        }
    };
    if let Err(e) = r {
        tracing::warn!("reply on socket {socket_id} (bundle {uuid}) failed: {e}");
    }
}

// ------------------------------------------------------------------------------------------
// read
// ------------------------------------------------------------------------------------------

async fn read(t: Target, path: String, args: ReadArgs) -> Reply {
    let kind = args.kind.clone();
    let res = tokio::task::spawn_blocking(move || -> Result<Reply, Failure> {
        let b = Bundle::open(&t)?;
        match kind.as_str() {
            "get_target_info" => get_target_info(&b, &path, args.depth.unwrap_or(0))
                .map(|info| Reply::Json(json!({ "target_info": info }))),
            "stream_directory" => {
                let (dir, at_root) = b.open_directory(&path)?;
                let deps: HashSet<PathBuf> = if at_root {
                    b.dependency_set()
                } else {
                    HashSet::new()
                };
                Ok(Reply::Data(stream_body(move |w| {
                    write_tar_gz(dir, &deps, w.hand_off()?)?.flush()
                })))
            }
            "stream_file" => {
                let file = b.open_file(&path)?;
                // What the file holds now: a log that keeps growing must not keep the stream
                // going forever.
                let size = file.metadata().map(|m| m.len()).unwrap_or(u64::MAX);
                Ok(Reply::Data(stream_body(move |w| {
                    let mut gz = GzEncoder::new(w, Compression::fast());
                    io::copy(&mut file.take(size), &mut gz)?;
                    gz.finish().map(drop)
                })))
            }
            "read_file_section" => {
                let mut file = b.open_file(&path)?;
                let offset = args.offset.unwrap_or(0);
                let length = args.length.unwrap_or(u64::MAX);
                Ok(Reply::Data(stream_body(move |w| {
                    let mut gz = GzEncoder::new(w, Compression::default());
                    if offset < file.metadata()?.len() {
                        file.seek(SeekFrom::Start(offset))?;
                        io::copy(&mut (&mut file).take(length), &mut gz)?;
                    }
                    gz.finish().map(drop)
                })))
            }
            "summarize_file" => {
                let head = args.num_head_lines.unwrap_or(0);
                let tail = args.num_tail_lines.unwrap_or(0);
                if head == 0 && tail == 0 {
                    return Err(Failure::bad_request(
                        "summarize_file needs num_head_lines or num_tail_lines",
                    ));
                }
                // A file that is not there (yet) summarises as "<none>", like CodaLab's.
                let text = match b.open_file_if_present(&path)? {
                    Some(mut file) => summarize(
                        &mut file,
                        head,
                        tail,
                        args.max_line_length.unwrap_or(128),
                        args.truncation_text.as_deref().unwrap_or(""),
                    )
                    .map_err(|e| Failure::internal(e.to_string()))?,
                    None => NONE_PLACEHOLDER.into(),
                };
                let mut gz = GzEncoder::new(Vec::new(), Compression::default());
                gz.write_all(text.as_bytes())
                    .map_err(|e| Failure::internal(e.to_string()))?;
                let bytes = gz.finish().map_err(|e| Failure::internal(e.to_string()))?;
                Ok(Reply::Data(reqwest::Body::from(bytes)))
            }
            other => Err(Failure::bad_request(format!(
                "Unsupported read_type for read: {other}"
            ))),
        }
    })
    .await;
    match res {
        Ok(Ok(reply)) => reply,
        Ok(Err(f)) => Reply::Error(f),
        Err(e) => Reply::Error(Failure::internal(format!("read failed: {e}"))),
    }
}

/// A streamed HTTP body fed by `produce` on the blocking pool. An error while producing aborts
/// the body (the reply header has gone out already, so there is no second answer).
fn stream_body<F>(produce: F) -> reqwest::Body
where
    F: FnOnce(&mut ChannelWriter) -> io::Result<()> + Send + 'static,
{
    let (tx, rx) = mpsc::channel::<io::Result<bytes::Bytes>>(16);
    let err_tx = tx.clone();
    let writer = ChannelWriter::new(tx, Arc::new(AtomicU64::new(0)));
    tokio::task::spawn_blocking(move || {
        let mut w = writer;
        let r = produce(&mut w).and_then(|()| w.flush());
        drop(w);
        if let Err(e) = r {
            if e.kind() != io::ErrorKind::BrokenPipe {
                tracing::warn!("read stream failed: {e}");
            }
            let _ = err_tx.blocking_send(Err(e));
        }
    });
    reqwest::Body::wrap_stream(tokio_stream::wrappers::ReceiverStream::new(rx))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::nofollow::archive::ExactSize;
    use flate2::read::GzDecoder;
    use nix::sys::stat::Mode;
    use std::collections::HashMap;
    use std::fs;
    use std::fs::File;
    use std::os::unix::fs::symlink;
    use std::path::Path;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    fn target(dir: &Path, deps: &[&str]) -> Target {
        Target {
            uuid: "0xabc".into(),
            bundle_path: dir.to_owned(),
            dependency_paths: deps.iter().map(|s| s.to_string()).collect(),
            container_id: None,
        }
    }

    /// A bundle dir with a file, a subdirectory, an in-bundle link, an escaping link, and a
    /// dependency link (dangling on the host, as in a real run).
    fn bundle() -> (tempfile::TempDir, PathBuf) {
        let outer = tempfile::tempdir().unwrap();
        let b = outer.path().join("0xabc");
        fs::create_dir_all(b.join("sub/deeper")).unwrap();
        fs::write(b.join("stdout"), "first\n").unwrap();
        fs::write(b.join("sub/f.txt"), "in sub\n").unwrap();
        fs::write(b.join("sub/deeper/g"), "g").unwrap();
        fs::write(outer.path().join("secret"), "host secret").unwrap();
        symlink("sub", b.join("alias")).unwrap();
        symlink("../secret", b.join("evil")).unwrap();
        symlink("..", b.join("up")).unwrap();
        symlink("/etc", b.join("etc")).unwrap();
        symlink("/0xabc_dependencies/dep", b.join("dep")).unwrap();
        (outer, b)
    }

    fn info(t: &Target, path: &str, depth: u64) -> Result<Value, Failure> {
        get_target_info(&Bundle::open(t)?, path, depth)
    }

    fn names(v: &Value) -> Vec<String> {
        let mut n: Vec<String> = v["contents"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c["name"].as_str().unwrap().to_owned())
            .collect();
        n.sort();
        n
    }

    #[test]
    fn normalize_like_normpath() {
        let n = |s| normalize(s).map(|v| join(&v).display().to_string());
        assert_eq!(n(""), Some("".into()));
        assert_eq!(n("."), Some("".into()));
        assert_eq!(n("a/./b/"), Some("a/b".into()));
        assert_eq!(n("a/../b"), Some("b".into()));
        assert_eq!(n("/etc/passwd"), Some("etc/passwd".into()));
        assert_eq!(n(".."), None);
        assert_eq!(n("a/../../b"), None);
    }

    #[test]
    fn target_info_shapes() {
        let (_o, b) = bundle();
        let t = target(&b, &["dep"]);
        let root = info(&t, "", 1).unwrap();
        assert_eq!(root["name"], "0xabc");
        assert_eq!(root["type"], "directory");
        assert_eq!(
            root["resolved_target"],
            json!({"bundle_uuid": "0xabc", "subpath": ""})
        );
        // The dependency is hidden at the root; everything else is listed, links as links.
        assert_eq!(
            names(&root),
            ["alias", "etc", "evil", "stdout", "sub", "up"]
        );
        let contents = root["contents"].as_array().unwrap();
        let stdout = contents.iter().find(|c| c["name"] == "stdout").unwrap();
        assert_eq!(stdout["type"], "file");
        assert_eq!(stdout["size"], 6);
        assert!(stdout["perm"].as_u64().unwrap() <= 0o777);
        assert!(stdout.get("contents").is_none());
        let alias = contents.iter().find(|c| c["name"] == "alias").unwrap();
        assert_eq!(alias["type"], "link");
        assert_eq!(alias["link"], "sub");
        let sub = contents.iter().find(|c| c["name"] == "sub").unwrap();
        assert_eq!(sub["type"], "directory");
        assert!(sub.get("contents").is_none(), "depth 1 stops here");

        // Depth 0: no contents. Depth 2: one level more.
        assert!(info(&t, "", 0).unwrap().get("contents").is_none());
        let d2 = info(&t, "sub", 2).unwrap();
        assert_eq!(d2["name"], "sub");
        assert_eq!(names(&d2), ["deeper", "f.txt"]);
        let deeper = d2["contents"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["name"] == "deeper")
            .unwrap();
        assert_eq!(names(deeper), ["g"]);

        // A file, through an in-bundle link in the middle; names are lexical.
        let f = info(&t, "alias/f.txt", 0).unwrap();
        assert_eq!(f["name"], "f.txt");
        assert_eq!(f["type"], "file");
        assert_eq!(f["resolved_target"]["subpath"], "alias/f.txt");
        // A link itself is described, not followed.
        let l = info(&t, "evil", 1).unwrap();
        assert_eq!(
            (l["type"].as_str(), l["link"].as_str()),
            (Some("link"), Some("../secret"))
        );
        // "sub/.." is the root.
        assert_eq!(info(&t, "sub/..", 0).unwrap()["name"], "0xabc");
    }

    #[test]
    fn target_info_errors() {
        let (_o, b) = bundle();
        let t = target(&b, &["dep", "./other"]);
        let e = info(&t, "dep", 1).unwrap_err();
        assert_eq!(e, Failure::not_found("dep not found in bundle 0xabc"));
        assert_eq!(info(&t, "dep/", 0).unwrap_err().code, 404);
        assert_eq!(info(&t, "other", 0).unwrap_err().code, 404);
        // Inside the dependency: 404, so that the server looks in the parent bundle.
        assert_eq!(
            info(&t, "dep/x", 0).unwrap_err(),
            Failure::not_found("Path 'dep/x' in bundle 0xabc not found")
        );
        assert_eq!(
            info(&t, "../secret", 0).unwrap_err(),
            Failure::not_found("0xabc/../secret is not inside the bundle.")
        );
        for p in [
            "missing",
            "stdout/x",
            "evil/x",
            "up/secret",
            "up/0xabc/stdout",
            "etc/passwd",
        ] {
            assert_eq!(info(&t, p, 0).unwrap_err().code, 404, "{p}");
        }
        // A leading slash stays inside the bundle (like CodaLab's path joining).
        assert_eq!(info(&t, "/stdout", 0).unwrap()["type"], "file");
    }

    #[test]
    fn files_open_only_inside_and_never_through_final_links() {
        let (_o, b) = bundle();
        let t = target(&b, &["dep"]);
        let bd = Bundle::open(&t).unwrap();
        let mut s = String::new();
        bd.open_file("alias/f.txt")
            .unwrap()
            .read_to_string(&mut s)
            .unwrap();
        assert_eq!(s, "in sub\n");
        let e = bd.open_file("alias").unwrap_err();
        assert_eq!(
            e,
            Failure::not_found("0xabc/alias is a symlink and following symlinks is not allowed.")
        );
        assert_eq!(bd.open_file("evil").unwrap_err().code, 404);
        assert_eq!(bd.open_file("up/secret").unwrap_err().code, 404);
        assert_eq!(bd.open_file("sub").unwrap_err().code, 400);
        assert_eq!(bd.open_file("nope").unwrap_err().code, 404);
        nix::unistd::mkfifo(&b.join("fifo"), Mode::from_bits_truncate(0o600)).unwrap();
        assert_eq!(bd.open_file("fifo").unwrap_err().code, 400);
        assert_eq!(bd.open_directory("stdout").unwrap_err().code, 400);
        assert_eq!(bd.open_directory("alias").unwrap_err().code, 404);
        assert!(bd.open_directory("").unwrap().1);
        assert!(!bd.open_directory("./sub").unwrap().1);
    }

    #[test]
    fn directory_stream_excludes_dependencies_at_the_root_only() {
        let (_o, b) = bundle();
        fs::create_dir_all(b.join("sub/dep")).unwrap();
        fs::create_dir_all(b.join(".git/objects")).unwrap();
        fs::write(b.join("sub/._junk"), "x").unwrap();
        nix::unistd::mkfifo(&b.join("fifo"), Mode::from_bits_truncate(0o600)).unwrap();
        let t = target(&b, &["dep"]);
        let bd = Bundle::open(&t).unwrap();
        let (fd, root) = bd.open_directory("").unwrap();
        assert!(root);
        let bytes = write_tar_gz(fd, &bd.dependency_set(), Vec::new()).unwrap();
        let mut ar = tar::Archive::new(GzDecoder::new(&bytes[..]));
        let mut entries: Vec<(String, tar::EntryType)> = Vec::new();
        let mut content = HashMap::new();
        for e in ar.entries().unwrap() {
            let mut e = e.unwrap();
            let p = e.path().unwrap().display().to_string();
            let mut s = String::new();
            if e.header().entry_type().is_file() {
                e.read_to_string(&mut s).unwrap();
                content.insert(p.clone(), s);
            }
            entries.push((p, e.header().entry_type()));
        }
        let names: Vec<&str> = entries.iter().map(|(p, _)| p.as_str()).collect();
        assert_eq!(
            names,
            [
                "./",
                "alias",
                "etc",
                "evil",
                "stdout",
                "sub",
                "sub/deeper",
                "sub/deeper/g",
                "sub/dep",
                "sub/f.txt",
                "up"
            ]
        );
        assert_eq!(content["stdout"], "first\n");
        assert_eq!(content["sub/deeper/g"], "g");
        assert!(entries.contains(&("evil".into(), tar::EntryType::Symlink)));
        // The secret the link points to is never archived.
        assert!(!content.values().any(|c| c.contains("host secret")));
    }
    #[test]
    fn exact_size_pads_and_cuts() {
        let mut out = Vec::new();
        ExactSize {
            inner: &b"abc"[..],
            left: 5,
        }
        .read_to_end(&mut out)
        .unwrap();
        assert_eq!(out, b"abc\0\0");
        out.clear();
        ExactSize {
            inner: &b"abcdef"[..],
            left: 2,
        }
        .read_to_end(&mut out)
        .unwrap();
        assert_eq!(out, b"ab");
    }

    fn summ(content: &[u8], h: u64, t: u64, max: u64, trunc: &str) -> String {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("f");
        fs::write(&p, content).unwrap();
        summarize(&mut File::open(&p).unwrap(), h, t, max, trunc).unwrap()
    }

    #[test]
    fn a_summary_reads_at_most_its_bound_from_each_end() {
        // Lines enough to cover the whole file are asked for; the file is larger than both
        // ends' bounds together: only the ends are read, the middle is left out.
        let line = "0123456789abcdef\n";
        let n = (2 * MAX_SUMMARY_END as usize + (1 << 20)) / line.len();
        let mut content = line.repeat(n);
        content.insert_str(0, "first\n");
        content.push_str("last\n");
        let out = summ(content.as_bytes(), 100_000_000, 100_000_000, 128, "[cut]\n");
        assert!(
            out.len() as u64 <= 2 * MAX_SUMMARY_END + 16,
            "{}",
            out.len()
        );
        assert!(out.starts_with("first\n") && out.ends_with("last\n"));
        assert_eq!(out.matches("[cut]").count(), 1);
        // A file within the bounds is still read whole, as CodaLab does.
        let small = "a\nb\nc\n";
        assert_eq!(summ(small.as_bytes(), 100_000_000, 0, 128, "..."), small);
    }

    #[test]
    fn summaries_match_codalab() {
        // Expected values from CodaLab 1.7.5's file_util.summarize_file.
        let hundred: String = (0..100).map(|i| format!("line{i}\n")).collect();
        assert_eq!(
            summ(hundred.as_bytes(), 2, 2, 10, "...\n"),
            "line0\nline1\n...\nline98\nline99\n"
        );
        assert_eq!(
            summ(b"a\r\nb\rc\x0cd\ne", 1, 1, 100, "...\n"),
            "a\n...\ne\n"
        );
        let e_acute = "é".repeat(50) + "\n";
        assert_eq!(
            summ(e_acute.repeat(20).as_bytes(), 1, 1, 20, "...\n"),
            "...\n"
        );
        // Small files: whole, with a final newline added.
        assert_eq!(summ(b"x\ny", 5, 5, 128, "--"), "x\ny\n");
        assert_eq!(summ(b"1\n2\n3\n4\n", 1, 0, 128, "--"), "1\n");
        assert_eq!(summ(b"1\n2\n3\n4\n", 0, 2, 128, "--"), "3\n4\n");
        assert_eq!(summ(b"1\n2\n3\n4\n", 1, 1, 128, "--"), "1\n--4\n");
        assert_eq!(summ(b"", 1, 1, 128, "--"), "");
        assert_eq!(summ(b"\xff\xfe\n", 1, 1, 128, "--"), "<binary>");
        // Large files: only the ends are read; a head line cut short is dropped.
        let big = "h".repeat(30) + "\n" + &"m\n".repeat(1000) + "tail-end\n";
        assert_eq!(summ(big.as_bytes(), 1, 1, 10, "..."), "...tail-end\n");
        assert_eq!(summ(big.as_bytes(), 0, 3, 10, "..."), "m\nm\ntail-end\n");
        let abx = "ab\n".repeat(40) + "xxxxx\n";
        assert_eq!(summ(abx.as_bytes(), 2, 2, 4, "~"), "ab\nab\n~xxxxx\n");
        // Deliberately not like CodaLab, which never reads the file's last byte here (and so
        // shows "tail-en"):
        let no_eol = big.trim_end();
        assert_eq!(summ(no_eol.as_bytes(), 0, 3, 10, "..."), "m\nm\ntail-end\n");
        let mut bin = vec![b'a'; 5000];
        bin[10] = 0xff;
        assert_eq!(summ(&bin, 2, 2, 100, "..."), "<binary>");
        let mb = "x\n".repeat(100) + &"é".repeat(3) + "\nlast\n";
        assert_eq!(summ(mb.as_bytes(), 0, 1, 5, ""), "last\n");
        // The tail region starting inside a multi-byte character: CodaLab says "<binary>".
        assert_eq!(summ(mb.as_bytes(), 0, 1, 6, ""), "last\n");
    }

    #[test]
    fn python_splitlines() {
        assert_eq!(
            split_lines("a\nb\r\nc\rd\x0ce\u{2028}f"),
            ["a\n", "b\r\n", "c\r", "d\x0c", "e\u{2028}", "f"]
        );
        assert_eq!(split_lines(""), Vec::<String>::new());
        assert_eq!(split_lines("\n\n"), ["\n", "\n"]);
    }

    #[test]
    fn writes_stay_inside_and_skip_dependencies() {
        let (o, b) = bundle();
        let deps = vec!["dep".to_string()];
        write_string(&b, &deps, "new.txt", b"hello").unwrap();
        assert_eq!(fs::read_to_string(b.join("new.txt")).unwrap(), "hello");
        write_string(&b, &deps, "new.txt", b"hi").unwrap();
        assert_eq!(
            fs::read_to_string(b.join("new.txt")).unwrap(),
            "hi",
            "truncated"
        );
        write_string(&b, &deps, "alias/through-link", b"x").unwrap();
        assert_eq!(fs::read_to_string(b.join("sub/through-link")).unwrap(), "x");
        for bad in [
            "dep",
            "./dep/",
            "dep/x",
            "../escape",
            "/tmp/abs",
            "evil",
            "up/escape",
            "etc/x",
            "sub",
            "",
            "nodir/x",
        ] {
            assert!(write_string(&b, &deps, bad, b"bad").is_err(), "{bad}");
        }
        assert_eq!(
            fs::read_to_string(o.path().join("secret")).unwrap(),
            "host secret"
        );
        assert!(!o.path().join("escape").exists());
        nix::unistd::mkfifo(&b.join("fifo"), Mode::from_bits_truncate(0o600)).unwrap();
        assert!(write_string(&b, &deps, "fifo", b"x").is_err());
    }

    #[tokio::test]
    async fn netcat_exchange_reads_until_close_or_quiet() {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = l.local_addr().unwrap().port();
        let server = tokio::spawn(async move {
            // First connection: answer and close. Second: answer and stay open.
            for keep_open in [false, true] {
                let (mut s, _) = l.accept().await.unwrap();
                let mut b = [0u8; 5];
                s.read_exact(&mut b).await.unwrap();
                s.write_all(&[b"got:".as_slice(), &b].concat())
                    .await
                    .unwrap();
                if keep_open {
                    tokio::time::sleep(Duration::from_secs(5)).await;
                }
            }
        });
        let far = tokio::time::Instant::now() + Duration::from_secs(30);
        let out = exchange("127.0.0.1", port, b"hello", far, Duration::from_secs(30)).await;
        assert_eq!(out.unwrap(), b"got:hello");
        let t0 = std::time::Instant::now();
        let out = exchange("127.0.0.1", port, b"again", far, Duration::from_millis(300)).await;
        assert_eq!(out.unwrap(), b"got:again");
        assert!(t0.elapsed() < Duration::from_secs(3));
        server.abort();
        // Nobody listening: an error to reply with.
        let e = exchange("127.0.0.1", port, b"x", far, NETCAT_IDLE)
            .await
            .unwrap_err();
        assert_eq!(e.code, 500);
    }

    #[tokio::test]
    async fn a_netcat_flood_is_cut_at_the_cap() {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = l.local_addr().unwrap().port();
        let server = tokio::spawn(async move {
            let (mut s, _) = l.accept().await.unwrap();
            let chunk = vec![b'y'; 1 << 20];
            while s.write_all(&chunk).await.is_ok() {}
        });
        let far = tokio::time::Instant::now() + Duration::from_secs(30);
        let e = exchange("127.0.0.1", port, b"x", far, NETCAT_IDLE)
            .await
            .unwrap_err();
        assert_eq!(e.code, 413);
        assert!(e.message.contains("larger than 16 MiB"), "{}", e.message);
        server.abort();
    }
}
