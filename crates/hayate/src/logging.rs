//! Logging: `tracing-subscriber` writing to standard error, as text or JSON lines, behind a
//! filter that can change while the broker runs (SIGHUP, `PUT /api/log`).
//!
//! The filter is `RUST_LOG` when set (it then wins over every other source, at start and
//! at reload), else the broker's `[server] log` (`--log`), else [`DEFAULT_LOG`].

use std::sync::OnceLock;

use hayate_server::config::{DEFAULT_LOG, ServerSection};
use tracing_subscriber::prelude::*;
use tracing_subscriber::{EnvFilter, Registry, fmt, reload};

struct Control {
    handle: reload::Handle<EnvFilter, Registry>,
    /// `RUST_LOG` was set: it stays.
    from_env: bool,
}

static CONTROL: OnceLock<Control> = OnceLock::new();

/// Installs the subscriber: `server` is the broker's settings (none for the other commands).
pub(crate) fn init(server: Option<&ServerSection>) {
    let env = std::env::var("RUST_LOG")
        .ok()
        .filter(|s| !s.trim().is_empty());
    let text = env
        .clone()
        .or_else(|| server.map(|s| s.log.clone()))
        .unwrap_or_else(|| DEFAULT_LOG.to_string());
    let filter = EnvFilter::try_new(&text).unwrap_or_else(|e| {
        eprintln!("hayate: log filter {text:?} is not valid ({e}); using {DEFAULT_LOG:?}");
        EnvFilter::new(DEFAULT_LOG)
    });
    let (filter, handle) = reload::Layer::new(filter);
    let json = server.is_some_and(|s| s.log_format == "json");
    let base = tracing_subscriber::registry().with(filter);
    if json {
        base.with(fmt::layer().json().with_writer(std::io::stderr))
            .init();
    } else {
        base.with(fmt::layer().with_writer(std::io::stderr)).init();
    }
    let _ = CONTROL.set(Control {
        handle,
        from_env: env.is_some(),
    });
}

/// The filter now, after setting it to `new` when given. `Err` (and the filter unchanged)
/// for a filter that does not parse, or when `RUST_LOG` fixes it.
pub(crate) fn control(new: Option<&str>) -> Result<String, String> {
    let c = CONTROL.get().ok_or("logging is not initialised")?;
    if let Some(text) = new {
        if c.from_env {
            return Err("RUST_LOG is set: it fixes the log filter".into());
        }
        let f = EnvFilter::try_new(text).map_err(|e| format!("log filter {text:?}: {e}"))?;
        c.handle.reload(f).map_err(|e| e.to_string())?;
    }
    c.handle
        .with_current(|f| f.to_string())
        .map_err(|e| e.to_string())
}
