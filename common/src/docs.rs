//! The command-line tools' own documentation: shell completion scripts and man pages, made
//! from their clap definitions (`cl-worker completions bash`, `cl-worker man`, and the same for
//! `cl-worker-manager`), as the images install them.

use std::io::Write;

use clap::Subcommand;

/// The `completions` and `man` subcommands both binaries have.
#[derive(Debug, Clone, Subcommand)]
pub enum DocCommand {
    /// Print the shell completion script (e.g. `completions bash >
    /// /usr/share/bash-completion/completions/<command>`).
    Completions {
        /// The shell: bash, elvish, fish, powershell or zsh.
        shell: clap_complete::Shell,
    },
    /// Print the man page (roff, for `man -l -` or /usr/share/man/man1/<command>.1).
    Man,
}

impl DocCommand {
    /// Writes the completion script or man page of `cmd` to `out`.
    pub fn write(&self, mut cmd: clap::Command, out: &mut dyn Write) -> std::io::Result<()> {
        match self {
            DocCommand::Completions { shell } => {
                let name = cmd.get_name().to_string();
                clap_complete::generate(*shell, &mut cmd, name, out);
                Ok(())
            }
            DocCommand::Man => clap_mangen::Man::new(cmd).render(out),
        }
    }
}

/// The version `--version` prints: the package's, with the commit it was built from.
#[macro_export]
macro_rules! version_with_commit {
    () => {
        concat!(env!("CARGO_PKG_VERSION"), " (", env!("CLW_GIT_COMMIT"), ")")
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn completions_and_a_man_page_name_every_flag() {
        let cmd = || {
            clap::Command::new("tool")
                .about("A tool.")
                .arg(clap::Arg::new("work-dir").long("work-dir"))
        };
        let mut out = Vec::new();
        DocCommand::Completions {
            shell: clap_complete::Shell::Bash,
        }
        .write(cmd(), &mut out)
        .unwrap();
        let text = String::from_utf8(out).unwrap();
        assert!(
            text.contains("--work-dir") && text.contains("complete"),
            "{text}"
        );
        let mut out = Vec::new();
        DocCommand::Man.write(cmd(), &mut out).unwrap();
        let text = String::from_utf8(out).unwrap();
        assert!(
            text.contains(".TH tool") && text.contains("work\\-dir"),
            "{text}"
        );
    }
}
