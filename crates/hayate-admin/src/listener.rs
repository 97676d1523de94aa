//! The admin listener's accept loop: each connection gets a slot (`slots.rs`) and is served
//! by hyper with the routes (`api.rs`); the sampler (`dashboard.rs`) runs beside it.

use std::sync::Arc;

use tokio::net::TcpListener;
use tokio::sync::watch;

use super::api::{probe_routes, router};
use super::dashboard::sample;
use super::slots::{ConnState, Kind, Marked, Release, Slot, Watched};
use super::{AdminState, HEADER_TIMEOUT, MAX_HEAD, PROBE_TIMEOUT, Peer, SEND_BUFFER};

/// Serves the admin API on `listener` until `stop` changes.
pub async fn serve(listener: TcpListener, state: AdminState, mut stop: watch::Receiver<bool>) {
    let (app, shared) = router(state);
    let slots = shared.slots.clone();
    let probes = probe_routes(shared.clone());
    // The sampler: rates once a second, for as long as the listener serves.
    let sampler = tokio::spawn(async move {
        let mut every = tokio::time::interval(std::time::Duration::from_secs(1));
        every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            every.tick().await;
            sample(&shared);
        }
    });
    // hyper's HTTP/1 server with a timer, so that its header read timeout holds: a client
    // that sends a request's head slowly, or keeps a connection idle between requests, is
    // cut off after HEADER_TIMEOUT instead of holding one of the MAX_CONNECTIONS slots.
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(hyper_util::rt::TokioTimer::new())
        .header_read_timeout(HEADER_TIMEOUT)
        .max_buf_size(MAX_HEAD);
    // A spare slot's connection: one request, whose head must come within PROBE_TIMEOUT.
    let mut probe_http = hyper::server::conn::http1::Builder::new();
    probe_http
        .timer(hyper_util::rt::TokioTimer::new())
        .header_read_timeout(PROBE_TIMEOUT)
        .max_buf_size(MAX_HEAD)
        .keep_alive(false);
    let mut conns = tokio::task::JoinSet::new();
    // Once a second, connections whose writes have been blocked for WRITE_TIMEOUT are closed.
    let mut sweep = tokio::time::interval(std::time::Duration::from_secs(1));
    sweep.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        let (s, addr) = tokio::select! {
            _ = stop.changed() => break,
            Some(_) = conns.join_next(), if !conns.is_empty() => continue,
            _ = sweep.tick() => {
                let stalled = slots.lock().take_stalled();
                for c in stalled {
                    c.abort();
                }
                continue;
            }
            c = accept(&listener) => c,
        };
        // The slot is taken under the table's lock, the task spawned after it: a task
        // spawned while the runtime shuts down is dropped at once, inside `spawn`, and its
        // `Release` takes that lock (a spawn under it deadlocked the listener's shutdown).
        let (kind, id, state, cut) = {
            let mut table = slots.lock();
            let (kind, cut) = table.make_room();
            let Some(kind) = kind else {
                // Every slot, spare ones included, is in a request: closed at once.
                continue;
            };
            let id = table.next_id();
            let state = Arc::new(ConnState::new());
            table.insert(
                kind,
                id,
                Slot {
                    state: state.clone(),
                    abort: None,
                },
            );
            (kind, id, state, cut)
        };
        let io = hyper_util::rt::TokioIo::new(Watched {
            s,
            state: state.clone(),
        });
        let release = Release {
            slots: slots.clone(),
            id,
        };
        let abort = match kind {
            Kind::Served => {
                let app = app
                    .clone()
                    .layer(axum::Extension(axum::extract::ConnectInfo(Peer(addr))));
                let conn = http.serve_connection(io, Marked::new(app, state));
                conns.spawn(async move {
                    let _release = release;
                    if let Err(e) = conn.await {
                        tracing::debug!(peer = %addr, "admin connection: {e}");
                    }
                })
            }
            Kind::Spare => {
                let conn = probe_http.serve_connection(io, Marked::new(probes.clone(), state));
                conns.spawn(async move {
                    let _release = release;
                    if let Err(e) = conn.await {
                        tracing::debug!(peer = %addr, "admin connection (spare slot): {e}");
                    }
                })
            }
        };
        // Only this loop takes slots out (make_room, take_stalled), so the handle is in
        // place before anyone may need it; a task already ended has removed its slot.
        slots.lock().set_abort(kind, id, abort);
        if let Some(cut) = cut {
            cut.abort();
        }
        // The connection's task reads what it was sent before the next accept: a client
        // that sent its request with its connection is never taken for an idle one.
        tokio::task::yield_now().await;
    }
    conns.abort_all();
    sampler.abort();
}

/// The next connection (an accept that fails is retried after 50 ms).
async fn accept(listener: &TcpListener) -> (tokio::net::TcpStream, std::net::SocketAddr) {
    loop {
        match listener.accept().await {
            Ok((s, a)) => {
                let _ = s.set_nodelay(true);
                // A fixed send buffer (no autotuning up to tcp_wmem's 4 MiB): what a client
                // that reads nothing pins in the kernel is bounded, and its writes block soon.
                let _ = socket2::SockRef::from(&s).set_send_buffer_size(SEND_BUFFER);
                return (s, a);
            }
            Err(e) => {
                tracing::debug!("admin listener: accept failed: {e}");
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
            }
        }
    }
}
