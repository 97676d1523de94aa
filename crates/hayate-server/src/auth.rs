//! The authentication hook: front-ends ask an [`Authenticator`] whether a client may
//! connect. [`ConfigAuth`] checks the `[auth]` section of the configuration; TLS client
//! certificates, external user stores and per-key permissions will plug in here.

use std::collections::BTreeMap;

use crate::config::AuthSection;

/// Why a client was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AuthError {
    /// No credentials, and anonymous access is off.
    NotAuthorized,
    /// Unknown user or wrong password.
    BadCredentials,
}

/// Decides who may connect.
pub trait Authenticator: Send + Sync + 'static {
    /// Checks a user name and password (either may be absent). `protocol` names the
    /// front-end (`"mqtt"`, `"stomp"`, ...).
    fn authenticate(
        &self,
        protocol: &str,
        user: Option<&str>,
        password: Option<&[u8]>,
    ) -> Result<(), AuthError>;
}

/// Users and passwords from the configuration.
#[derive(Debug, Clone)]
pub struct ConfigAuth {
    allow_anonymous: bool,
    users: BTreeMap<String, String>,
}

impl ConfigAuth {
    /// The authenticator of an `[auth]` section.
    pub fn new(section: &AuthSection) -> ConfigAuth {
        ConfigAuth {
            allow_anonymous: section.allow_anonymous,
            users: section.users.clone(),
        }
    }
}

impl Authenticator for ConfigAuth {
    fn authenticate(
        &self,
        _protocol: &str,
        user: Option<&str>,
        password: Option<&[u8]>,
    ) -> Result<(), AuthError> {
        match user {
            None if self.allow_anonymous => Ok(()),
            None => Err(AuthError::NotAuthorized),
            Some(u) => match self.users.get(u) {
                Some(p) if password == Some(p.as_bytes()) => Ok(()),
                Some(_) => Err(AuthError::BadCredentials),
                // With anonymous access on and no such user, a user name is only a label
                // (as in Mosquitto without a password file).
                None if self.allow_anonymous && self.users.is_empty() => Ok(()),
                None => Err(AuthError::BadCredentials),
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_users() {
        let mut s = AuthSection::default();
        let open = ConfigAuth::new(&s);
        assert_eq!(open.authenticate("mqtt", None, None), Ok(()));
        assert_eq!(open.authenticate("mqtt", Some("x"), Some(b"y")), Ok(()));
        s.allow_anonymous = false;
        s.users.insert("alice".into(), "secret".into());
        let closed = ConfigAuth::new(&s);
        assert_eq!(
            closed.authenticate("mqtt", None, None),
            Err(AuthError::NotAuthorized)
        );
        assert_eq!(
            closed.authenticate("mqtt", Some("alice"), Some(b"secret")),
            Ok(())
        );
        assert_eq!(
            closed.authenticate("mqtt", Some("alice"), Some(b"nope")),
            Err(AuthError::BadCredentials)
        );
        assert_eq!(
            closed.authenticate("mqtt", Some("bob"), Some(b"secret")),
            Err(AuthError::BadCredentials)
        );
    }
}
