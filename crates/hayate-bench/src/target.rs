//! Benchmark targets: a system and the address of its server, parsed from a URL.

use std::fmt;

use anyhow::{Context, bail};

/// The kind of server a target is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum System {
    /// `hayate broker`, native protocol, through `hayate-client`.
    Hayate,
    /// `nats-server`, through `async-nats`.
    Nats,
}

impl System {
    /// The name used in records: "hayate", "nats".
    pub fn name(self) -> &'static str {
        match self {
            System::Hayate => "hayate",
            System::Nats => "nats",
        }
    }

    /// The port used when a URL names none.
    pub fn default_port(self) -> u16 {
        match self {
            System::Hayate => 4700,
            System::Nats => 4222,
        }
    }
}

/// A server to benchmark: `hayate://HOST:PORT` or `nats://HOST:PORT`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Target {
    /// Which system (and protocol) the server speaks.
    pub system: System,
    /// Host name or IP address.
    pub host: String,
    /// TCP port.
    pub port: u16,
}

impl Target {
    /// Parses `SCHEME://HOST[:PORT]`; the scheme is `hayate` or `nats`. A missing port means the
    /// system's default (hayate 4700, nats 4222). IPv6 hosts go in brackets: `nats://[::1]:4222`.
    pub fn parse(url: &str) -> anyhow::Result<Target> {
        let url = url.trim();
        let (scheme, rest) = url
            .split_once("://")
            .with_context(|| format!("target {url:?}: expected SCHEME://HOST:PORT"))?;
        let system = match scheme.to_ascii_lowercase().as_str() {
            "hayate" => System::Hayate,
            "nats" => System::Nats,
            other => bail!("target {url:?}: unknown scheme {other:?} (expected hayate or nats)"),
        };
        let rest = rest.trim_end_matches('/');
        if rest.is_empty() || rest.contains('/') || rest.contains('@') {
            bail!("target {url:?}: expected SCHEME://HOST:PORT");
        }
        let (host, port) = if let Some(r) = rest.strip_prefix('[') {
            let (h, after) = r
                .split_once(']')
                .with_context(|| format!("target {url:?}: unclosed '['"))?;
            let port = match after.strip_prefix(':') {
                Some(p) => Some(p),
                None if after.is_empty() => None,
                None => bail!("target {url:?}: garbage after ']'"),
            };
            (h.to_string(), port)
        } else {
            match rest.rsplit_once(':') {
                Some((h, p)) => (h.to_string(), Some(p)),
                None => (rest.to_string(), None),
            }
        };
        if host.is_empty() {
            bail!("target {url:?}: empty host");
        }
        let port = match port {
            Some(p) => p
                .parse::<u16>()
                .with_context(|| format!("target {url:?}: bad port {p:?}"))?,
            None => system.default_port(),
        };
        Ok(Target { system, host, port })
    }

    /// The system's name: "hayate", "nats".
    pub fn system(&self) -> &'static str {
        self.system.name()
    }

    /// `HOST:PORT` (with brackets around an IPv6 host), as a socket address string.
    pub fn addr(&self) -> String {
        if self.host.contains(':') {
            format!("[{}]:{}", self.host, self.port)
        } else {
            format!("{}:{}", self.host, self.port)
        }
    }
}

impl fmt::Display for Target {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}://{}", self.system.name(), self.addr())
    }
}

impl std::str::FromStr for Target {
    type Err = anyhow::Error;
    fn from_str(s: &str) -> anyhow::Result<Target> {
        Target::parse(s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_urls() {
        let t = Target::parse("hayate://127.0.0.1:4000").unwrap();
        assert_eq!(t.system, System::Hayate);
        assert_eq!(t.addr(), "127.0.0.1:4000");
        assert_eq!(t.system(), "hayate");
        let t = Target::parse("nats://localhost").unwrap();
        assert_eq!(t.port, 4222);
        assert_eq!(t.to_string(), "nats://localhost:4222");
        let t = Target::parse("nats://[::1]:5000/").unwrap();
        assert_eq!(t.addr(), "[::1]:5000");
        assert!(Target::parse("mqtt://x:1").is_err());
        assert!(Target::parse("127.0.0.1:4000").is_err());
        assert!(Target::parse("nats://:4222").is_err());
        assert!(Target::parse("nats://h:99999").is_err());
    }
}
