//! Who may use the admin API: the guard in front of every route but the health checks
//! (credentials of an `[admin] users` user, or a local `Host` without users; body limits).

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::Response;
use hayate_front::auth::{AuthError, Credentials};

use super::{BODY_TIMEOUT, MAX_BODY, Peer, Shared, St, error};

/// In front of every route but the health checks:
/// - with users configured, the credentials of an `[admin] users` user, checked with the
///   client's address (so failed attempts count toward its lock-out, as on every protocol);
/// - without users (an open API), a `Host` that is an IP address or `localhost`: a web page
///   on a name that resolves to 127.0.0.1 (DNS rebinding) cannot read or act through the
///   visitor's browser;
/// - a body sent with POST must be `application/json`, which a cross-site HTML form cannot
///   send (and fetch cannot without a CORS preflight this listener never allows).
pub(super) async fn guard(
    State(s): St,
    req: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    let peer = req
        .extensions()
        .get::<axum::extract::ConnectInfo<Peer>>()
        .map(|c| c.0.0.ip());
    if let Err(r) = authorize(&s, req.headers(), peer).await {
        return r;
    }
    if !s.state.auth.required() && !local_host(req.headers()) {
        return error(
            StatusCode::FORBIDDEN,
            "without users configured, the admin API answers only requests for an IP \
             address or localhost (Host header)",
        );
    }
    // A body announced past the limit is refused before any of it is read (a client that
    // announces 100 MiB and sends a byte would otherwise hold the connection).
    let announced = req
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok());
    if announced.is_some_and(|n| n > MAX_BODY as u64) {
        return error(
            StatusCode::PAYLOAD_TOO_LARGE,
            format!("request bodies are at most {MAX_BODY} bytes"),
        );
    }
    if req.method() == axum::http::Method::POST {
        let json = req
            .headers()
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.trim_start().starts_with("application/json"));
        if !json {
            return error(
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                "POST bodies must be Content-Type: application/json",
            );
        }
    }
    // The body, read whole here within BODY_TIMEOUT (a client that sends its head and then
    // trickles the body would otherwise hold the connection for as long as it likes).
    let (parts, body) = req.into_parts();
    let body = match tokio::time::timeout(BODY_TIMEOUT, axum::body::to_bytes(body, MAX_BODY)).await
    {
        Ok(Ok(b)) => b,
        Ok(Err(_)) => {
            return error(
                StatusCode::PAYLOAD_TOO_LARGE,
                format!("request bodies are at most {MAX_BODY} bytes"),
            );
        }
        Err(_) => {
            return error(
                StatusCode::REQUEST_TIMEOUT,
                format!(
                    "the request body did not arrive within {} s",
                    BODY_TIMEOUT.as_secs()
                ),
            );
        }
    };
    next.run(axum::extract::Request::from_parts(
        parts,
        axum::body::Body::from(body),
    ))
    .await
}

/// Whether the request's `Host` names an IP address or `localhost` (with or without a port).
fn local_host(headers: &HeaderMap) -> bool {
    let Some(host) = headers.get(header::HOST).and_then(|v| v.to_str().ok()) else {
        // HTTP/1.0 without Host: not a browser's request.
        return true;
    };
    let name = if let Some(rest) = host.strip_prefix('[') {
        // [v6]:port
        return rest
            .split(']')
            .next()
            .is_some_and(|a| a.parse::<std::net::Ipv6Addr>().is_ok());
    } else {
        host.rsplit_once(':').map_or(host, |(h, _)| h)
    };
    name.eq_ignore_ascii_case("localhost") || name.parse::<std::net::IpAddr>().is_ok()
}

/// Checks the request's credentials when the broker has users; `Err` is the answer.
async fn authorize(
    s: &Shared,
    headers: &HeaderMap,
    peer: Option<std::net::IpAddr>,
) -> Result<(), Response> {
    let st = &s.state;
    if !st.auth.required() {
        return Ok(());
    }
    let unauthorized = || {
        let mut r = error(StatusCode::UNAUTHORIZED, "credentials required");
        r.headers_mut().insert(
            header::WWW_AUTHENTICATE,
            header::HeaderValue::from_static("Basic realm=\"hayate admin\""),
        );
        r
    };
    let Some(value) = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
    else {
        return Err(unauthorized());
    };
    let (user, password, token);
    let (scheme, rest) = value.split_once(' ').unwrap_or((value, ""));
    if scheme.eq_ignore_ascii_case("Basic") {
        let b = rest;
        let decoded = decode_base64(b.trim()).ok_or_else(unauthorized)?;
        let text = String::from_utf8(decoded).map_err(|_| unauthorized())?;
        let (u, p) = text.split_once(':').ok_or_else(unauthorized)?;
        (user, password, token) = (Some(u.to_string()), Some(p.as_bytes().to_vec()), None);
    } else if scheme.eq_ignore_ascii_case("Bearer") {
        let t = rest;
        (user, password, token) = (None, None, Some(t.trim().as_bytes().to_vec()));
    } else {
        return Err(unauthorized());
    }
    let creds = Credentials {
        user: user.as_deref(),
        password: password.as_deref(),
        token: token.as_deref(),
        peer,
        verified: None,
    };
    let id = match st.auth.authenticate("admin", creds).await {
        Ok(id) => id,
        Err(AuthError::Throttled) => {
            return Err(error(
                StatusCode::TOO_MANY_REQUESTS,
                AuthError::Throttled.to_string(),
            ));
        }
        Err(AuthError::Busy) => {
            let mut r = error(StatusCode::SERVICE_UNAVAILABLE, AuthError::Busy.to_string());
            r.headers_mut()
                .insert(header::RETRY_AFTER, header::HeaderValue::from_static("1"));
            return Err(r);
        }
        Err(_) => return Err(unauthorized()),
    };
    match id.user.as_deref() {
        Some(u)
            if st
                .users
                .read()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .iter()
                .any(|a| a == u) =>
        {
            Ok(())
        }
        Some(u) => {
            tracing::info!(user = u, "admin API refused: not in [admin] users");
            Err(error(
                StatusCode::FORBIDDEN,
                format!("user {u} is not in [admin] users"),
            ))
        }
        None => Err(unauthorized()),
    }
}

/// Standard base64 (with or without padding); `None` for anything else.
fn decode_base64(s: &str) -> Option<Vec<u8>> {
    let s = s.trim_end_matches('=');
    if s.len() > 4096 {
        return None;
    }
    let mut out = Vec::with_capacity(s.len() * 3 / 4);
    let (mut acc, mut bits) = (0u32, 0u32);
    for c in s.bytes() {
        let v = match c {
            b'A'..=b'Z' => c - b'A',
            b'a'..=b'z' => c - b'a' + 26,
            b'0'..=b'9' => c - b'0' + 52,
            b'+' => 62,
            b'/' => 63,
            _ => return None,
        };
        acc = (acc << 6) | u32::from(v);
        bits += 6;
        if bits >= 8 {
            bits -= 8;
            out.push((acc >> bits) as u8);
            acc &= (1 << bits) - 1;
        }
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::decode_base64;

    #[test]
    fn base64() {
        assert_eq!(decode_base64("YWxpY2U6cHc=").unwrap(), b"alice:pw");
        assert_eq!(decode_base64("YWxpY2U6cHc").unwrap(), b"alice:pw");
        assert_eq!(decode_base64("").unwrap(), b"");
        assert!(decode_base64("a b").is_none());
        assert!(decode_base64(&"A".repeat(5000)).is_none());
    }
}
