//! `cl-worker`: a drop-in replacement for CodaLab's Python worker.

use std::process::ExitCode;

use clap::Parser;
use codalab_worker::cli::Args;

fn main() -> ExitCode {
    let args = Args::parse();
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
