//! What a server answers a request: the checks of the request against the server's spec
//! ([`accept`]), and the handler's result turned into a reply ([`answer`]).

use std::fmt;
use std::future::Future;
use std::panic::AssertUnwindSafe;

use bytes::Bytes;
use futures::FutureExt;
use hayate_core::Message;

use super::{
    HEADER_ERROR, HEADER_METHOD, HEADER_NAMESPACE, HEADER_STATUS, HEADER_VERSION, Target, Version,
    header,
};

/// An error reply: its `rpc-error` kind, message and extra headers.
struct Rejection {
    kind: &'static str,
    message: String,
    extra: Option<(&'static str, Bytes)>,
}

impl Rejection {
    fn new(kind: &'static str, message: impl Into<String>) -> Rejection {
        Rejection {
            kind,
            message: message.into(),
            extra: None,
        }
    }
}

/// Checks a request against the server's spec; returns its method.
fn accept(spec: &Target, m: &Message) -> Result<String, Rejection> {
    let method = match header(m, HEADER_METHOD).map(|v| std::str::from_utf8(v)) {
        Some(Ok(method)) if !method.is_empty() => method.to_string(),
        Some(_) => {
            return Err(Rejection::new(
                "bad-request",
                format!("{HEADER_METHOD} is empty or not UTF-8"),
            ));
        }
        None => {
            return Err(Rejection::new(
                "bad-request",
                format!("no {HEADER_METHOD} header"),
            ));
        }
    };
    let requested = match header(m, HEADER_VERSION) {
        None => Version::default(),
        Some(v) => match std::str::from_utf8(v).ok().map(str::parse::<Version>) {
            Some(Ok(v)) => v,
            _ => {
                return Err(Rejection::new(
                    "bad-request",
                    format!(
                        "invalid {HEADER_VERSION} {:?} (expected MAJOR.MINOR)",
                        String::from_utf8_lossy(v)
                    ),
                ));
            }
        },
    };
    if !spec.version.can_serve(requested) {
        let mut r = Rejection::new(
            "unsupported-version",
            format!(
                "unsupported version {requested}; server speaks {}",
                spec.version
            ),
        );
        r.extra = Some((HEADER_VERSION, Bytes::from(spec.version.to_string())));
        return Err(r);
    }
    let ns = header(m, HEADER_NAMESPACE).filter(|v| !v.is_empty());
    let ours = spec.namespace.as_deref().map(str::as_bytes);
    if ns.map(|v| &v[..]) != ours {
        let shown = |n: Option<&[u8]>| match n {
            Some(n) => format!("{:?}", String::from_utf8_lossy(n)),
            None => "none".into(),
        };
        let mut r = Rejection::new(
            "namespace-mismatch",
            format!(
                "namespace mismatch: requested {}, server has {}",
                shown(ns.map(|v| &v[..])),
                shown(ours)
            ),
        );
        r.extra = spec
            .namespace
            .as_ref()
            .map(|n| (HEADER_NAMESPACE, Bytes::copy_from_slice(n.as_bytes())));
        return Err(r);
    }
    Ok(method)
}

/// Checks request `m` against `spec`, runs the handler and returns the reply to send (to the
/// request's reply-to key), or `None` for a cast or fan-out (whose failure is logged).
pub(super) async fn answer<F, Fut, E>(spec: &Target, handler: &F, m: Message) -> Option<Message>
where
    F: Fn(String, Bytes) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<Bytes, E>> + Send + 'static,
    E: fmt::Display + 'static,
{
    let outcome = match accept(spec, &m) {
        Ok(method) => {
            let run = AssertUnwindSafe(handler(method, m.payload.clone())).catch_unwind();
            match run.await {
                Ok(Ok(reply)) => Ok(reply),
                Ok(Err(e)) => Err(Rejection::new("remote", e.to_string())),
                Err(_) => Err(Rejection::new("remote", "the handler panicked")),
            }
        }
        Err(r) => Err(r),
    };
    if m.reply_to.is_none() {
        if let Err(r) = outcome {
            tracing::warn!(topic = %spec.topic, key = %m.key, kind = r.kind,
                "RPC cast failed: {}", r.message);
        }
        return None;
    }
    let (payload, headers) = match outcome {
        Ok(payload) => (
            payload,
            vec![(HEADER_STATUS.to_string(), Bytes::from_static(b"ok"))],
        ),
        Err(rej) => {
            let mut h = vec![
                (HEADER_STATUS.to_string(), Bytes::from_static(b"error")),
                (
                    HEADER_ERROR.to_string(),
                    Bytes::from_static(rej.kind.as_bytes()),
                ),
            ];
            if let Some((name, value)) = rej.extra {
                h.push((name.to_string(), value));
            }
            (Bytes::from(rej.message), h)
        }
    };
    let mut reply = m.reply(payload)?;
    reply.headers = Some(headers);
    Some(reply)
}

#[cfg(test)]
#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::super::header_str;
    use super::*;

    #[test]
    fn requests_carry_method_version_and_namespace() {
        let t = Target::new("calc")
            .namespace("ns")
            .version(Version::new(2, 1));
        let m = t
            .request(t.topic_key().unwrap(), "add", Bytes::from_static(b"x"))
            .unwrap();
        assert_eq!(header_str(&m, HEADER_METHOD), Some("add"));
        assert_eq!(header_str(&m, HEADER_VERSION), Some("2.1"));
        assert_eq!(header_str(&m, HEADER_NAMESPACE), Some("ns"));
        assert!(t.request(t.topic_key().unwrap(), "", Bytes::new()).is_err());
        let spec = Target::new("calc").server("s").version(Version::new(2, 3));
        assert!(matches!(
            accept(&spec, &m),
            Err(Rejection {
                kind: "namespace-mismatch",
                ..
            })
        ));
        let spec = spec.namespace("ns");
        assert_eq!(accept(&spec, &m).ok().as_deref(), Some("add"));
        let spec = spec.version(Version::new(2, 0));
        let r = accept(&spec, &m).err().unwrap();
        assert_eq!(r.kind, "unsupported-version");
        assert_eq!(r.message, "unsupported version 2.1; server speaks 2.0");
    }
}
