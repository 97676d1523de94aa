//! The `hayate` command: broker, pub, sub, request, reply, bench, config.

mod bench;
mod cli;
mod durable;
mod logging;
mod queue_sub;
mod stream;
mod top;
mod user;

use anyhow::{Context, Result, bail};
use bytes::Bytes;
use clap::Parser;
use hayate_client::{Client, Key, Message, SubscribeOptions};
use hayate_server::{Config, Server};

use cli::{Cli, Command, ConfigCmd};

/// The commented default configuration, printed by `hayate config default`.
const DEFAULT_CONFIG: &str = include_str!("../default-config.toml");

fn main() -> Result<()> {
    let cli = Cli::parse();
    let broker_config = match &cli.command {
        Command::Broker(args) => effective_config(args).ok(),
        _ => None,
    };
    logging::init(broker_config.as_ref().map(|c| &c.server));
    let mut rt = tokio::runtime::Builder::new_multi_thread();
    // Busy-polling needs the polling task on the thread that polls the I/O driver: with one
    // worker there is only one (hayate_io::busy). Otherwise `[server] io_threads`, 0 leaving
    // Tokio's default (one per core, or TOKIO_WORKER_THREADS).
    match broker_config.as_ref().map(|c| &c.server) {
        Some(s) if s.busy_poll_us > 0 => {
            rt.worker_threads(1);
        }
        Some(s) if s.io_threads > 0 => {
            rt.worker_threads(s.io_threads);
        }
        _ => {}
    }
    // HAYATE_TOKIO_LIFO=1 gives the slot back, to measure what order costs
    // (docs/performance.md, *Order across connections*).
    if broker_config.is_some() && std::env::var_os("HAYATE_TOKIO_LIFO").is_none_or(|v| v != "1") {
        in_arrival_order(&mut rt);
    }
    rt.enable_all().build()?.block_on(run(cli))
}

/// Connections made readable by one poll of the I/O driver are handled in the order their
/// input arrived. Tokio puts each task it wakes into its worker's LIFO slot, pushing the one
/// there before to the back of the run queue: of connections woken together, the last runs
/// first. A SUBSCRIBE that arrived just before another connection's PUBLISH then missed it
/// (issue 44, item 14; docs/architecture.md, *Order across connections*). Without the slot
/// every woken task goes to the back of the queue, in the order the driver found it ready.
fn in_arrival_order(rt: &mut tokio::runtime::Builder) {
    #[cfg(tokio_unstable)]
    rt.disable_lifo_slot();
    #[cfg(not(tokio_unstable))]
    {
        let _ = rt;
        eprintln!(
            "hayate broker: built without --cfg tokio_unstable (.cargo/config.toml): \
             connections woken together are not handled in arrival order"
        );
    }
}

async fn run(cli: Cli) -> Result<()> {
    match cli.command {
        Command::Broker(args) => broker(args).await,
        Command::Pub(a) => publish(a).await,
        Command::Sub(a) => subscribe(a).await,
        Command::Request(a) => request(a).await,
        Command::Reply(a) => reply(a).await,
        Command::Bench(a) => bench::run(*a).await,
        Command::Stream(a) => stream::run(a).await,
        Command::User(a) => user::run(a),
        Command::Top(a) => {
            let auth = top::authorization(&a.auth);
            tokio::task::spawn_blocking(move || top::run(&a, auth)).await?
        }
        Command::Config(ConfigCmd::Default) => {
            print!("{DEFAULT_CONFIG}");
            Ok(())
        }
        Command::Config(ConfigCmd::Show(args)) => {
            print!("{}", effective_config(&args)?.to_toml());
            Ok(())
        }
    }
}

fn effective_config(args: &cli::BrokerArgs) -> Result<Config> {
    let mut config = match &args.config {
        Some(path) => {
            let text = std::fs::read_to_string(path)
                .with_context(|| format!("cannot read {}", path.display()))?;
            Config::from_toml(&text)?
        }
        None => Config::default(),
    };
    if !args.listen.is_empty() {
        config.native.listen = args.listen.clone();
    }
    if !args.unix.is_empty() {
        config.native.unix = args.unix.clone();
    }
    if !args.mqtt.is_empty() {
        config.mqtt.listen = listen_list(&args.mqtt);
    }
    if !args.ws.is_empty() {
        config.mqtt.ws = listen_list(&args.ws);
    }
    if !args.stomp.is_empty() {
        config.stomp.listen = listen_list(&args.stomp);
    }
    if !args.amqp.is_empty() {
        config.amqp.listen = listen_list(&args.amqp);
    }
    for (flag, list) in [
        (&args.native_tls, &mut config.native.tls),
        (&args.mqtt_tls, &mut config.mqtt.tls),
        (&args.wss, &mut config.mqtt.wss),
        (&args.stomp_tls, &mut config.stomp.tls),
        (&args.amqp_tls, &mut config.amqp.tls),
    ] {
        if !flag.is_empty() {
            *list = listen_list(flag);
        }
    }
    if let Some(c) = &args.tls_cert {
        config.tls.cert = c.clone();
    }
    if let Some(k) = &args.tls_key {
        config.tls.key = k.clone();
    }
    if let Some(d) = &args.data {
        config.server.data_dir = d.clone();
    }
    if let Some(v) = args.max_payload {
        config.limits.max_payload = v;
    }
    if let Some(v) = args.outbox_bytes {
        config.limits.outbox_bytes = v;
    }
    if let Some(v) = args.busy_poll_us {
        config.server.busy_poll_us = v;
    }
    if let Some(v) = args.io_threads {
        config.server.io_threads = v;
    }
    if let Some(a) = &args.admin {
        config.admin.listen = listen_list(std::slice::from_ref(a));
    }
    if let Some(l) = &args.log {
        config.server.log = l.clone();
    }
    if let Some(f) = &args.log_format {
        config.server.log_format = f.clone();
    }
    config.validate()?;
    Ok(config)
}

/// A listener flag's values; `off` alone means none.
fn listen_list(v: &[String]) -> Vec<String> {
    if v.len() == 1 && v[0] == "off" {
        Vec::new()
    } else {
        v.to_vec()
    }
}

async fn broker(args: cli::BrokerArgs) -> Result<()> {
    let config = effective_config(&args)?;
    let server = Server::bind(&config)
        .await?
        .with_log_control(std::sync::Arc::new(logging::control));
    // Reloading: the config file and flags read again, applied to what can change while
    // running (hayate_server::server::Reloader), the log filter, the TLS files. SIGHUP and
    // POST /api/reload do the same.
    let reload: hayate_server::admin::ReloadControl = {
        let (args, reloader, tls) = (args.clone(), server.reloader(), server.tls());
        std::sync::Arc::new(move || reload_config(&args, &reloader, tls.as_deref()))
    };
    let server = server.with_reload_control(reload.clone());
    for (proto, a) in server.bound() {
        println!("hayate broker: {} on {a}", proto.label());
    }
    if let Some(a) = server.admin_addr() {
        println!("hayate broker: admin http on {a}");
    }
    if let Some(o) = server.shm() {
        println!(
            // No " on " in this line: scripts read "<what> on <address>" lines as listeners.
            "hayate broker: shared memory offered to native clients of this host (socket @{})",
            o.name()
        );
    }
    // No " on " in this line either.
    println!(
        "hayate broker: {} I/O threads",
        tokio::runtime::Handle::current().metrics().num_workers()
    );
    println!("hayate broker: ready (Ctrl-C to stop)");
    #[cfg(unix)]
    {
        // Caught even without a config file or TLS, so that a SIGHUP never stops the broker.
        if let Ok(mut hup) = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup())
        {
            tokio::spawn(async move {
                while hup.recv().await.is_some() {
                    let r = reload.clone();
                    match tokio::task::spawn_blocking(move || r()).await {
                        Ok(Ok(applied)) => tracing::info!("SIGHUP: reloaded: {applied}"),
                        Ok(Err(e)) => {
                            tracing::warn!("SIGHUP: reload refused, nothing changed: {e}")
                        }
                        Err(e) => tracing::error!("SIGHUP: reload failed: {e}"),
                    }
                }
            });
        }
    }
    server.run(shutdown_signal()).await;
    println!("hayate broker: stopped");
    Ok(())
}

/// Reads the configuration again (file and flags, as at start) and applies what can change
/// while running: `[limits]` for new connections, `[auth]` users, tokens and permissions for
/// new logins and the permissions of users logged in, `[admin] users`, the log filter (unless `--log` or `RUST_LOG` fixes it), and
/// the TLS certificate, key and CA files. A configuration that does not validate changes
/// nothing; a TLS file that does not load keeps the current certificates.
fn reload_config(
    args: &cli::BrokerArgs,
    reloader: &hayate_server::server::Reloader,
    tls: Option<&hayate_server::tls::ServerTls>,
) -> std::result::Result<String, String> {
    let mut applied = Vec::new();
    if args.config.is_some() {
        let config = effective_config(args).map_err(|e| format!("{e:#}"))?;
        reloader.reload(&config)?;
        applied.push("limits, users and permissions, admin users");
        if args.log.is_none() {
            match logging::control(Some(&config.server.log)) {
                Ok(_) => applied.push("log filter"),
                Err(e) => tracing::warn!("reload: log filter unchanged: {e}"),
            }
        }
    }
    if let Some(t) = tls {
        match t.reload() {
            Ok(()) => applied.push("TLS certificates"),
            Err(e) => {
                tracing::error!("reload: TLS files not reloaded, keeping the current ones: {e}")
            }
        }
    }
    if applied.is_empty() {
        return Err("no config file (--config) and no TLS: nothing to reload".into());
    }
    Ok(applied.join(", "))
}

async fn shutdown_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut term =
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(s) => s,
                Err(_) => {
                    let _ = ctrl_c.await;
                    return;
                }
            };
        tokio::select! {
            _ = ctrl_c => {}
            _ = term.recv() => {}
        }
    }
    #[cfg(not(unix))]
    let _ = ctrl_c.await;
}

async fn connect(server: &str, auth: &cli::ClientAuth, name: &str) -> Result<Client> {
    Client::connect_with(server, auth.options(name))
        .await
        .with_context(|| format!("cannot connect to {}", redact(server)))
}

/// An address for messages: `user:password@` becomes `user:***@`.
pub(crate) fn redact(addr: &str) -> String {
    match addr.rsplit_once('@') {
        Some((cred, host)) => {
            let (scheme, cred) = match cred.split_once("://") {
                Some((s, c)) => (format!("{s}://"), c),
                None => (String::new(), cred),
            };
            let user = cred.split_once(':').map_or(cred, |(u, _)| u);
            format!("{scheme}{user}:***@{host}")
        }
        None => addr.to_owned(),
    }
}

async fn publish(a: cli::PubArgs) -> Result<()> {
    let key = Key::new(&a.key).with_context(|| format!("invalid key {:?}", a.key))?;
    let payload: Bytes = match a.payload {
        Some(p) => p.into(),
        None => {
            let mut v = Vec::new();
            std::io::Read::read_to_end(&mut std::io::stdin(), &mut v)?;
            v.into()
        }
    };
    if a.peer.peer {
        let node = hayate_client::peer::Node::start(a.peer.options(a.auth.shm)).await?;
        node.wait_peers(a.peer.wait_peers, std::time::Duration::from_secs(30))
            .await
            .with_context(|| format!("fewer than {} peer nodes linked", a.peer.wait_peers))?;
        for _ in 0..a.count {
            node.publish(&key, payload.clone()).await?;
        }
        node.flush().await?;
        node.close().await;
        return Ok(());
    }
    let c = connect(&a.server, &a.auth, "hayate-pub").await?;
    for _ in 0..a.count {
        if a.confirm {
            match c
                .publish_confirmed(&Message::new(key.clone(), payload.clone()))
                .await?
            {
                hayate_client::ConfirmOutcome::Stored { stream, offset } => {
                    println!("stored: {stream} {offset}")
                }
                hayate_client::ConfirmOutcome::NotCaptured => {
                    println!("not captured by any stream")
                }
                hayate_client::ConfirmOutcome::Failed(why) => anyhow::bail!("not stored: {why}"),
            }
        } else {
            c.publish(&key, payload.clone()).await?;
        }
    }
    c.flush().await?;
    c.close().await?;
    Ok(())
}

async fn subscribe(a: cli::SubArgs) -> Result<()> {
    if let Some(q) = &a.queue {
        let c = connect(&a.server, &a.auth, "hayate-sub").await?;
        return queue_sub::run(&c, q, &a).await;
    }
    let expr = a.expr.clone().unwrap_or_default();
    let options = SubscribeOptions {
        group: a.group.clone(),
        qos: Default::default(),
    };
    if a.peer.peer {
        let node = hayate_client::peer::Node::start(a.peer.options(a.auth.shm)).await?;
        let mut sub = node.subscribe_with(&expr, options).await?;
        eprintln!(
            "subscribed to {} as peer node {:016x} on {}",
            expr,
            node.id(),
            node.local_addr()
        );
        let mut n = 0u64;
        while a.count == 0 || n < a.count {
            let Some(m) = sub.next().await else {
                bail!("the subscription ended (cut as a slow consumer?)");
            };
            n += 1;
            println!("{}: {}", m.key, show_payload(&m.payload));
        }
        node.close().await;
        return Ok(());
    }
    let c = connect(&a.server, &a.auth, "hayate-sub").await?;
    let mut sub = c
        .subscribe_with(
            &expr,
            SubscribeOptions {
                group: a.group.clone(),
                qos: Default::default(),
            },
        )
        .await?;
    c.flush().await?;
    eprintln!("subscribed to {expr}");
    let mut n = 0u64;
    while a.count == 0 || n < a.count {
        let Some(m) = sub.next().await else {
            bail!(
                "connection closed: {}",
                c.last_error().map(|e| e.to_string()).unwrap_or_default()
            );
        };
        n += 1;
        println!("{}: {}", m.key, show_payload(&m.payload));
    }
    c.close().await?;
    Ok(())
}

/// A payload for the terminal: text as is, binary or very long payloads as their size.
fn show_payload(p: &[u8]) -> std::borrow::Cow<'_, str> {
    match std::str::from_utf8(p) {
        Ok(s) if p.len() <= 64 * 1024 => s.into(),
        _ => format!("<{} bytes>", p.len()).into(),
    }
}

async fn request(a: cli::RequestArgs) -> Result<()> {
    let key = Key::new(&a.key).with_context(|| format!("invalid key {:?}", a.key))?;
    let c = connect(&a.server, &a.auth, "hayate-request").await?;
    let timeout = cli::parse_duration(&a.timeout)?;
    let reply = c.request(&key, a.payload.clone(), timeout).await?;
    println!("{}", show_payload(&reply.payload));
    c.close().await?;
    Ok(())
}

async fn reply(a: cli::ReplyArgs) -> Result<()> {
    if let Some(addr) = &a.direct {
        return reply_direct(addr, &a.expr, a.count).await;
    }
    let c = connect(&a.server, &a.auth, "hayate-reply").await?;
    let mut sub = match &a.group {
        Some(g) => c.queue_subscribe(&a.expr, g).await?,
        None => c.subscribe(&a.expr).await?,
    };
    c.flush().await?;
    eprintln!("echoing requests on {}", a.expr);
    let mut n = 0u64;
    while let Some(m) = sub.next().await {
        if m.reply_to.is_some() {
            c.reply(&m, m.payload.clone()).await?;
            n += 1;
            if a.count != 0 && n >= a.count {
                break;
            }
        }
    }
    c.flush().await?;
    c.close().await?;
    Ok(())
}

/// The echo service peer to peer: a [`PeerServer`](hayate_client::peer::PeerServer) on
/// `addr`, until `count` replies (0 = until Ctrl-C).
async fn reply_direct(addr: &str, expr: &str, count: u64) -> Result<()> {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicU64, Ordering};
    let answered = Arc::new(AtomicU64::new(0));
    let done = Arc::new(tokio::sync::Notify::new());
    let (n, d) = (answered.clone(), done.clone());
    let server = hayate_client::peer::PeerServer::bind(addr, &[expr], move |m: Message| {
        let (n, d) = (n.clone(), d.clone());
        async move {
            let r = m.reply(m.payload.clone())?;
            if n.fetch_add(1, Ordering::SeqCst) + 1 == count {
                d.notify_one();
            }
            Some(r)
        }
    })
    .await
    .with_context(|| format!("listening on {addr}"))?;
    eprintln!(
        "echoing requests on {expr} directly at {}",
        server.local_addr()
    );
    tokio::select! {
        _ = done.notified() => {}
        _ = tokio::signal::ctrl_c() => {}
    }
    // Each connection writes the replies in hand before it closes.
    server.close().await;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_config_file_matches_defaults() {
        let parsed = Config::from_toml(DEFAULT_CONFIG).unwrap();
        assert_eq!(parsed, Config::default());
    }

    /// The config of the container image and the systemd unit is valid.
    #[test]
    fn packaged_config_is_valid() {
        let text = include_str!("../../../packaging/hayate.toml");
        let c = Config::from_toml(text).unwrap();
        c.validate().unwrap();
        assert_eq!(c.server.data_dir, "/var/lib/hayate");
        assert_eq!(c.admin.listen, vec!["127.0.0.1:4780".to_string()]);
    }
}
