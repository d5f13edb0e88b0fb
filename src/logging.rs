//! [bin] What ipybox's log may carry, and how it is written: `tracing` to stderr (stdout is the
//! MCP protocol), filtered by `--log-level` or `IPYBOX_LOG` (an env-filter directive).
//!
//! - **No code, output or handle at any level** unless `--log-content` asks for it. ipybox's own
//!   records never carry them (sessions are named by their tag, tool calls by server and tool
//!   name). Other crates' records can: rmcp logs whole MCP messages (a cell's code, its output,
//!   session handles) at debug and trace, and notifications at info; transports log frames at
//!   trace. So, whatever `IPYBOX_LOG` says, records of other crates are kept only up to `info`,
//!   and rmcp's only up to `warn`, unless `--log-content` is given (for debugging a protocol
//!   exchange on a machine whose logs are as private as the sessions).
//! - **One record, one line**: every record is written with its control characters, newlines
//!   included, shown escaped ([`ipybox::log_text`]), so text from a kernel or a template cannot
//!   forge a record or drive a terminal, whichever log site let it through.
//!
//! Not here: escaping at the library's own log sites (`ipybox::log_text`, for SDK applications
//! with a subscriber of their own).

use std::io::Write;

use tracing::{Level, Metadata};
use tracing_subscriber::fmt::MakeWriter;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{EnvFilter, Layer};

/// Logs to stderr at `level` for ipybox (`IPYBOX_LOG` overrides); `content`: `--log-content`.
/// Once per process; later calls do nothing.
pub(crate) fn init(level: &str, content: bool) {
    let filter =
        EnvFilter::try_from_env("IPYBOX_LOG").unwrap_or_else(|_| EnvFilter::new(directive(level)));
    let guard = tracing_subscriber::filter::filter_fn(move |meta| content || may_log(meta));
    let layer = tracing_subscriber::fmt::layer()
        .with_writer(OneLine)
        .with_ansi(false)
        .with_filter(filter)
        .with_filter(guard);
    let _ = tracing_subscriber::registry().with(layer).try_init();
}

/// The default filter: ipybox's records at `level`, other crates' at `warn` (`error` when
/// `level` is). zeromq's `reconnect` records only at `error`: a kernel ipybox stops (a reset, a
/// hibernated or closed session) leaves its sockets trying once to reconnect, which is not a
/// problem; a kernel that is gone unasked for is reported by ipybox itself.
fn directive(level: &str) -> String {
    let others = if level.eq_ignore_ascii_case("error") {
        "error"
    } else {
        "warn"
    };
    format!("ipybox={level},{others},zeromq::reconnect=error")
}

/// Whether a record (or span) may be logged without `--log-content`: ipybox's own at any level;
/// rmcp's up to `warn` (its `info` records carry notifications and MCP session ids, its debug
/// and trace records whole messages); every other crate's up to `info`.
fn may_log(meta: &Metadata<'_>) -> bool {
    let target = meta.target();
    // `_ipybox`: this module and the library's callers compiled into the Python wheel.
    let own = |name: &str| target == name || target.starts_with(&format!("{name}::"));
    if own("ipybox") || own("_ipybox") {
        return true;
    }
    if target == "rmcp" || target.starts_with("rmcp::") {
        return *meta.level() <= Level::WARN;
    }
    *meta.level() <= Level::INFO
}

/// stderr, one line per record: the formatter writes each record at once, ending in a newline;
/// everything before that newline is escaped.
struct OneLine;

impl<'a> MakeWriter<'a> for OneLine {
    type Writer = OneLineWriter;

    fn make_writer(&'a self) -> Self::Writer {
        OneLineWriter
    }
}

struct OneLineWriter;

impl Write for OneLineWriter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let text = String::from_utf8_lossy(buf);
        let (body, newline) = match text.strip_suffix('\n') {
            Some(body) => (body, "\n"),
            None => (&*text, ""),
        };
        let body = ipybox::redact::redact(body);
        let line = format!("{}{newline}", ipybox::log_text::escaped(&body));
        std::io::stderr().lock().write_all(line.as_bytes())?;
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        std::io::stderr().flush()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn other_crates_are_capped_unless_content_is_asked_for() {
        use tracing::callsite::Identifier;
        use tracing::metadata::Kind;
        struct Site;
        impl tracing::Callsite for Site {
            fn set_interest(&self, _: tracing::subscriber::Interest) {}
            fn metadata(&self) -> &Metadata<'_> {
                unreachable!()
            }
        }
        static SITE: Site = Site;
        let meta = |target: &'static str, level: Level| {
            Metadata::new(
                "event",
                target,
                level,
                None,
                None,
                None,
                tracing::field::FieldSet::new(&[], Identifier(&SITE)),
                Kind::EVENT,
            )
        };
        assert!(may_log(&meta("ipybox::kernel::execute", Level::TRACE)));
        assert!(may_log(&meta("ipybox", Level::DEBUG)));
        assert!(!may_log(&meta("rmcp::service", Level::DEBUG)));
        assert!(!may_log(&meta("rmcp::service", Level::INFO)));
        assert!(may_log(&meta("rmcp::service", Level::WARN)));
        assert!(!may_log(&meta("zeromq::codec", Level::TRACE)));
        assert!(may_log(&meta("zeromq::reconnect", Level::INFO)));
        assert_eq!(
            directive("info"),
            "ipybox=info,warn,zeromq::reconnect=error"
        );
        assert_eq!(
            directive("error"),
            "ipybox=error,error,zeromq::reconnect=error"
        );
        assert!(!may_log(&meta("ipyboxx", Level::DEBUG)));
    }
}
