//! `hayate top`: the admin listener's live view (what the web dashboard shows) in the
//! terminal. It polls `GET /api/dashboard` once a second; `q`, Esc or Ctrl-C quits. With
//! `--once` it prints one frame as text and exits (scripts, tests, a terminal without a TTY).

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use ratatui::Frame;
use ratatui::layout::{Constraint, Direction, Layout, Rect};
use ratatui::style::{Color, Modifier, Style};
use ratatui::text::{Line, Span};
use ratatui::widgets::{Block, Borders, Paragraph, Row, Sparkline, Table};
use serde_json::Value;

/// `hayate top` arguments.
#[derive(Debug, clap::Args)]
pub(crate) struct TopArgs {
    /// The broker's admin listener.
    #[arg(long, default_value = "127.0.0.1:4780", value_name = "HOST:PORT")]
    pub(crate) admin: String,
    /// Print one frame as text and exit.
    #[arg(long)]
    pub(crate) once: bool,
    /// Columns and rows of the frame `--once` prints.
    #[arg(long, default_value = "120x40", value_name = "COLSxROWS")]
    pub(crate) size: String,
    #[command(flatten)]
    pub(crate) auth: crate::cli::ClientAuth,
}

/// The `Authorization` header for the admin API from the client credentials, if any.
pub(crate) fn authorization(auth: &crate::cli::ClientAuth) -> Option<String> {
    match (&auth.token, &auth.user) {
        (Some(t), _) => Some(format!("Bearer {t}")),
        (None, Some(u)) => Some(format!(
            "Basic {}",
            base64(format!("{u}:{}", auth.password.as_deref().unwrap_or("")).as_bytes())
        )),
        (None, None) => None,
    }
}

fn base64(data: &[u8]) -> String {
    const T: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(data.len().div_ceil(3) * 4);
    for c in data.chunks(3) {
        let n = (u32::from(c[0]) << 16)
            | (u32::from(*c.get(1).unwrap_or(&0)) << 8)
            | u32::from(*c.get(2).unwrap_or(&0));
        for (i, shift) in [18, 12, 6, 0].into_iter().enumerate() {
            if i <= c.len() {
                out.push(T[(n >> shift) as usize & 63] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

/// Runs `hayate top`. `auth` is the `Authorization` header value, if any.
pub(crate) fn run(args: &TopArgs, auth: Option<String>) -> Result<()> {
    if args.once {
        let (w, h) = args
            .size
            .split_once('x')
            .and_then(|(w, h)| Some((w.parse::<u16>().ok()?, h.parse::<u16>().ok()?)))
            .filter(|(w, h)| *w >= 40 && *h >= 10)
            .with_context(|| format!("--size {:?}: COLSxROWS, at least 40x10", args.size))?;
        let data = fetch(&args.admin, auth.as_deref())?;
        let mut t = ratatui::Terminal::new(ratatui::backend::TestBackend::new(w, h))?;
        t.draw(|f| draw(f, &args.admin, Ok(&data)))?;
        let buf = t.backend().buffer();
        let mut out = std::io::stdout().lock();
        for y in 0..h {
            let line: String = (0..w)
                .map(|x| buf[(x, y)].symbol().to_string())
                .collect::<String>();
            writeln!(out, "{}", line.trim_end())?;
        }
        return Ok(());
    }
    let mut terminal = ratatui::try_init().context("the terminal (use --once without one)")?;
    let result = (|| -> Result<()> {
        loop {
            let data = fetch(&args.admin, auth.as_deref());
            terminal.draw(|f| draw(f, &args.admin, data.as_ref().map_err(|e| e.to_string())))?;
            // Keys for up to a second, then the next fetch.
            let until = std::time::Instant::now() + Duration::from_secs(1);
            loop {
                let left = until.saturating_duration_since(std::time::Instant::now());
                if left.is_zero() {
                    break;
                }
                if ratatui::crossterm::event::poll(left)?
                    && let ratatui::crossterm::event::Event::Key(k) =
                        ratatui::crossterm::event::read()?
                {
                    use ratatui::crossterm::event::{KeyCode, KeyModifiers};
                    let ctrl_c =
                        k.code == KeyCode::Char('c') && k.modifiers.contains(KeyModifiers::CONTROL);
                    if matches!(k.code, KeyCode::Char('q') | KeyCode::Esc) || ctrl_c {
                        return Ok(());
                    }
                }
            }
        }
    })();
    ratatui::restore();
    result
}

/// `GET /api/dashboard` on `admin`: its JSON document.
fn fetch(admin: &str, auth: Option<&str>) -> Result<Value> {
    let mut s = TcpStream::connect(admin).with_context(|| format!("connecting to {admin}"))?;
    s.set_read_timeout(Some(Duration::from_secs(5)))?;
    let mut req = format!(
        "GET /api/dashboard HTTP/1.1\r\nHost: {admin}\r\nConnection: close\r\nAccept: application/json\r\n"
    );
    if let Some(a) = auth {
        req.push_str(&format!("Authorization: {a}\r\n"));
    }
    req.push_str("\r\n");
    s.write_all(req.as_bytes())?;
    let mut raw = Vec::new();
    s.take(64 << 20).read_to_end(&mut raw)?;
    let text = String::from_utf8_lossy(&raw);
    let (head, body) = text.split_once("\r\n\r\n").context("not an HTTP answer")?;
    let status: u16 = head
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .context("not an HTTP answer")?;
    let body = if head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked")
    {
        dechunk(body)
    } else {
        body.to_string()
    };
    match status {
        200 => serde_json::from_str(&body).context("the dashboard document"),
        401 => bail!("{admin}: credentials needed (--user and --password, or --token)"),
        s => bail!("{admin}: HTTP {s}: {}", body.trim()),
    }
}

fn dechunk(mut rest: &str) -> String {
    let mut out = String::new();
    while let Some((len, after)) = rest.split_once("\r\n") {
        let n = usize::from_str_radix(len.trim(), 16).unwrap_or(0);
        if n == 0 || after.len() < n {
            break;
        }
        out.push_str(&after[..n]);
        rest = after[n..].strip_prefix("\r\n").unwrap_or(&after[n..]);
    }
    out
}

fn num(v: &Value) -> f64 {
    v.as_f64().unwrap_or(0.0)
}

fn rate(n: f64) -> String {
    if n >= 1e6 {
        format!("{:.2}M", n / 1e6)
    } else if n >= 1e4 {
        format!("{:.1}k", n / 1e3)
    } else {
        format!("{}", n.round() as u64)
    }
}

fn bytes(n: f64) -> String {
    let units = ["B", "KiB", "MiB", "GiB", "TiB"];
    let (mut n, mut i) = (n, 0);
    while n >= 1024.0 && i < units.len() - 1 {
        n /= 1024.0;
        i += 1;
    }
    if i == 0 {
        format!("{} B", n as u64)
    } else {
        format!("{n:.1} {}", units[i])
    }
}

fn text(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        Value::Null => String::new(),
        v => v.to_string(),
    }
}

/// One frame: the broker's state, or why it could not be read.
fn draw(f: &mut Frame, admin: &str, data: Result<&Value, String>) {
    let area = f.area();
    let d = match data {
        Ok(d) => d,
        Err(e) => {
            f.render_widget(
                Paragraph::new(format!("hayate top: {admin}: {e}\n\nq quits"))
                    .block(Block::default().borders(Borders::ALL).title(" hayate top ")),
                area,
            );
            return;
        }
    };
    let rows = Layout::default()
        .direction(Direction::Vertical)
        .constraints([
            Constraint::Length(1),
            Constraint::Length(4),
            Constraint::Length(5),
            Constraint::Length((d["listeners"].as_array().map_or(0, Vec::len) as u16 + 3).min(10)),
            Constraint::Min(5),
        ])
        .split(area);
    draw_title(f, rows[0], admin, &d["overview"]);
    draw_stats(f, rows[1], d);
    draw_history(f, rows[2], d);
    draw_listeners(f, rows[3], d);
    draw_connections(f, rows[4], d);
}

/// The title line: version, address, uptime, readiness.
fn draw_title(f: &mut Frame, area: Rect, admin: &str, o: &Value) {
    let bold = Style::default().add_modifier(Modifier::BOLD);
    f.render_widget(
        Paragraph::new(Line::from(vec![
            Span::styled("HAYATE ", bold),
            Span::raw(format!(
                "v{}  {}  up {}s  {}  (q quits)",
                text(&o["version"]),
                admin,
                num(&o["uptime_secs"]) as u64,
                if o["ready"] == true {
                    "ready"
                } else {
                    "not ready"
                }
            )),
        ])),
        area,
    );
}

/// Four boxes: published and delivered rates, connections, slow consumers and drops.
fn draw_stats(f: &mut Frame, area: Rect, d: &Value) {
    let o = &d["overview"];
    let r = &d["rates"];
    let b = &o["broker"];
    let stats = [
        (
            "published",
            format!(
                "{} msg/s  {}/s",
                rate(num(&r["msgs_in"])),
                bytes(num(&r["bytes_in"]))
            ),
            Color::Cyan,
        ),
        (
            "delivered",
            format!(
                "{} msg/s  {}/s",
                rate(num(&r["msgs_out"])),
                bytes(num(&r["bytes_out"]))
            ),
            Color::Green,
        ),
        (
            "connections",
            format!(
                "{}  ({} subscriptions)",
                num(&o["connections"]),
                num(&o["subscriptions"])
            ),
            Color::White,
        ),
        (
            "slow / dropped",
            format!(
                "{} cut off  {} dropped",
                num(&b["slow_consumers"]),
                num(&b["dropped"]) + num(&d["queue_dropped"]) + num(&b["unplaced"])
            ),
            if num(&b["slow_consumers"]) + num(&b["dropped"]) > 0.0 {
                Color::Yellow
            } else {
                Color::White
            },
        ),
    ];
    let cols = Layout::default()
        .direction(Direction::Horizontal)
        .constraints([Constraint::Ratio(1, 4); 4])
        .split(area);
    for ((title, value, color), c) in stats.into_iter().zip(cols.iter()) {
        f.render_widget(
            Paragraph::new(Span::styled(value, Style::default().fg(color))).block(
                Block::default()
                    .borders(Borders::ALL)
                    .title(format!(" {title} ")),
            ),
            *c,
        );
    }
}

/// Published msg/s over the last minutes (the sampler's history, one point a second), with
/// the delivery latency and MQTT's held messages in the title.
fn draw_history(f: &mut Frame, area: Rect, d: &Value) {
    let o = &d["overview"];
    let history: Vec<u64> = d["history"]
        .as_array()
        .map_or(&[][..], Vec::as_slice)
        .iter()
        .map(|p| num(&p[1]).max(0.0) as u64)
        .collect();
    let shown = &history[history
        .len()
        .saturating_sub(area.width.saturating_sub(2) as usize)..];
    let lat = &o["delivery_latency"];
    let held = &o["mqtt"];
    f.render_widget(
        Sparkline::default()
            .block(Block::default().borders(Borders::ALL).title(format!(
                " published msg/s (peak {}) · delivery latency p50 {} p99 {} · MQTT held {} ",
                rate(shown.iter().copied().max().unwrap_or(0) as f64),
                secs(&lat["p50"]),
                secs(&lat["p99"]),
                num(&held["held_messages"]),
            )))
            .data(shown)
            .style(Style::default().fg(Color::Cyan)),
        area,
    );
}

/// The listeners (left) and the busiest key prefixes (right).
fn draw_listeners(f: &mut Frame, area: Rect, d: &Value) {
    let mid = Layout::default()
        .direction(Direction::Horizontal)
        .constraints([Constraint::Percentage(60), Constraint::Percentage(40)])
        .split(area);
    table(
        f,
        mid[0],
        " listeners ",
        &["protocol", "address", "conns", "in msg/s", "out msg/s"],
        &[10, 22, 6, 10, 10],
        d["listeners"]
            .as_array()
            .map_or(&[][..], Vec::as_slice)
            .iter()
            .map(|l| {
                vec![
                    text(&l["protocol"]),
                    text(&l["addr"]),
                    text(&l["connections"]),
                    rate(num(&l["msgs_in_rate"])),
                    rate(num(&l["msgs_out_rate"])),
                ]
            }),
    );
    table(
        f,
        mid[1],
        " top key prefixes ",
        &["prefix", "msg/s"],
        &[28, 10],
        d["top_keys"]
            .as_array()
            .map_or(&[][..], Vec::as_slice)
            .iter()
            .map(|k| vec![text(&k["prefix"]), rate(num(&k["rate"]))]),
    );
}

/// Each stream consumer's lag (above) and the deepest queues of every protocol (below).
fn draw_side(f: &mut Frame, area: Rect, d: &Value) {
    let side = Layout::default()
        .direction(Direction::Vertical)
        .constraints([Constraint::Percentage(50), Constraint::Percentage(50)])
        .split(area);
    let mut lag = Vec::new();
    for s in d["streams"].as_array().map_or(&[][..], Vec::as_slice) {
        let consumers = s["consumers"].as_array().map_or(&[][..], Vec::as_slice);
        if consumers.is_empty() {
            lag.push(vec![text(&s["name"]), "-".into(), "-".into()]);
        }
        for c in consumers {
            lag.push(vec![
                text(&s["name"]),
                text(&c["name"]),
                text(&c["pending"]),
            ]);
        }
    }
    table(
        f,
        side[0],
        " streams: consumer lag ",
        &["stream", "consumer", "lag"],
        &[12, 12, 8],
        lag.into_iter(),
    );
    table(
        f,
        side[1],
        " queues (deepest first) ",
        &["queue", "depth", "unacked", "cons"],
        &[14, 7, 7, 4],
        d["queues"]
            .as_array()
            .map_or(&[][..], Vec::as_slice)
            .iter()
            .map(|q| {
                let name = match q["ns"].as_str() {
                    Some(ns) if !ns.is_empty() => format!("{ns}:{}", text(&q["name"])),
                    _ => text(&q["name"]),
                };
                vec![
                    name,
                    text(&q["depth"]),
                    text(&q["unacked"]),
                    text(&q["consumers"]),
                ]
            }),
    );
}

/// The connections, busiest first (left); streams and queues (right).
fn draw_connections(f: &mut Frame, area: Rect, d: &Value) {
    let mut conns: Vec<&Value> = d["connections"]
        .as_array()
        .map_or(Vec::new(), |v| v.iter().collect());
    // The busiest first.
    conns.sort_by(|a, b| {
        let load = |c: &Value| num(&c["msgs_in_rate"]) + num(&c["msgs_out_rate"]);
        load(b).total_cmp(&load(a))
    });
    let bottom = Layout::default()
        .direction(Direction::Horizontal)
        .constraints([Constraint::Percentage(72), Constraint::Percentage(28)])
        .split(area);
    draw_side(f, bottom[1], d);
    table(
        f,
        bottom[0],
        " connections (busiest first) ",
        &[
            "id", "protocol", "peer", "user", "client", "subs", "outbox", "in/s", "out/s",
        ],
        &[5, 9, 22, 10, 24, 5, 10, 9, 9],
        conns.into_iter().map(|c| {
            vec![
                text(&c["id"]),
                text(&c["protocol"]),
                text(&c["peer"]),
                text(&c["user"]),
                text(&c["client_id"]),
                text(&c["subscriptions"]),
                bytes(num(&c["outbox_bytes"])),
                rate(num(&c["msgs_in_rate"])),
                rate(num(&c["msgs_out_rate"])),
            ]
        }),
    );
}

/// A latency in seconds (a JSON number, or null past the last bucket) for a title.
fn secs(v: &Value) -> String {
    match v.as_f64() {
        None => "-".into(),
        Some(s) if s < 1e-3 => format!("{:.0}µs", s * 1e6),
        Some(s) if s < 1.0 => format!("{:.1}ms", s * 1e3),
        Some(s) => format!("{s:.1}s"),
    }
}

fn table(
    f: &mut Frame,
    area: Rect,
    title: &str,
    header: &[&str],
    widths: &[u16],
    rows: impl Iterator<Item = Vec<String>>,
) {
    let t = Table::new(
        rows.map(Row::new),
        widths.iter().map(|w| Constraint::Length(*w)),
    )
    .header(Row::new(header.to_vec()).style(Style::default().add_modifier(Modifier::BOLD)))
    .block(
        Block::default()
            .borders(Borders::ALL)
            .title(title.to_string()),
    );
    f.render_widget(t, area);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_frame_from_a_document() {
        let d: Value = serde_json::json!({
            "overview": {"version": "0.1.0", "uptime_secs": 5, "ready": true,
                         "connections": 1, "subscriptions": 2,
                         "broker": {"slow_consumers": 0, "dropped": 0, "unplaced": 0}},
            "rates": {"msgs_in": 1500.0, "msgs_out": 3000.0, "bytes_in": 150000.0, "bytes_out": 300000.0},
            "listeners": [{"protocol": "mqtt", "addr": "127.0.0.1:1883", "connections": 1,
                           "msgs_in_rate": 1500.0, "msgs_out_rate": 3000.0}],
            "top_keys": [{"prefix": "sensors/room1", "rate": 1500.0}],
            "connections": [{"id": 7, "protocol": "mqtt", "peer": "127.0.0.1:5000", "user": null,
                             "client_id": "probe-42", "subscriptions": 2, "outbox_bytes": 0,
                             "msgs_in_rate": 1500.0, "msgs_out_rate": 3000.0}],
            "queue_dropped": 0,
            "queues": [{"ns": "", "name": "jobs", "depth": 10, "unacked": 3, "consumers": 3}]
        });
        let mut t = ratatui::Terminal::new(ratatui::backend::TestBackend::new(120, 30)).unwrap();
        t.draw(|f| draw(f, "127.0.0.1:4780", Ok(&d))).unwrap();
        let buf = t.backend().buffer();
        let screen: String = (0..30)
            .map(|y| (0..120).map(|x| buf[(x, y)].symbol()).collect::<String>() + "\n")
            .collect();
        for want in [
            "HAYATE",
            "1500 msg/s",
            "3000 msg/s",
            "sensors/room1",
            "probe-42",
            "mqtt",
            "queues",
            "jobs",
        ] {
            assert!(screen.contains(want), "{want} missing from\n{screen}");
        }
        // An unreachable broker: a frame that says so.
        t.draw(|f| draw(f, "127.0.0.1:1", Err("connection refused".into())))
            .unwrap();
        let buf = t.backend().buffer();
        let screen: String = (0..30)
            .map(|y| (0..120).map(|x| buf[(x, y)].symbol()).collect::<String>())
            .collect();
        assert!(screen.contains("connection refused"));
    }

    #[test]
    fn basic_credentials() {
        assert_eq!(base64(b"root:root-pw"), "cm9vdDpyb290LXB3");
        assert_eq!(base64(b"bob:bob-pw"), "Ym9iOmJvYi1wdw==");
        assert_eq!(base64(b"ab"), "YWI=");
        assert_eq!(base64(b""), "");
    }

    #[test]
    fn chunked_bodies() {
        assert_eq!(
            dechunk("5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n"),
            "hello world"
        );
        assert_eq!(dechunk("zz\r\n"), "");
    }
}
