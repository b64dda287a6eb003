//! `cl-worker`: a drop-in replacement for CodaLab's Python worker.

use std::process::ExitCode;

use clap::{CommandFactory, Parser};
use codalab_worker::cli::Args;

fn main() -> ExitCode {
    let args = Args::parse();
    if let Some(docs) = &args.docs {
        return match docs.write(Args::command(), &mut std::io::stdout()) {
            // A pipe closed early (`| head`) is not a failure.
            Ok(()) => ExitCode::SUCCESS,
            Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("cl-worker: {e}");
                ExitCode::FAILURE
            }
        };
    }
    common::process::init_logging(
        &["cl_worker", "codalab_worker", "protocol", "common"],
        args.verbose,
        args.log_format,
    );
    match common::process::block_on("cl-worker", codalab_worker::run(args)) {
        Some(Ok(())) => ExitCode::SUCCESS,
        Some(Err(e)) => {
            tracing::error!("{e:#}");
            ExitCode::FAILURE
        }
        None => ExitCode::FAILURE,
    }
}
