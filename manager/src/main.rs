//! `cl-worker-manager`: watches a CodaLab server for staged bundles and launches `cl-worker`s
//! on a backend, as the pure policy of [`manager::policy`] decides.

use std::process::ExitCode;
use std::time::Duration;

use clap::{CommandFactory, Parser};
use manager::app::run;
use manager::cli::{BackendCommand, Cli, StatusArgs};
use manager::control::Exit;

fn main() -> ExitCode {
    let cli = Cli::parse();
    if let Some(BackendCommand::Status(args)) = &cli.backend {
        return status(args, cli.global.metrics_addr);
    }
    if let Some(BackendCommand::Docs(docs)) = &cli.backend {
        return match docs.write(Cli::command(), &mut std::io::stdout()) {
            // A pipe closed early (`| head`) is not a failure.
            Ok(()) => ExitCode::SUCCESS,
            Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("cl-worker-manager: {e}");
                ExitCode::FAILURE
            }
        };
    }
    common::process::init_logging(
        &[
            "cl_worker_manager",
            "manager",
            "backends",
            "protocol",
            "common",
        ],
        cli.global.verbose,
        cli.global.log_format,
    );
    let Some(rt) = common::process::runtime("cl-worker-manager") else {
        return ExitCode::FAILURE;
    };
    let result = rt.block_on(run(cli));
    // Workers are in their own process groups and outlive the manager; nothing to wait for.
    rt.shutdown_timeout(Duration::from_secs(2));
    match result {
        Ok(Exit::Stopped) => ExitCode::SUCCESS,
        Ok(Exit::Restart) => restart(),
        Ok(Exit::TooManyFailures(msg)) => {
            tracing::error!("{msg}; exiting");
            ExitCode::FAILURE
        }
        Err(e) => {
            tracing::error!("{e:#}");
            ExitCode::FAILURE
        }
    }
}

/// `cl-worker-manager status [URL]`: a running manager's status as a table (or JSON); the exit
/// code says whether it is healthy (see [`manager::status::exit`]).
fn status(args: &StatusArgs, metrics_addr: Option<std::net::SocketAddr>) -> ExitCode {
    let url = args.url(metrics_addr);
    let Some(rt) = common::process::runtime("cl-worker-manager status") else {
        return ExitCode::from(manager::status::exit::CANNOT_START);
    };
    let fetched = rt.block_on(manager::status::fetch(
        &url,
        Duration::from_secs(args.timeout.max(1)),
    ));
    match fetched {
        Ok(s) => {
            if args.json {
                println!("{}", serde_json::to_string_pretty(&s).unwrap_or_default());
            } else {
                print!("{}", manager::status::render_table(&s, common::now_unix()));
                if args.bundles {
                    print!("{}", s.bundles_table());
                }
            }
            ExitCode::from(s.exit_code())
        }
        Err(e) => {
            eprintln!("cl-worker-manager status: {e}");
            ExitCode::from(e.exit_code())
        }
    }
}

/// `--restart-after-seconds`: replace this process with a fresh copy of itself (same pid, so
/// local workers stay its children; every descriptor is close-on-exec).
fn restart() -> ExitCode {
    use std::os::unix::process::CommandExt;
    let exe = match std::env::current_exe() {
        Ok(p) => p,
        Err(e) => {
            tracing::error!("cannot restart: {e}");
            return ExitCode::FAILURE;
        }
    };
    let e = std::process::Command::new(exe)
        .args(std::env::args_os().skip(1))
        .exec();
    tracing::error!("cannot restart: {e}");
    ExitCode::FAILURE
}
