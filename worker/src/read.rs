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

use std::collections::{HashSet, VecDeque};
use std::ffi::{CStr, OsStr, OsString};
use std::fs::File;
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::os::fd::{IntoRawFd, OwnedFd};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::time::Duration;

use flate2::write::GzEncoder;
use flate2::Compression;
use nix::errno::Errno;
use nix::fcntl::{openat, readlinkat, AtFlags, OFlag};
use nix::libc;
use nix::sys::stat::{fstat, fstatat, FileStat, Mode};
use protocol::{ReadArgs, RestClient, ServerMessage};
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::mpsc;

use crate::archive::{ChannelWriter, Excludes};
use crate::runtime::BundleRuntime;

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

/// Handles one `read`, `netcat` or `write` message in a task of its own, so that the event loop
/// never waits on it. `target` is `None` when the run is unknown.
pub fn spawn<R: BundleRuntime>(
    client: RestClient,
    runtime: R,
    worker_id: String,
    target: Option<Target>,
    message: ServerMessage,
) {
    tokio::spawn(async move {
        match message {
            ServerMessage::Read {
                socket_id,
                uuid,
                path,
                read_args,
            } => {
                let reply = match target {
                    None => Reply::Error(Failure::internal(NO_LONGER_RUNNING)),
                    Some(t) => read(t, path.clone(), read_args.clone()).await,
                };
                reply.log(&format!("read {:?} of {uuid}/{path}", read_args.kind));
                send(&client, &worker_id, socket_id, &uuid, reply).await;
            }
            ServerMessage::Netcat {
                socket_id,
                uuid,
                port,
                message,
            } => {
                let reply = match target {
                    None => Reply::Error(Failure::internal(NO_LONGER_RUNNING)),
                    Some(t) => match netcat(&runtime, &t, port, message.as_bytes()).await {
                        Ok(bytes) => Reply::Data(reqwest::Body::from(bytes)),
                        Err(f) => Reply::Error(f),
                    },
                };
                reply.log(&format!("netcat {uuid}:{port}"));
                send(&client, &worker_id, socket_id, &uuid, reply).await;
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
                let r = tokio::task::spawn_blocking(move || {
                    write_string(&t.bundle_path, &t.dependency_paths, &sp, string.as_bytes())
                })
                .await
                .unwrap_or_else(|e| Err(format!("write task failed: {e}")));
                match r {
                    Ok(()) => tracing::info!("wrote {uuid}/{subpath}"),
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
                    write_tar_gz(dir, &deps, w).map(drop)
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

// ------------------------------------------------------------------------------------------
// Paths
// ------------------------------------------------------------------------------------------

/// Lexically normalises a subpath like `os.path.normpath` on `bundle + "/" + subpath`: empty and
/// `.` components go, `..` removes the previous one. A leading `/` does not make the path
/// absolute (it stays inside the bundle). `None` if `..` climbs above the bundle.
pub fn normalize(subpath: &str) -> Option<Vec<OsString>> {
    let mut out: Vec<OsString> = Vec::new();
    for c in subpath.split('/') {
        match c {
            "" | "." => {}
            ".." => {
                out.pop()?;
            }
            c => out.push(OsString::from(c)),
        }
    }
    Some(out)
}

fn join(comps: &[OsString]) -> PathBuf {
    comps.iter().collect()
}

/// Where a resolved path ends.
enum Node {
    /// The path names a directory reached through the walk itself (the bundle root, or a path
    /// whose last step came from a link target's `..`).
    Dir(OwnedFd),
    /// Entry `name` of directory `parent` (not looked at: it may not exist, or be a link).
    Entry { parent: OwnedFd, name: OsString },
}

#[derive(Debug, PartialEq)]
enum Resolve {
    /// Leaves the bundle (through `..` or a link).
    Escapes,
    /// A component is missing or is not a directory.
    Missing,
    Io(Errno),
}

const MAX_LINKS: usize = 40;

fn dir_path_flags() -> OFlag {
    OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC
}

fn is_type(st: &FileStat, kind: libc::mode_t) -> bool {
    st.st_mode & libc::S_IFMT == kind
}

/// Walks `comps` from the directory `root`, never leaving it. Links on the way are followed
/// when relative and staying inside; the last component is followed only with `follow_last`.
fn resolve(root: &OwnedFd, comps: &[OsString], follow_last: bool) -> Result<Node, Resolve> {
    let mut stack: Vec<OwnedFd> = vec![root.try_clone().map_err(io_errno)?];
    let mut queue: VecDeque<OsString> = comps.iter().cloned().collect();
    let mut links = 0;
    while let Some(name) = queue.pop_front() {
        let b = name.as_bytes();
        if b.is_empty() || b == b"." {
            continue;
        }
        if b == b".." {
            if stack.len() == 1 {
                return Err(Resolve::Escapes);
            }
            stack.pop();
            continue;
        }
        let top = stack.last().unwrap();
        let last = queue.is_empty();
        if last && !follow_last {
            return Ok(Node::Entry {
                parent: top.try_clone().map_err(io_errno)?,
                name,
            });
        }
        let st = match fstatat(top, name.as_os_str(), AtFlags::AT_SYMLINK_NOFOLLOW) {
            Ok(st) => st,
            Err(Errno::ENOENT) if last => {
                return Ok(Node::Entry {
                    parent: top.try_clone().map_err(io_errno)?,
                    name,
                })
            }
            Err(Errno::ENOENT | Errno::ENOTDIR) => return Err(Resolve::Missing),
            Err(e) => return Err(Resolve::Io(e)),
        };
        if is_type(&st, libc::S_IFLNK) {
            links += 1;
            if links > MAX_LINKS {
                return Err(Resolve::Io(Errno::ELOOP));
            }
            let target = readlinkat(top, name.as_os_str()).map_err(Resolve::Io)?;
            let tb = target.as_bytes();
            if tb.starts_with(b"/") {
                return Err(Resolve::Escapes);
            }
            for part in tb.split(|&c| c == b'/').rev() {
                queue.push_front(OsString::from_vec(part.to_vec()));
            }
            continue;
        }
        if last {
            return Ok(Node::Entry {
                parent: top.try_clone().map_err(io_errno)?,
                name,
            });
        }
        if !is_type(&st, libc::S_IFDIR) {
            return Err(Resolve::Missing);
        }
        match openat(top, name.as_os_str(), dir_path_flags(), Mode::empty()) {
            Ok(fd) => stack.push(fd),
            // Replaced meanwhile (by a link, say): treat as absent.
            Err(Errno::ENOENT | Errno::ENOTDIR | Errno::ELOOP) => return Err(Resolve::Missing),
            Err(e) => return Err(Resolve::Io(e)),
        }
    }
    Ok(Node::Dir(stack.pop().unwrap()))
}

fn io_errno(e: io::Error) -> Resolve {
    Resolve::Io(Errno::from_raw(e.raw_os_error().unwrap_or(libc::EIO)))
}

/// Opens a directory for listing (`fd` may be an `O_PATH` descriptor).
fn list_dir(fd: &OwnedFd) -> io::Result<Vec<OsString>> {
    let dir = openat(
        fd,
        ".",
        OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
        Mode::empty(),
    )?;
    let raw = dir.into_raw_fd();
    // SAFETY: `raw` is an open directory descriptor whose ownership passes to the DIR stream,
    // which closedir releases; entries are copied out before the next readdir call.
    unsafe {
        let dp = libc::fdopendir(raw);
        if dp.is_null() {
            let e = io::Error::last_os_error();
            libc::close(raw);
            return Err(e);
        }
        let mut names = Vec::new();
        let result = loop {
            Errno::clear();
            let ent = libc::readdir(dp);
            if ent.is_null() {
                match Errno::last_raw() {
                    0 => break Ok(()),
                    e => break Err(io::Error::from_raw_os_error(e)),
                }
            }
            let name = CStr::from_ptr((*ent).d_name.as_ptr()).to_bytes();
            if name != b"." && name != b".." {
                names.push(OsString::from_vec(name.to_vec()));
            }
        };
        libc::closedir(dp);
        result.map(|()| {
            names.sort();
            names
        })
    }
}

/// Opens a regular file entry for reading; refuses anything else without opening it.
fn open_regular_at(parent: &OwnedFd, name: &OsStr) -> io::Result<Option<File>> {
    let fd = openat(
        parent,
        name,
        OFlag::O_RDONLY
            | OFlag::O_NOFOLLOW
            | OFlag::O_NONBLOCK
            | OFlag::O_NOCTTY
            | OFlag::O_CLOEXEC,
        Mode::empty(),
    )?;
    if !is_type(&fstat(&fd)?, libc::S_IFREG) {
        return Ok(None);
    }
    Ok(Some(File::from(fd)))
}

/// The bundle directory of a run, opened.
struct Bundle<'a> {
    t: &'a Target,
    root: OwnedFd,
    deps: Vec<Vec<OsString>>,
}

impl<'a> Bundle<'a> {
    fn open(t: &'a Target) -> Result<Self, Failure> {
        let root = openat(
            nix::fcntl::AT_FDCWD,
            t.bundle_path.as_path(),
            OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
            Mode::empty(),
        )
        .map_err(|e| match e {
            Errno::ENOENT => Failure::not_found(format!("Path '' in bundle {} not found", t.uuid)),
            e => Failure::internal(format!("cannot open the bundle directory: {e}")),
        })?;
        let deps = t
            .dependency_paths
            .iter()
            .filter_map(|p| normalize(p))
            .filter(|p| !p.is_empty())
            .collect();
        Ok(Bundle { t, root, deps })
    }

    fn name(&self) -> String {
        std::fs::canonicalize(&self.t.bundle_path)
            .unwrap_or_else(|_| self.t.bundle_path.clone())
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default()
    }

    fn error_path(&self, subpath: &str) -> String {
        if subpath.is_empty() {
            self.t.uuid.clone()
        } else {
            format!("{}/{}", self.t.uuid, subpath)
        }
    }

    fn not_found(&self, subpath: &str) -> Failure {
        Failure::not_found(format!(
            "Path '{subpath}' in bundle {} not found",
            self.t.uuid
        ))
    }

    fn dependency_set(&self) -> HashSet<PathBuf> {
        self.deps.iter().map(|d| join(d)).collect()
    }

    fn is_dependency(&self, comps: &[OsString]) -> bool {
        self.deps.iter().any(|d| d == comps)
    }

    /// Normalised components of `subpath`, or the "not inside the bundle" 404.
    fn components(&self, subpath: &str) -> Result<Vec<OsString>, Failure> {
        normalize(subpath).ok_or_else(|| {
            Failure::not_found(format!(
                "{} is not inside the bundle.",
                self.error_path(subpath)
            ))
        })
    }

    fn resolve(&self, subpath: &str, follow_last: bool) -> Result<Node, Failure> {
        let comps = self.components(subpath)?;
        resolve(&self.root, &comps, follow_last).map_err(|e| match e {
            Resolve::Escapes | Resolve::Missing => self.not_found(subpath),
            Resolve::Io(e) => Failure::internal(format!("{}: {e}", self.error_path(subpath))),
        })
    }

    /// `lstat` of what a path names, or its 404.
    fn stat(&self, subpath: &str, node: &Node) -> Result<FileStat, Failure> {
        let r = match node {
            Node::Dir(fd) => fstat(fd),
            Node::Entry { parent, name } => {
                fstatat(parent, name.as_os_str(), AtFlags::AT_SYMLINK_NOFOLLOW)
            }
        };
        r.map_err(|e| match e {
            Errno::ENOENT | Errno::ENOTDIR => self.not_found(subpath),
            e => Failure::internal(format!("{}: {e}", self.error_path(subpath))),
        })
    }

    fn symlink_refused(&self, subpath: &str) -> Failure {
        Failure::not_found(format!(
            "{} is a symlink and following symlinks is not allowed.",
            self.error_path(subpath)
        ))
    }

    /// The directory a path names (not a link), and whether it is the bundle root.
    fn open_directory(&self, subpath: &str) -> Result<(OwnedFd, bool), Failure> {
        let at_root = self.components(subpath)?.is_empty();
        let node = self.resolve(subpath, false)?;
        let st = self.stat(subpath, &node)?;
        if is_type(&st, libc::S_IFLNK) {
            return Err(self.symlink_refused(subpath));
        }
        if !is_type(&st, libc::S_IFDIR) {
            return Err(Failure::bad_request(format!(
                "{} is not a directory",
                self.error_path(subpath)
            )));
        }
        let fd = match node {
            Node::Dir(fd) => fd,
            Node::Entry { parent, name } => {
                openat(&parent, name.as_os_str(), dir_path_flags(), Mode::empty()).map_err(|e| {
                    match e {
                        Errno::ENOENT | Errno::ENOTDIR | Errno::ELOOP => self.not_found(subpath),
                        e => Failure::internal(format!("{}: {e}", self.error_path(subpath))),
                    }
                })?
            }
        };
        Ok((fd, at_root))
    }

    /// The regular file a path names (not a link), opened for reading.
    fn open_file(&self, subpath: &str) -> Result<File, Failure> {
        self.open_file_if_present(subpath)?
            .ok_or_else(|| self.not_found(subpath))
    }

    /// Like `open_file`, but `None` when nothing is at the path (also when a link on the way
    /// leads nowhere or out of the bundle). A path that leaves the bundle through `..` is still
    /// an error.
    fn open_file_if_present(&self, subpath: &str) -> Result<Option<File>, Failure> {
        let comps = self.components(subpath)?;
        let node = match resolve(&self.root, &comps, false) {
            Ok(node) => node,
            Err(Resolve::Escapes | Resolve::Missing) => return Ok(None),
            Err(Resolve::Io(e)) => {
                return Err(Failure::internal(format!(
                    "{}: {e}",
                    self.error_path(subpath)
                )))
            }
        };
        let st = match self.stat(subpath, &node) {
            Ok(st) => st,
            Err(f) if f.code == 404 => return Ok(None),
            Err(f) => return Err(f),
        };
        if is_type(&st, libc::S_IFLNK) {
            return Err(self.symlink_refused(subpath));
        }
        let not_file = || {
            Failure::bad_request(format!(
                "{} is not a regular file",
                self.error_path(subpath)
            ))
        };
        let Node::Entry { parent, name } = node else {
            return Err(not_file());
        };
        if !is_type(&st, libc::S_IFREG) {
            return Err(not_file());
        }
        match open_regular_at(&parent, &name) {
            Ok(Some(f)) => Ok(Some(f)),
            Ok(None) => Err(not_file()),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(e) if e.raw_os_error() == Some(libc::ELOOP) => Err(self.symlink_refused(subpath)),
            Err(e) => Err(Failure::internal(format!(
                "{}: {e}",
                self.error_path(subpath)
            ))),
        }
    }
}

// ------------------------------------------------------------------------------------------
// get_target_info
// ------------------------------------------------------------------------------------------

fn get_target_info(b: &Bundle, subpath: &str, depth: u64) -> Result<Value, Failure> {
    let comps = b.components(subpath)?;
    // The server resolves dependency paths in the parent bundle itself when it gets this 404.
    if !subpath.is_empty() && b.is_dependency(&comps) {
        return Err(Failure::not_found(format!(
            "{subpath} not found in bundle {}",
            b.t.uuid
        )));
    }
    let node = b.resolve(subpath, false)?;
    let st = b.stat(subpath, &node)?;
    let name = match comps.last() {
        Some(n) => n.to_string_lossy().into_owned(),
        None => b.name(),
    };
    let mut info = match &node {
        Node::Dir(fd) => describe_dir(fd, name, &st, depth),
        Node::Entry { parent, name: n } => describe(parent, n, name, &st, depth),
    }
    .map_err(|e| Failure::internal(format!("{}: {e}", b.error_path(subpath))))?;
    if comps.is_empty() && depth > 0 {
        let hidden: HashSet<OsString> = b.deps.iter().map(|d| join(d).into_os_string()).collect();
        if let Some(Value::Array(items)) = info.get_mut("contents") {
            items.retain(|c| {
                !c.get("name")
                    .and_then(Value::as_str)
                    .is_some_and(|n| hidden.contains(OsStr::new(n)))
            });
        }
    }
    info["resolved_target"] = json!({"bundle_uuid": b.t.uuid, "subpath": subpath});
    Ok(info)
}

fn base_info(name: String, st: &FileStat, kind: &str) -> Value {
    json!({
        "name": name,
        "size": st.st_size,
        "perm": st.st_mode & 0o777,
        "type": kind,
    })
}

/// Target info of entry `name` of `parent` (links are described, not followed).
fn describe(
    parent: &OwnedFd,
    entry: &OsStr,
    name: String,
    st: &FileStat,
    depth: u64,
) -> io::Result<Value> {
    if is_type(st, libc::S_IFLNK) {
        let mut v = base_info(name, st, "link");
        let target = readlinkat(parent, entry)?;
        v["link"] = Value::from(target.to_string_lossy().into_owned());
        return Ok(v);
    }
    if is_type(st, libc::S_IFREG) {
        return Ok(base_info(name, st, "file"));
    }
    if is_type(st, libc::S_IFDIR) {
        if depth == 0 {
            return Ok(base_info(name, st, "directory"));
        }
        let fd = openat(parent, entry, dir_path_flags(), Mode::empty())?;
        return describe_dir(&fd, name, st, depth);
    }
    // FIFOs, sockets, devices: CodaLab leaves the type empty.
    Ok(base_info(name, st, ""))
}

fn describe_dir(fd: &OwnedFd, name: String, st: &FileStat, depth: u64) -> io::Result<Value> {
    let mut v = base_info(name, st, "directory");
    if depth > 0 {
        let mut contents = Vec::new();
        for child in list_dir(fd)? {
            // Entries of a running bundle come and go; skip the ones gone since the listing.
            let cst = match fstatat(fd, child.as_os_str(), AtFlags::AT_SYMLINK_NOFOLLOW) {
                Ok(s) => s,
                Err(Errno::ENOENT) => continue,
                Err(e) => return Err(e.into()),
            };
            let cname = child.to_string_lossy().into_owned();
            match describe(fd, &child, cname, &cst, depth - 1) {
                Ok(c) => contents.push(c),
                Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
                Err(e) if matches!(e.raw_os_error(), Some(libc::ENOTDIR | libc::ELOOP)) => continue,
                Err(e) => return Err(e),
            }
        }
        v["contents"] = Value::Array(contents);
    }
    Ok(v)
}

// ------------------------------------------------------------------------------------------
// stream_directory
// ------------------------------------------------------------------------------------------

/// A reader of exactly `size` bytes: the file's first bytes, then zeros if it shrank (a running
/// bundle's files change while they are archived; tar headers carry the size up front).
struct ExactSize<R> {
    inner: R,
    left: u64,
}

impl<R: Read> Read for ExactSize<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if self.left == 0 {
            return Ok(0);
        }
        let want = buf.len().min(self.left.min(usize::MAX as u64) as usize);
        let mut n = self.inner.read(&mut buf[..want])?;
        if n == 0 {
            buf[..want].fill(0);
            n = want;
        }
        self.left -= n as u64;
        Ok(n)
    }
}

fn tar_header(st: &FileStat, kind: tar::EntryType, size: u64) -> tar::Header {
    let mut h = tar::Header::new_gnu();
    h.set_entry_type(kind);
    h.set_mode(st.st_mode & 0o7777);
    h.set_uid(st.st_uid as u64);
    h.set_gid(st.st_gid as u64);
    h.set_mtime(st.st_mtime.max(0) as u64);
    h.set_size(size);
    h
}

/// A gzipped tar of directory `dir`, like `tar czf - -C dir .` with CodaLab's excludes:
/// `.git`, `._*` and `__MACOSX` anywhere, and the relative paths in `top_excludes`. Links are
/// stored as links; FIFOs, sockets and devices are left out.
fn write_tar_gz<W: Write>(dir: OwnedFd, top_excludes: &HashSet<PathBuf>, out: W) -> io::Result<W> {
    let ignore = Excludes::new(&ALWAYS_IGNORE.map(String::from));
    let gz = GzEncoder::new(out, Compression::fast());
    let mut builder = tar::Builder::new(gz);
    let st = fstat(&dir)?;
    let mut h = tar_header(&st, tar::EntryType::Directory, 0);
    builder.append_data(&mut h, "./", io::empty())?;
    tar_dir(&mut builder, &dir, Path::new(""), &ignore, top_excludes)?;
    builder.into_inner()?.finish()
}

fn tar_dir<W: Write>(
    builder: &mut tar::Builder<W>,
    dir: &OwnedFd,
    rel: &Path,
    ignore: &Excludes,
    top_excludes: &HashSet<PathBuf>,
) -> io::Result<()> {
    for name in list_dir(dir)? {
        let child = rel.join(&name);
        if ignore.matches(&child) || top_excludes.contains(&child) {
            continue;
        }
        let st = match fstatat(dir, name.as_os_str(), AtFlags::AT_SYMLINK_NOFOLLOW) {
            Ok(st) => st,
            Err(Errno::ENOENT) => continue,
            Err(e) => return Err(e.into()),
        };
        if is_type(&st, libc::S_IFDIR) {
            let sub = match openat(dir, name.as_os_str(), dir_path_flags(), Mode::empty()) {
                Ok(fd) => fd,
                Err(Errno::ENOENT | Errno::ENOTDIR | Errno::ELOOP) => continue,
                Err(e) => return Err(e.into()),
            };
            let mut h = tar_header(&st, tar::EntryType::Directory, 0);
            builder.append_data(&mut h, &child, io::empty())?;
            tar_dir(builder, &sub, &child, ignore, top_excludes)?;
        } else if is_type(&st, libc::S_IFREG) {
            let file = match open_regular_at(dir, &name) {
                Ok(Some(f)) => f,
                Ok(None) => continue,
                Err(e)
                    if e.kind() == io::ErrorKind::NotFound
                        || e.raw_os_error() == Some(libc::ELOOP) =>
                {
                    continue
                }
                Err(e) => return Err(e),
            };
            let fst = fstat(&file)?;
            let size = fst.st_size.max(0) as u64;
            let mut h = tar_header(&fst, tar::EntryType::Regular, size);
            let data = ExactSize {
                inner: file,
                left: size,
            };
            builder.append_data(&mut h, &child, data)?;
        } else if is_type(&st, libc::S_IFLNK) {
            let target = match readlinkat(dir, name.as_os_str()) {
                Ok(t) => t,
                Err(Errno::ENOENT | Errno::EINVAL) => continue,
                Err(e) => return Err(e.into()),
            };
            let mut h = tar_header(&st, tar::EntryType::Symlink, 0);
            builder.append_link(&mut h, &child, Path::new(&target))?;
        } else {
            tracing::debug!("not archiving special file {}", child.display());
        }
    }
    Ok(())
}

// ------------------------------------------------------------------------------------------
// summarize_file
// ------------------------------------------------------------------------------------------

pub const NONE_PLACEHOLDER: &str = "<none>";
pub const BINARY_PLACEHOLDER: &str = "<binary>";

/// Python's `str.splitlines(keepends=True)`.
fn split_lines(s: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut start = 0;
    let mut it = s.char_indices().peekable();
    while let Some((i, c)) = it.next() {
        let end = match c {
            '\r' => match it.peek() {
                Some((_, '\n')) => {
                    it.next();
                    i + 2
                }
                _ => i + 1,
            },
            '\n' | '\x0b' | '\x0c' | '\x1c' | '\x1d' | '\x1e' | '\u{85}' | '\u{2028}'
            | '\u{2029}' => i + c.len_utf8(),
            _ => continue,
        };
        out.push(s[start..end].to_owned());
        start = end;
    }
    if start < s.len() {
        out.push(s[start..].to_owned());
    }
    out
}

/// Text of `bytes` as Python's text mode reads it (UTF-8, universal newlines); `None` if it is
/// not UTF-8. An incomplete character at the end is dropped when `more` (the file goes on).
fn decode(bytes: &[u8], more: bool) -> Option<String> {
    let text = match std::str::from_utf8(bytes) {
        Ok(s) => s,
        Err(e) if more && e.error_len().is_none() => {
            std::str::from_utf8(&bytes[..e.valid_up_to()]).ok()?
        }
        Err(_) => return None,
    };
    let mut text = text.replace("\r\n", "\n");
    // A '\r' ending the buffer may be the first half of a "\r\n" pair.
    let held = more && text.ends_with('\r');
    if held {
        text.pop();
    }
    let mut text = text.replace('\r', "\n");
    if held {
        text.push('\n');
    }
    Some(text)
}

fn ends_with_newline(lines: &mut Vec<String>, drop_partial: bool) {
    if let Some(last) = lines.last_mut() {
        if !last.ends_with('\n') {
            if drop_partial {
                lines.pop();
            } else {
                last.push('\n');
            }
        }
    }
}

/// CodaLab's file summary: the first `head` and last `tail` lines with `truncation` between
/// them when lines were left out. A large file is read only near its ends (`lines ×
/// max_line_length` characters each); `<binary>` if the text read is not UTF-8.
pub fn summarize(
    file: &mut File,
    head: u64,
    tail: u64,
    max_line_length: u64,
    truncation: &str,
) -> io::Result<String> {
    let size = file.metadata()?.len();
    let (h, t) = (head as usize, tail as usize);
    let lines = if size > (head + tail).saturating_mul(max_line_length) {
        let mut head_lines = Vec::new();
        let mut tail_lines = Vec::new();
        if head > 0 {
            // Read enough bytes for head × max_line_length characters, then cut at that count.
            let chars = head.saturating_mul(max_line_length);
            let want = chars.saturating_mul(4).saturating_add(1).min(size);
            let mut buf = Vec::new();
            file.seek(SeekFrom::Start(0))?;
            (&mut *file).take(want).read_to_end(&mut buf)?;
            let Some(text) = decode(&buf, (buf.len() as u64) < size) else {
                return Ok(BINARY_PLACEHOLDER.into());
            };
            let cut = text
                .char_indices()
                .nth(chars.min(usize::MAX as u64) as usize)
                .map_or(text.len(), |(i, _)| i);
            head_lines = split_lines(&text[..cut]);
            head_lines.truncate(h);
            ends_with_newline(&mut head_lines, true);
        }
        if tail > 0 {
            // One byte more than needed: the first (partial) line is always dropped.
            let span = tail
                .saturating_mul(max_line_length)
                .saturating_add(1)
                .min(size);
            let mut buf = Vec::new();
            file.seek(SeekFrom::Start(size - span))?;
            (&mut *file).take(span).read_to_end(&mut buf)?;
            // Starting inside a multi-byte character only cuts the line dropped anyway.
            let skip = buf
                .iter()
                .take(3)
                .take_while(|&&c| c & 0xC0 == 0x80)
                .count();
            let Some(text) = decode(&buf[skip..], false) else {
                return Ok(BINARY_PLACEHOLDER.into());
            };
            let mut all = split_lines(&text);
            if !all.is_empty() {
                all.remove(0);
            }
            tail_lines = all.split_off(all.len().saturating_sub(t));
            ends_with_newline(&mut tail_lines, false);
        }
        if head > 0 && tail > 0 {
            head_lines.push(truncation.to_owned());
            head_lines.extend(tail_lines);
            head_lines
        } else if head > 0 {
            head_lines
        } else {
            tail_lines
        }
    } else {
        let mut buf = Vec::new();
        file.seek(SeekFrom::Start(0))?;
        (&mut *file).take(size).read_to_end(&mut buf)?;
        let Some(text) = decode(&buf, false) else {
            return Ok(BINARY_PLACEHOLDER.into());
        };
        let mut lines = split_lines(&text);
        ends_with_newline(&mut lines, false);
        if lines.len() > h + t {
            if head > 0 && tail > 0 {
                let mut tail_part = lines.split_off(lines.len() - t);
                lines.truncate(h);
                lines.push(truncation.to_owned());
                lines.append(&mut tail_part);
                lines
            } else if head > 0 {
                lines.truncate(h);
                lines
            } else {
                lines.split_off(lines.len() - t)
            }
        } else {
            lines
        }
    };
    Ok(lines.concat())
}

// ------------------------------------------------------------------------------------------
// netcat
// ------------------------------------------------------------------------------------------

async fn container_ip<R: BundleRuntime>(runtime: &R, t: &Target) -> Result<String, Failure> {
    let id = t.container_id.as_deref().ok_or_else(|| {
        Failure::internal(format!("The container of bundle {} is not running", t.uuid))
    })?;
    runtime
        .address(&t.uuid, id)
        .await
        .map_err(|e| Failure::internal(e.to_string()))
}

/// Sends `message` to `port` of the run's container and returns what comes back until the
/// connection closes (or goes quiet, or the deadline passes).
async fn netcat<R: BundleRuntime>(
    runtime: &R,
    t: &Target,
    port: u16,
    message: &[u8],
) -> Result<Vec<u8>, Failure> {
    let deadline = tokio::time::Instant::now() + NETCAT_DEADLINE;
    let ip = container_ip(runtime, t).await?;
    exchange(&ip, port, message, deadline, NETCAT_IDLE).await
}

async fn exchange(
    host: &str,
    port: u16,
    message: &[u8],
    deadline: tokio::time::Instant,
    idle: Duration,
) -> Result<Vec<u8>, Failure> {
    let addr = format!("{host}:{port}");
    let connect = tokio::net::TcpStream::connect(addr.as_str());
    let mut sock = match tokio::time::timeout(NETCAT_CONNECT, connect).await {
        Ok(Ok(s)) => s,
        Ok(Err(e)) => return Err(Failure::internal(format!("{e} (connecting to {addr})"))),
        Err(_) => return Err(Failure::internal(format!("timed out connecting to {addr}"))),
    };
    tokio::time::timeout_at(deadline, sock.write_all(message))
        .await
        .map_err(|_| Failure::internal(format!("timed out sending to {addr}")))?
        .map_err(|e| Failure::internal(format!("{e} (sending to {addr})")))?;
    let mut out = Vec::new();
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let until = if out.is_empty() {
            deadline
        } else {
            deadline.min(tokio::time::Instant::now() + idle)
        };
        match tokio::time::timeout_at(until, sock.read(&mut buf)).await {
            Ok(Ok(0)) => break,
            Ok(Ok(n)) => out.extend_from_slice(&buf[..n]),
            Ok(Err(e)) => {
                if out.is_empty() {
                    return Err(Failure::internal(format!("{e} (reading from {addr})")));
                }
                break;
            }
            Err(_) if out.is_empty() => {
                return Err(Failure::new(
                    504,
                    format!(
                        "No response from port {port} within {} s",
                        NETCAT_DEADLINE.as_secs()
                    ),
                ))
            }
            Err(_) => {
                tracing::debug!(
                    "netcat {addr}: connection still open, replying with {} bytes",
                    out.len()
                );
                break;
            }
        }
    }
    Ok(out)
}

// ------------------------------------------------------------------------------------------
// write
// ------------------------------------------------------------------------------------------

/// Writes `data` to `subpath` in the bundle (created or truncated). Refuses dependency paths,
/// paths leaving the bundle (also through links), and anything but regular files.
pub fn write_string(
    bundle_path: &Path,
    dependency_paths: &[String],
    subpath: &str,
    data: &[u8],
) -> Result<(), String> {
    if subpath.starts_with('/') {
        return Err("absolute paths are not allowed".into());
    }
    let comps = normalize(subpath).ok_or("the path leaves the bundle")?;
    if comps.is_empty() {
        return Err("no file name".into());
    }
    if dependency_paths
        .iter()
        .filter_map(|d| normalize(d))
        .any(|d| d == comps)
    {
        return Err("it is a dependency".into());
    }
    let root = openat(
        nix::fcntl::AT_FDCWD,
        bundle_path,
        OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| format!("cannot open the bundle directory: {e}"))?;
    let (parent, name) = match resolve(&root, &comps, true) {
        Ok(Node::Entry { parent, name }) => (parent, name),
        Ok(Node::Dir(_)) => return Err("it is a directory".into()),
        Err(Resolve::Escapes) => return Err("the path leaves the bundle".into()),
        Err(Resolve::Missing) => return Err("its directory does not exist".into()),
        Err(Resolve::Io(e)) => return Err(e.to_string()),
    };
    match fstatat(&parent, name.as_os_str(), AtFlags::AT_SYMLINK_NOFOLLOW) {
        Ok(st) if !is_type(&st, libc::S_IFREG) => return Err("not a regular file".into()),
        Ok(_) | Err(Errno::ENOENT) => {}
        Err(e) => return Err(e.to_string()),
    }
    let fd = openat(
        &parent,
        name.as_os_str(),
        OFlag::O_WRONLY
            | OFlag::O_CREAT
            | OFlag::O_NOFOLLOW
            | OFlag::O_NONBLOCK
            | OFlag::O_NOCTTY
            | OFlag::O_CLOEXEC,
        Mode::from_bits_truncate(0o666),
    )
    .map_err(|e| e.to_string())?;
    if !is_type(&fstat(&fd).map_err(|e| e.to_string())?, libc::S_IFREG) {
        return Err("not a regular file".into());
    }
    let mut f = File::from(fd);
    f.set_len(0).map_err(|e| e.to_string())?;
    f.write_all(data).map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use flate2::read::GzDecoder;
    use std::collections::HashMap;
    use std::fs;
    use std::os::unix::fs::symlink;

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
}
