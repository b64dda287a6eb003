//! Process start-up shared by both binaries: the log subscriber and the async runtime.

use std::future::Future;

/// Installs the stderr log subscriber. `RUST_LOG` wins; otherwise everything logs at `warn`
/// and the given crates (targets) at `debug` with `verbose`, else `info`. Colours only when
/// stderr is a terminal and `NO_COLOR` is not set: a log redirected to a file, a pipe or a log
/// collector gets plain text.
pub fn init_logging(targets: &[&str], verbose: bool) {
    let level = if verbose { "debug" } else { "info" };
    let filter = tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| {
        let mut spec = String::from("warn");
        for t in targets {
            spec.push_str(&format!(",{t}={level}"));
        }
        tracing_subscriber::EnvFilter::new(spec)
    });
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_target(false)
        .with_ansi(color())
        .init();
}

fn color() -> bool {
    use std::io::IsTerminal;
    std::io::stderr().is_terminal() && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty())
}

/// The multi-threaded runtime both binaries use (two threads: they are I/O bound).
pub fn runtime(program: &str) -> Option<tokio::runtime::Runtime> {
    match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(rt) => Some(rt),
        Err(e) => {
            eprintln!("{program}: cannot start the async runtime: {e}");
            None
        }
    }
}

/// Runs `fut` to completion on [`runtime`]; `None` if the runtime could not start.
pub fn block_on<T>(program: &str, fut: impl Future<Output = T>) -> Option<T> {
    runtime(program).map(|rt| rt.block_on(fut))
}
