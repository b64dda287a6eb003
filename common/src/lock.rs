//! The NFS-safe lock: a hard link to a claim file, with a lease. Used by the worker's
//! dependency cache (`dependencies-lock/state.lock`) and by the manager's lease file.
//!
//! fcntl/flock locks depend on the NFS lock manager (absent with `nolock` mounts, lost on server
//! reboots, flock emulated over NLM on NFSv3), so they are not used. The lock is the classic
//! NFS-safe protocol (as in flufl.lock): write a unique claim file `<name>.claim.<instance>.<n>`,
//! `link()` it to `<name>`; the lock is ours if the link succeeds or the claim's link count
//! became 2 (a retransmitted `link` can report EEXIST although it worked). A lock whose holder is
//! dead (same boot id and pid namespace, and its pid does not exist) or older than the lease is
//! broken by renaming it away and checking that the renamed file is the stale one. A holder
//! checks [`LockGuard::still_held`] before acting on what the lock protects, so a holder frozen
//! past its lease does not overwrite newer work. On a file system that refuses hard links
//! (EPERM/EOPNOTSUPP), the lock file is created with `O_CREAT|O_EXCL` instead (atomic on NFSv3
//! and later).
//!
//! The lock file holds its holder's token, one `key=value` a line:
//! `host=…`, `boot=…`, `pidns=…`, `pid=…`, `instance=…`.

use std::fs;
use std::hash::{BuildHasher, Hasher};
use std::io::{self, Write};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// Where a process runs: its holder is certainly dead if it has our boot id and pid namespace
/// and its pid does not exist.
#[derive(Clone, Debug)]
pub struct HostIdent {
    /// The host name (`localhost` if it cannot be read).
    pub host: String,
    /// The kernel's boot id (empty if unknown: then no holder is ever known to be dead).
    pub boot: String,
    /// The pid namespace, as `/proc/self/ns/pid` links it (`pid:[…]`).
    pub pidns: String,
}

impl HostIdent {
    /// The identity of this process' host, boot and pid namespace.
    pub fn current() -> Self {
        let host = nix::unistd::gethostname()
            .map(|h| h.to_string_lossy().into_owned())
            .unwrap_or_else(|_| "localhost".into());
        let boot = fs::read_to_string("/proc/sys/kernel/random/boot_id")
            .map(|s| s.trim().to_owned())
            .unwrap_or_default();
        let pidns = fs::read_link("/proc/self/ns/pid")
            .map(|p| p.display().to_string())
            .unwrap_or_default();
        HostIdent { host, boot, pidns }
    }
}

/// 16 hex digits, different in each call and each process (not cryptographic).
pub fn random_hex() -> String {
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0),
    );
    h.write_u32(std::process::id());
    format!("{:016x}", h.finish())
}

/// A lock made of an atomically created hard link, with a lease.
pub struct LinkLock {
    path: PathBuf,
    name: String,
    lease: Duration,
    instance: String,
    ident: HostIdent,
    token: String,
    local: Mutex<()>,
    seq: AtomicU64,
    /// The file system refuses hard links: plain O_EXCL creation is used.
    pub no_links: AtomicBool,
}

/// The lock, held: dropping it releases the lock (if it is still ours) and deletes the claim.
/// It borrows its [`LinkLock`] and holds a `MutexGuard`, so it is not `Send`: take and drop it
/// on one thread (in a `spawn_blocking` closure that owns an `Arc<LinkLock>`, for instance).
pub struct LockGuard<'a> {
    lock: &'a LinkLock,
    claim: PathBuf,
    ino: u64,
    _local: MutexGuard<'a, ()>,
}

impl LockGuard<'_> {
    /// The lock file is still our claim (nobody broke it).
    pub fn still_held(&self) -> bool {
        fs::metadata(&self.lock.path).is_ok_and(|m| m.ino() == self.ino)
    }

    /// Renews the lease of a lock held for long (a lease file): sets the lock file's
    /// modification time to now, if it is still our claim. `Ok(false)` if the lock was broken.
    pub fn renew(&self) -> io::Result<bool> {
        let f = match fs::File::open(&self.lock.path) {
            Ok(f) => f,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(false),
            Err(e) => return Err(e),
        };
        // The file opened, not the path, is checked and touched: a lock that replaced ours in
        // between is left alone.
        if f.metadata()?.ino() != self.ino {
            return Ok(false);
        }
        f.set_modified(SystemTime::now())?;
        Ok(true)
    }
}

impl Drop for LockGuard<'_> {
    fn drop(&mut self) {
        if self.still_held() {
            let _ = fs::remove_file(&self.lock.path);
        }
        let _ = fs::remove_file(&self.claim);
    }
}

impl LinkLock {
    /// A lock on the file `dir/name` (`dir` is created), held by `instance` (unique to this
    /// process: it names the claim files) and broken by others when older than `lease`.
    pub fn new(dir: &Path, name: &str, instance: &str, lease: Duration) -> io::Result<Self> {
        fs::create_dir_all(dir)?;
        let ident = HostIdent::current();
        let token = format!(
            "host={}\nboot={}\npidns={}\npid={}\ninstance={}\n",
            ident.host,
            ident.boot,
            ident.pidns,
            std::process::id(),
            instance
        );
        Ok(LinkLock {
            path: dir.join(name),
            name: name.to_owned(),
            lease,
            instance: instance.to_owned(),
            ident,
            token,
            local: Mutex::new(()),
            seq: AtomicU64::new(0),
            no_links: AtomicBool::new(false),
        })
    }

    /// The lock file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// A new file name next to the lock, `<name>.<kind>.<instance>.<n>`, unique to this process.
    pub fn sibling(&self, kind: &str) -> PathBuf {
        let n = self.seq.fetch_add(1, Ordering::Relaxed);
        self.path
            .with_file_name(format!("{}.{kind}.{}.{n}", self.name, self.instance))
    }

    /// Takes the lock, breaking a stale one, waiting at most `timeout` for a live holder.
    pub fn acquire(&self, timeout: Duration) -> io::Result<LockGuard<'_>> {
        let local = self.local.lock().unwrap_or_else(|e| e.into_inner());
        let claim = self.sibling("claim");
        {
            let mut f = fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .open(&claim)?;
            f.write_all(self.token.as_bytes())?;
            f.sync_all()?;
        }
        let claim_ino = fs::metadata(&claim)?.ino();
        let start = Instant::now();
        let mut delay = Duration::from_millis(5);
        loop {
            match self.try_take(&claim, claim_ino) {
                Ok(Some(ino)) => {
                    return Ok(LockGuard {
                        lock: self,
                        claim,
                        ino,
                        _local: local,
                    })
                }
                Ok(None) => {}
                Err(e) => {
                    let _ = fs::remove_file(&claim);
                    return Err(e);
                }
            }
            match self.inspect() {
                Some((ino, Some(why))) => {
                    self.break_stale(ino, &why);
                    continue;
                }
                None => continue, // released meanwhile
                Some((_, None)) => {}
            }
            if start.elapsed() > timeout {
                let holder = fs::read_to_string(&self.path).unwrap_or_default();
                let _ = fs::remove_file(&claim);
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!(
                        "timed out waiting for the lock {} (held by {})",
                        self.path.display(),
                        holder.replace('\n', " ").trim()
                    ),
                ));
            }
            let jitter = Duration::from_micros(u64::from(
                SystemTime::now()
                    .duration_since(UNIX_EPOCH)
                    .map(|d| d.subsec_micros())
                    .unwrap_or(0)
                    % 5000,
            ));
            std::thread::sleep(delay + jitter);
            delay = (delay * 2).min(Duration::from_millis(200));
        }
    }

    /// One attempt at taking the lock: the inode of the lock file if it is ours now.
    pub fn try_take(&self, claim: &Path, claim_ino: u64) -> io::Result<Option<u64>> {
        if !self.no_links.load(Ordering::Relaxed) {
            match fs::hard_link(claim, &self.path) {
                Ok(()) => return Ok(Some(claim_ino)),
                // A retransmitted link() can fail although it worked.
                Err(_) if fs::metadata(claim).is_ok_and(|m| m.nlink() >= 2) => {
                    return Ok(Some(claim_ino))
                }
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => return Ok(None),
                Err(e)
                    if [errno_eperm(), errno_eopnotsupp()]
                        .contains(&e.raw_os_error().unwrap_or(0)) =>
                {
                    tracing::warn!(
                        "{} does not support hard links ({e}); locking with O_EXCL instead",
                        self.path.display()
                    );
                    self.no_links.store(true, Ordering::Relaxed);
                }
                Err(e) => return Err(e),
            }
        }
        match fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&self.path)
        {
            Ok(mut f) => {
                f.write_all(self.token.as_bytes())?;
                f.sync_all()?;
                Ok(Some(f.metadata()?.ino()))
            }
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// The current lock's inode and, if it is stale, why. `None` if there is no lock.
    pub fn inspect(&self) -> Option<(u64, Option<String>)> {
        let meta = fs::metadata(&self.path).ok()?;
        let content = fs::read_to_string(&self.path).unwrap_or_default();
        let field = |k: &str| {
            content
                .lines()
                .find_map(|l| l.strip_prefix(k).and_then(|v| v.strip_prefix('=')))
                .unwrap_or("")
                .to_owned()
        };
        let age = meta
            .modified()
            .ok()
            .and_then(|m| SystemTime::now().duration_since(m).ok())
            .unwrap_or_default();
        if age > self.lease {
            return Some((
                meta.ino(),
                Some(format!(
                    "older than {}s ({content:?})",
                    self.lease.as_secs()
                )),
            ));
        }
        let same_host = !self.ident.boot.is_empty()
            && field("boot") == self.ident.boot
            && field("pidns") == self.ident.pidns;
        if same_host {
            if let Ok(pid) = field("pid").parse::<i32>() {
                if pid > 0
                    && pid != std::process::id() as i32
                    && nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), None)
                        == Err(nix::errno::Errno::ESRCH)
                {
                    return Some((meta.ino(), Some(format!("its holder (pid {pid}) is dead"))));
                }
            }
        }
        Some((meta.ino(), None))
    }

    /// Removes a stale lock, making sure not to remove a fresh one that replaced it.
    pub fn break_stale(&self, stale_ino: u64, why: &str) {
        let broken = self.sibling("broken");
        if fs::rename(&self.path, &broken).is_err() {
            return;
        }
        if fs::metadata(&broken).is_ok_and(|m| m.ino() == stale_ino) {
            tracing::warn!("breaking the stale lock {}: {why}", self.path.display());
        } else {
            // Someone took the lock in between: put theirs back.
            let _ = fs::hard_link(&broken, &self.path);
        }
        let _ = fs::remove_file(&broken);
    }

    /// Deletes claim files left by dead processes.
    pub fn sweep(&self) {
        let Ok(dir) = fs::read_dir(self.path.parent().unwrap_or(Path::new("."))) else {
            return;
        };
        let lock_ino = fs::metadata(&self.path).map(|m| m.ino()).ok();
        let prefix = format!("{}.", self.name);
        for e in dir.flatten() {
            let name = e.file_name();
            if !name.to_string_lossy().starts_with(&prefix) {
                continue;
            }
            let Ok(meta) = e.metadata() else { continue };
            let old = meta
                .modified()
                .ok()
                .and_then(|m| SystemTime::now().duration_since(m).ok())
                .is_some_and(|age| age > self.lease * 2);
            if old && Some(meta.ino()) != lock_ino {
                let _ = fs::remove_file(e.path());
            }
        }
    }
}

fn errno_eperm() -> i32 {
    nix::errno::Errno::EPERM as i32
}

fn errno_eopnotsupp() -> i32 {
    nix::errno::Errno::EOPNOTSUPP as i32
}

#[cfg(test)]
mod tests;
