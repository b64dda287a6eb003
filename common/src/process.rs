//! Process start-up shared by both binaries: the log subscriber and the async runtime.

use std::future::Future;

/// How log lines are written: `text` (one human-readable line per event) or `json` (one JSON
/// object per line, for Loki, Elasticsearch or CloudWatch). Both carry the same fields: the
/// time, the level, the message, the event's own fields and the spans it happened in.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    #[default]
    Text,
    Json,
}

/// Installs the stderr log subscriber. `RUST_LOG` wins; otherwise everything logs at `warn`
/// and the given crates (targets) at `debug` with `verbose`, else `info`. Colours only when
/// the format is text, stderr is a terminal and `NO_COLOR` is not set: a log redirected to a
/// file, a pipe or a log collector gets plain text.
pub fn init_logging(targets: &[&str], verbose: bool, format: LogFormat) {
    let level = if verbose { "debug" } else { "info" };
    let filter = tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| {
        let mut spec = String::from("warn");
        for t in targets {
            spec.push_str(&format!(",{t}={level}"));
        }
        tracing_subscriber::EnvFilter::new(spec)
    });
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_target(false);
    match format {
        LogFormat::Text => builder.with_ansi(color()).init(),
        // `{"timestamp":…,"level":"INFO","message":…,<fields>,"spans":[…]}`.
        LogFormat::Json => builder
            .json()
            .flatten_event(true)
            .with_current_span(false)
            .with_span_list(true)
            .with_ansi(false)
            .init(),
    }
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
            // Logging is set up first: the line is JSON under --log-format json.
            tracing::error!("{program}: cannot start the async runtime: {e}");
            None
        }
    }
}

/// Runs `fut` to completion on [`runtime`]; `None` if the runtime could not start.
pub fn block_on<T>(program: &str, fut: impl Future<Output = T>) -> Option<T> {
    runtime(program).map(|rt| rt.block_on(fut))
}
