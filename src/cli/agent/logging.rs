//! The agent's logs: JSON (or text) lines, filtered by `RUST_LOG`, with
//! the noisy libraries kept quiet unless asked for by name.

use anyhow::bail;

/// JSON (or text) logs filtered by `RUST_LOG` (default `info`).
pub(super) fn init_logging(format: &str) -> anyhow::Result<()> {
    use std::io::IsTerminal as _;
    let filter = log_filter(&std::env::var("RUST_LOG").unwrap_or_default());
    let ansi = colours(
        format,
        std::io::stdout().is_terminal(),
        std::env::var_os("NO_COLOR").is_some_and(|v| !v.is_empty()),
    );
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(ansi);
    let result = match format {
        // Every line inside a reconcile carries the whole span list, so the
        // reconcile span's env, cluster and commit are on it even when a
        // nested span (a node's cordon, say) is the current one.
        "json" => builder
            .json()
            .with_current_span(false)
            .with_span_list(true)
            .try_init(),
        "text" => builder.try_init(),
        other => bail!("--log-format: expected json or text, got {other:?}"),
    };
    result.map_err(|e| anyhow::anyhow!("initialising logging: {e}"))
}

/// Whether log lines carry terminal colours: text logs on a terminal only
/// (and not under `NO_COLOR`); never JSON, never a pipe or a file, where
/// the escape sequences end up in a log store as `\u001b[32m`.
fn colours(format: &str, terminal: bool, no_color: bool) -> bool {
    format == "text" && terminal && !no_color
}

/// The log filter for `RUST_LOG` = `spec` (`info` when empty or invalid).
///
/// Two libraries are quieter than `spec` says unless it names them: kube's
/// client logs every failed request (`kube_client::client`), which during
/// an API server outage is a line per retry, while drover logs each kind of
/// failure itself, once a minute with a count; and notify's inotify backend
/// logs "unable to remove watch descriptor" at info for every file a config
/// change replaces (the watch went with the file), at the shipped
/// `RUST_LOG=info` too.
fn log_filter(spec: &str) -> tracing_subscriber::EnvFilter {
    use tracing_subscriber::EnvFilter;
    let mut filter = match spec.trim() {
        "" => EnvFilter::new("info"),
        s => EnvFilter::try_new(s).unwrap_or_else(|_| EnvFilter::new("info")),
    };
    let mut quiet = Vec::new();
    if !spec.contains("kube_client") {
        quiet.extend([
            "kube_client::client::builder=off",
            "kube_client::client=error",
        ]);
    }
    if !spec.contains("notify") {
        quiet.push("notify=warn");
    }
    for q in quiet {
        if let Ok(d) = q.parse() {
            filter = filter.add_directive(d);
        }
    }
    filter
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What `filter` lets through of one event per (target, level).
    fn passes(spec: &str, target_info: bool) -> Vec<String> {
        use std::sync::{Arc, Mutex};
        use tracing_subscriber::layer::SubscriberExt as _;
        #[derive(Clone, Default)]
        struct Buf(Arc<Mutex<Vec<u8>>>);
        impl std::io::Write for Buf {
            fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
                self.0.lock().unwrap().extend_from_slice(b);
                Ok(b.len())
            }
            fn flush(&mut self) -> std::io::Result<()> {
                Ok(())
            }
        }
        let buf = Buf::default();
        let writer = buf.clone();
        let subscriber = tracing_subscriber::registry()
            .with(log_filter(spec))
            .with(tracing_subscriber::fmt::layer().with_writer(move || writer.clone()));
        tracing::subscriber::with_default(subscriber, || {
            if target_info {
                tracing::info!(target: "notify::inotify", "unable to remove watch descriptor");
                tracing::warn!(target: "notify::inotify", "inotify queue overflow");
            }
            tracing::info!(target: "drover::agent", "reconciled");
        });
        let text = String::from_utf8(buf.0.lock().unwrap().clone()).unwrap();
        text.lines().map(str::to_owned).collect()
    }

    #[test]
    fn logs_are_coloured_only_as_text_on_a_terminal() {
        assert!(colours("text", true, false));
        assert!(!colours("text", false, false), "a pipe or a file");
        assert!(!colours("text", true, true), "NO_COLOR");
        assert!(!colours("json", true, false));
        assert!(!colours("json", false, false));
        // What a subscriber built that way writes: no escape sequence in
        // text or JSON, with a level, a span and fields (what colours them).
        use std::sync::{Arc, Mutex};
        #[derive(Clone, Default)]
        struct Buf(Arc<Mutex<Vec<u8>>>);
        impl std::io::Write for Buf {
            fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
                self.0.lock().unwrap().extend_from_slice(b);
                Ok(b.len())
            }
            fn flush(&mut self) -> std::io::Result<()> {
                Ok(())
            }
        }
        for (json, ansi) in [(false, false), (true, false), (false, true)] {
            let buf = Buf::default();
            let writer = buf.clone();
            let builder = tracing_subscriber::fmt()
                .with_ansi(ansi)
                .with_writer(move || writer.clone());
            let log = || {
                let span = tracing::info_span!("reconcile", env = "stage");
                let _e = span.enter();
                tracing::warn!(node = "n-1", "cannot cordon");
            };
            if json {
                tracing::subscriber::with_default(builder.json().finish(), log);
            } else {
                tracing::subscriber::with_default(builder.finish(), log);
            }
            let text = String::from_utf8(buf.0.lock().unwrap().clone()).unwrap();
            assert!(text.contains("cannot cordon"), "{text}");
            // Control: a coloured subscriber does write escapes.
            assert_eq!(
                text.contains('\u{1b}'),
                ansi,
                "json {json}, ansi {ansi}: {text:?}"
            );
        }
    }

    #[test]
    fn the_shipped_rust_log_carries_no_inotify_noise() {
        for spec in ["info", "", "drover=debug,info"] {
            let lines = passes(spec, true);
            assert!(
                !lines.iter().any(|l| l.contains("watch descriptor")),
                "{spec}: {lines:?}"
            );
            assert!(
                lines.iter().any(|l| l.contains("queue overflow")),
                "{spec}: {lines:?}"
            );
            assert!(
                lines.iter().any(|l| l.contains("reconciled")),
                "{spec}: {lines:?}"
            );
        }
        // Asked for by name, it is there.
        let lines = passes("info,notify=info", true);
        assert!(
            lines.iter().any(|l| l.contains("watch descriptor")),
            "{lines:?}"
        );
    }
}
