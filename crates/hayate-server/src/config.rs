//! Broker settings: plain serde structs with defaults. The `hayate` binary loads them from a
//! TOML file and applies command-line overrides; `hayate config default` prints them.

use serde::{Deserialize, Serialize};

/// The default native-protocol address.
pub const DEFAULT_LISTEN: &str = "127.0.0.1:4700";

/// All broker settings.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    /// Server identity.
    pub server: ServerSection,
    /// Native protocol listeners.
    pub native: NativeSection,
    /// Limits.
    pub limits: Limits,
}

/// `[server]`
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ServerSection {
    /// Name reported to clients in WELCOME.
    pub name: String,
}

impl Default for ServerSection {
    fn default() -> Self {
        ServerSection {
            name: format!("hayate/{}", env!("CARGO_PKG_VERSION")),
        }
    }
}

/// `[native]`
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct NativeSection {
    /// TCP addresses to listen on (`HOST:PORT`; port 0 picks a free port).
    pub listen: Vec<String>,
    /// Unix socket paths to listen on.
    pub unix: Vec<String>,
}

impl Default for NativeSection {
    fn default() -> Self {
        NativeSection {
            listen: vec![DEFAULT_LISTEN.to_string()],
            unix: Vec::new(),
        }
    }
}

/// `[limits]`
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Limits {
    /// Largest payload accepted, in bytes. Frames above this (plus 64 KiB for the key and
    /// options) are refused with ERR 3 and the connection is closed.
    pub max_payload: u64,
    /// Byte budget of each session's outbox; past it, `drop` subscriptions lose messages and
    /// `block` subscriptions hold back their publishers.
    pub outbox_bytes: u64,
    /// Most simultaneous connections; further ones are accepted and closed at once.
    pub max_connections: usize,
    /// Milliseconds a new connection has to send HELLO.
    pub handshake_timeout_ms: u64,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_payload: 64 * 1024 * 1024,
            outbox_bytes: 8 * 1024 * 1024,
            max_connections: 100_000,
            handshake_timeout_ms: 10_000,
        }
    }
}

impl Limits {
    /// The largest frame (type byte + body) a connection accepts.
    pub fn max_frame(&self) -> usize {
        usize::try_from(self.max_payload)
            .unwrap_or(usize::MAX)
            .saturating_add(64 * 1024)
            .min(u32::MAX as usize)
    }
}

/// Why a configuration was rejected.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// TOML syntax or an unknown/mistyped setting.
    #[error("invalid configuration: {0}")]
    Parse(String),
    /// A value out of range.
    #[error("invalid configuration: {0}")]
    Invalid(String),
}

impl Config {
    /// Parses TOML text (missing settings take their defaults) and validates it.
    pub fn from_toml(text: &str) -> Result<Config, ConfigError> {
        let c: Config = toml::from_str(text).map_err(|e| ConfigError::Parse(e.to_string()))?;
        c.validate()?;
        Ok(c)
    }

    /// The configuration as TOML.
    pub fn to_toml(&self) -> String {
        toml::to_string_pretty(self).unwrap_or_default()
    }

    /// Checks values are in range.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let l = &self.limits;
        if l.max_payload == 0 || l.max_payload > (u32::MAX as u64 - 64 * 1024) {
            return Err(ConfigError::Invalid(format!(
                "limits.max_payload must be between 1 and {} bytes",
                u32::MAX as u64 - 64 * 1024
            )));
        }
        if l.outbox_bytes < 1024 {
            return Err(ConfigError::Invalid(
                "limits.outbox_bytes must be at least 1024".into(),
            ));
        }
        if l.max_connections == 0 {
            return Err(ConfigError::Invalid(
                "limits.max_connections must be at least 1".into(),
            ));
        }
        if self.native.listen.is_empty() && self.native.unix.is_empty() {
            return Err(ConfigError::Invalid(
                "no listener: set native.listen or native.unix".into(),
            ));
        }
        Ok(())
    }
}
