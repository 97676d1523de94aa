//! The handshake: CONNECT (or STOMP): the protocol version, the login, the heart-beats
//! negotiated, and the CONNECTED answer.

use std::time::Duration;

use hayate_broker::Session;
use hayate_stomp::{Command, Frame, Version};

use super::{Conn, Refusal, refuse};
use hayate_core::sync::lock;
use hayate_front::auth::Credentials;

impl Conn<'_> {
    pub(super) async fn connect(
        &mut self,
        f: &Frame,
        session: &mut Session,
    ) -> Result<(), Refusal> {
        let version = match f.get("accept-version") {
            None => Version::V1_0,
            Some(a) => match Version::parse_accept(a) {
                Some(v) => v,
                None => {
                    let mut e = refuse(
                        "unsupported protocol version",
                        format!("the client accepts {a:?}; this server speaks 1.0, 1.1 and 1.2"),
                    );
                    // STOMP 1.2: the ERROR lists the versions the server supports.
                    e.headers.push(("version", "1.0,1.1,1.2"));
                    return Err(e);
                }
            },
        };
        let creds = Credentials {
            user: f.get("login"),
            password: f.get("passcode").map(str::as_bytes),
            ..Credentials::default()
        };
        self.identity = self
            .peer
            .login(&*self.stomp.auth, "stomp", creds)
            .await
            .map_err(|e| refuse("access refused", e.to_string()))?;
        let (cx, cy) = match f.get("heart-beat") {
            None => (0, 0),
            Some(h) => parse_heart_beat(h).ok_or_else(|| {
                refuse(
                    "malformed heart-beat",
                    format!("heart-beat {h:?} is not two numbers"),
                )
            })?,
        };
        let s = self.stomp.cfg.heart_beat_ms;
        let (sx, sy) = (s, s);
        if version >= Version::V1_1 {
            if sx > 0 && cy > 0 {
                self.send_every = Some(Duration::from_millis(u64::from(sx.max(cy))));
            }
            if cx > 0 && sy > 0 {
                self.recv_timeout = Some(Duration::from_millis(2 * u64::from(cx.max(sy))));
            }
        }
        self.version = version;
        lock(&self.out).version = version;
        self.connected = true;
        let mut r = Frame::new(Command::Connected)
            .header("version", version.as_str())
            .header("server", &self.stomp.server_name)
            .header("session", &session.id().to_string());
        if version >= Version::V1_1 {
            r = r.header("heart-beat", &format!("{sx},{sy}"));
        }
        self.reply(session, r);
        Ok(())
    }
}

fn parse_heart_beat(h: &str) -> Option<(u32, u32)> {
    let (a, b) = h.split_once(',')?;
    Some((a.trim().parse().ok()?, b.trim().parse().ok()?))
}
