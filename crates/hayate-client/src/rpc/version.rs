//! [`Version`]: the version of an RPC interface, `MAJOR.MINOR`.

use std::fmt;
use std::str::FromStr;

/// A version of an RPC interface: `MAJOR.MINOR`. The default is `1.0`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Version {
    /// Incompatible changes bump the major version.
    pub major: u32,
    /// Backward-compatible additions bump the minor version.
    pub minor: u32,
}

impl Version {
    /// `major.minor`.
    pub const fn new(major: u32, minor: u32) -> Version {
        Version { major, minor }
    }

    /// True when a server speaking `self` can handle a request for `requested`: the same
    /// major version and at least the requested minor version.
    pub fn can_serve(self, requested: Version) -> bool {
        self.major == requested.major && self.minor >= requested.minor
    }
}

impl Default for Version {
    fn default() -> Self {
        Version::new(1, 0)
    }
}

impl fmt::Display for Version {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}", self.major, self.minor)
    }
}

/// A version string that is not `MAJOR.MINOR`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid version {0:?} (expected MAJOR.MINOR, e.g. 1.0)")]
pub struct VersionError(pub String);

impl FromStr for Version {
    type Err = VersionError;
    fn from_str(s: &str) -> Result<Version, VersionError> {
        let err = || VersionError(s.to_string());
        let (major, minor) = s.split_once('.').ok_or_else(err)?;
        let num = |p: &str| {
            if p.is_empty() || !p.bytes().all(|b| b.is_ascii_digit()) {
                return Err(err());
            }
            p.parse::<u32>().map_err(|_| err())
        };
        Ok(Version::new(num(major)?, num(minor)?))
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn versions_parse_print_and_negotiate() {
        let v: Version = "1.3".parse().unwrap();
        assert_eq!(v, Version::new(1, 3));
        assert_eq!(v.to_string(), "1.3");
        for bad in ["1", "1.", ".1", "a.b", "1.2.3", "+1.0", "1.-1", " 1.0", ""] {
            assert!(bad.parse::<Version>().is_err(), "{bad:?} accepted");
        }
        assert!(v.can_serve(Version::new(1, 0)));
        assert!(v.can_serve(Version::new(1, 3)));
        assert!(!v.can_serve(Version::new(1, 4)));
        assert!(!v.can_serve(Version::new(2, 0)));
        assert!(!Version::new(2, 5).can_serve(Version::new(1, 0)));
        assert_eq!(Version::default(), Version::new(1, 0));
    }
}
