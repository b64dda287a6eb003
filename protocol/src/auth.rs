//! Worker credentials: `--password-file` (mode 600) or `CODALAB_USERNAME`/`CODALAB_PASSWORD`.
//!
//! A password file is either one file (the username on line 1, the password on line 2) or a
//! directory holding the files `username` and `password`: a Kubernetes Secret mounted as a
//! volume.

use std::fmt;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;

/// A username and password. `Debug` never shows the password.
#[derive(Clone, PartialEq, Eq)]
pub struct Credentials {
    pub username: String,
    pub password: String,
}

impl fmt::Debug for Credentials {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Credentials")
            .field("username", &self.username)
            .field("password", &"<redacted>")
            .finish()
    }
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum CredentialsError {
    #[error("cannot read password file {path}: {error}")]
    Unreadable { path: String, error: String },
    #[error(
        "password file {path} is readable by group or others (mode {mode:o}); run `chmod 600 {path}`"
    )]
    Permissive { path: String, mode: u32 },
    #[error("password file {path} must hold the username on line 1 and the password on line 2")]
    Malformed { path: String },
    #[error("password directory {path} must hold non-empty files `username` and `password`")]
    MalformedDir { path: String },
    #[error("no credentials: pass --password-file or set CODALAB_USERNAME and CODALAB_PASSWORD")]
    Missing,
}

/// The permission bits of a file holding a credential when they let its group or others in
/// (any of 0o077), `None` when only its owner may use it. Password files and key files are
/// refused on `Some`.
pub fn permissive_mode(path: &Path) -> std::io::Result<Option<u32>> {
    let mode = std::fs::metadata(path)?.permissions().mode() & 0o777;
    Ok((mode & 0o077 != 0).then_some(mode))
}

impl Credentials {
    /// Reads a password file: line 1 the username, line 2 the password. Refuses a file with any
    /// group or other permission bit set.
    pub fn from_password_file(path: &Path) -> Result<Self, CredentialsError> {
        if path.is_dir() {
            return Self::from_password_dir(path);
        }
        let shown = path.display().to_string();
        let permissive = permissive_mode(path).map_err(|e| CredentialsError::Unreadable {
            path: shown.clone(),
            error: e.to_string(),
        })?;
        if let Some(mode) = permissive {
            return Err(CredentialsError::Permissive { path: shown, mode });
        }
        let text = std::fs::read_to_string(path).map_err(|e| CredentialsError::Unreadable {
            path: shown.clone(),
            error: e.to_string(),
        })?;
        let mut lines = text.lines();
        let username = lines.next().unwrap_or("").trim().to_owned();
        let password = lines.next().unwrap_or("").trim_end_matches('\r').to_owned();
        if username.is_empty() || password.is_empty() {
            return Err(CredentialsError::Malformed { path: shown });
        }
        Ok(Credentials { username, password })
    }

    /// Reads a directory with the files `username` and `password` (a mounted Kubernetes
    /// Secret). Neither may be readable by others or writable by its group; group read is
    /// allowed, since a Secret volume with `fsGroup` is group-readable (the kubelet turns
    /// mode 0400 into 0440 so that a non-root process can read it).
    fn from_password_dir(dir: &Path) -> Result<Self, CredentialsError> {
        let read = |name: &str| -> Result<String, CredentialsError> {
            let path = dir.join(name);
            let shown = path.display().to_string();
            let unreadable = |e: std::io::Error| CredentialsError::Unreadable {
                path: shown.clone(),
                error: e.to_string(),
            };
            // The file itself (a Secret volume's files are symlinks into `..data`).
            let mode = std::fs::metadata(&path)
                .map_err(unreadable)?
                .permissions()
                .mode()
                & 0o777;
            if mode & 0o037 != 0 {
                return Err(CredentialsError::Permissive {
                    path: shown.clone(),
                    mode,
                });
            }
            std::fs::read_to_string(&path).map_err(unreadable)
        };
        let username = read("username")?.trim().to_owned();
        let password = read("password")?.trim_end_matches(['\n', '\r']).to_owned();
        if username.is_empty() || password.is_empty() {
            return Err(CredentialsError::MalformedDir {
                path: dir.display().to_string(),
            });
        }
        Ok(Credentials { username, password })
    }

    /// Reads `CODALAB_USERNAME` and `CODALAB_PASSWORD` through `lookup` (the process environment
    /// in production).
    pub fn from_env_with(lookup: impl Fn(&str) -> Option<String>) -> Option<Self> {
        let username = lookup("CODALAB_USERNAME").filter(|s| !s.is_empty())?;
        let password = lookup("CODALAB_PASSWORD").filter(|s| !s.is_empty())?;
        Some(Credentials { username, password })
    }

    /// The worker's order: the password file if given, else the environment.
    pub fn resolve(password_file: Option<&Path>) -> Result<Self, CredentialsError> {
        match password_file {
            Some(p) => Self::from_password_file(p),
            None => Self::from_env_with(|k| std::env::var(k).ok()).ok_or(CredentialsError::Missing),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;

    fn write(mode: u32, text: &str) -> tempfile::NamedTempFile {
        let f = tempfile::NamedTempFile::new().unwrap();
        fs::write(f.path(), text).unwrap();
        fs::set_permissions(f.path(), fs::Permissions::from_mode(mode)).unwrap();
        f
    }

    #[test]
    fn reads_mode_600_file() {
        let f = write(0o600, "alice\ns3cret pass\n");
        let c = Credentials::from_password_file(f.path()).unwrap();
        assert_eq!(c.username, "alice");
        assert_eq!(c.password, "s3cret pass");
        assert!(!format!("{c:?}").contains("s3cret"));
    }

    #[test]
    fn refuses_group_or_other_readable() {
        for mode in [0o640, 0o604, 0o644, 0o660] {
            let f = write(mode, "alice\npw\n");
            let e = Credentials::from_password_file(f.path()).unwrap_err();
            assert!(matches!(e, CredentialsError::Permissive { .. }), "{mode:o}");
            assert!(e.to_string().contains("chmod 600"));
        }
    }

    #[test]
    fn refuses_incomplete_file() {
        let f = write(0o600, "alice\n");
        assert!(matches!(
            Credentials::from_password_file(f.path()),
            Err(CredentialsError::Malformed { .. })
        ));
    }

    #[test]
    fn reads_a_mounted_secret_directory() {
        let d = tempfile::tempdir().unwrap();
        let data = d.path().join("..data");
        fs::create_dir(&data).unwrap();
        for (k, v) in [("username", "alice"), ("password", "p w\n")] {
            fs::write(data.join(k), v).unwrap();
            fs::set_permissions(data.join(k), fs::Permissions::from_mode(0o400)).unwrap();
            std::os::unix::fs::symlink(format!("..data/{k}"), d.path().join(k)).unwrap();
        }
        let c = Credentials::from_password_file(d.path()).unwrap();
        assert_eq!(c.username, "alice");
        assert_eq!(c.password, "p w");
        // fsGroup makes a Secret's files group-readable.
        fs::set_permissions(data.join("password"), fs::Permissions::from_mode(0o440)).unwrap();
        assert!(Credentials::from_password_file(d.path()).is_ok());
        fs::set_permissions(data.join("password"), fs::Permissions::from_mode(0o644)).unwrap();
        assert!(matches!(
            Credentials::from_password_file(d.path()),
            Err(CredentialsError::Permissive { .. })
        ));
        fs::remove_file(d.path().join("password")).unwrap();
        assert!(matches!(
            Credentials::from_password_file(d.path()),
            Err(CredentialsError::Unreadable { .. })
        ));
    }

    #[test]
    fn env_needs_both() {
        let env = |k: &str| match k {
            "CODALAB_USERNAME" => Some("bob".to_string()),
            "CODALAB_PASSWORD" => Some("pw".to_string()),
            _ => None,
        };
        assert_eq!(
            Credentials::from_env_with(env).unwrap().username,
            "bob".to_string()
        );
        assert!(
            Credentials::from_env_with(|k| (k == "CODALAB_USERNAME").then(|| "bob".into()))
                .is_none()
        );
    }
}
