//! The server of a point in a child process: [`ChildServer`] starts and stops it from the
//! benchmark's side; [`serve_rpc_point`] is what the child runs.

use std::io::Write as _;
use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use serde::{Deserialize, Serialize};
use tokio::io::{AsyncBufReadExt, AsyncReadExt};

#[cfg(doc)]
use super::ServerPlacement;
use super::server::start_server;
use crate::target::Target;
use crate::with_runtime;

/// What `bench rpc-server` writes on its one line of stdout, as JSON.
#[derive(Debug, Default, PartialEq, Serialize, Deserialize)]
pub(super) struct ReadyLine {
    /// Where the callers find the server (ZeroMQ, gRPC, Zenoh peer mode).
    #[serde(default)]
    pub(super) endpoint: Option<String>,
    /// The server's version, when known.
    #[serde(default)]
    pub(super) version: Option<String>,
    /// Set (and nothing served) when the server could not start.
    #[serde(default)]
    error: Option<String>,
}

/// How long a child server may take to start (Kafka creates a topic).
const CHILD_READY_TIMEOUT: Duration = Duration::from_secs(60);
/// How long a child server may take to stop after its stdin closed, before it is killed.
const CHILD_STOP_TIMEOUT: Duration = Duration::from_secs(10);

/// The serving side of a point in a child process. Dropped without [`ChildServer::stop`] (an
/// error, a timeout, a panic), it kills the child.
pub(super) struct ChildServer {
    child: Option<tokio::process::Child>,
    /// Closing it tells the child to stop.
    stdin: Option<tokio::process::ChildStdin>,
    pub(super) ready: ReadyLine,
}

impl ChildServer {
    /// `EXE bench rpc-server --target URL --prefix PREFIX`.
    pub(super) fn command(exe: &Path, target: &Target, prefix: &str) -> tokio::process::Command {
        let mut cmd = tokio::process::Command::new(exe);
        cmd.args(["bench", "rpc-server", "--target"])
            .arg(target.to_string())
            .args(["--prefix", prefix]);
        cmd
    }

    /// Starts `cmd` (stdin and stdout piped, stderr inherited) and waits for its ready line.
    pub(super) async fn start(mut cmd: tokio::process::Command) -> anyhow::Result<ChildServer> {
        let mut child = cmd
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true)
            .spawn()
            .with_context(|| {
                format!(
                    "rpc: starting the server process {}",
                    cmd.as_std().get_program().to_string_lossy()
                )
            })?;
        let stdin = child.stdin.take();
        let stdout = child.stdout.take();
        let mut server = ChildServer {
            child: Some(child),
            stdin,
            ready: ReadyLine::default(),
        };
        let mut lines = tokio::io::BufReader::new(stdout.context("rpc: no server stdout")?).lines();
        let line = tokio::time::timeout(CHILD_READY_TIMEOUT, async {
            loop {
                match lines.next_line().await? {
                    Some(l) if l.trim_start().starts_with('{') => return anyhow::Ok(Some(l)),
                    Some(l) => eprintln!("rpc server: {l}"),
                    None => return Ok(None),
                }
            }
        })
        .await
        .with_context(|| {
            format!("rpc: the server process was not ready within {CHILD_READY_TIMEOUT:?}")
        })??;
        let Some(line) = line else {
            let status = match server.child.as_mut() {
                Some(c) => tokio::time::timeout(Duration::from_secs(5), c.wait())
                    .await
                    .ok()
                    .and_then(Result::ok)
                    .map(|s| s.to_string()),
                None => None,
            };
            bail!(
                "rpc: the server process ended before it was ready ({})",
                status.unwrap_or_else(|| "still running".into())
            );
        };
        server.ready = serde_json::from_str(&line)
            .with_context(|| format!("rpc: the server process said {line:?}"))?;
        if let Some(e) = &server.ready.error {
            bail!("rpc server: {e}");
        }
        // Keep reading the child's stdout (to stderr): a closed pipe would fail its next
        // write.
        tokio::spawn(async move {
            while let Ok(Some(l)) = lines.next_line().await {
                eprintln!("rpc server: {l}");
            }
        });
        Ok(server)
    }

    /// Closes the child's stdin and waits for it to exit (killed after a timeout).
    pub(super) async fn stop(mut self) {
        drop(self.stdin.take());
        let Some(mut child) = self.child.take() else {
            return;
        };
        match tokio::time::timeout(CHILD_STOP_TIMEOUT, child.wait()).await {
            Ok(Ok(s)) if s.success() => {}
            Ok(Ok(s)) => tracing::warn!("rpc: the server process ended with {s}"),
            Ok(Err(e)) => tracing::warn!("rpc: waiting for the server process: {e}"),
            Err(_) => {
                tracing::warn!(
                    "rpc: the server process did not stop within {CHILD_STOP_TIMEOUT:?}: killed"
                );
                let _ = child.kill().await;
            }
        }
    }
}

impl Drop for ChildServer {
    fn drop(&mut self) {
        let Some(mut child) = self.child.take() else {
            return;
        };
        // Killed and reaped here when possible (kill_on_drop would also kill it, but leave
        // reaping to the runtime).
        let _ = child.start_kill();
        let deadline = Instant::now() + Duration::from_secs(2);
        while Instant::now() < deadline {
            match child.try_wait() {
                Ok(Some(_)) | Err(_) => return,
                Ok(None) => std::thread::sleep(Duration::from_millis(10)),
            }
        }
        tracing::warn!("rpc: the server process was killed but has not exited yet");
    }
}

/// The serving side of one RPC point, in this process: what `hayate bench rpc-server
/// --target URL --prefix PREFIX` runs (see [`ServerPlacement::Child`]). Starts the server of
/// `target` under the key prefix `prefix`, writes one JSON line to stdout
/// (`{"endpoint":...,"version":...,"error":null}`; `error` set when the server could not
/// start), then serves until stdin is closed (or reaches its end) and stops the server.
pub fn serve_rpc_point(target: &Target, prefix: &str) -> anyhow::Result<()> {
    if !target.available() {
        bail!(
            "rpc: the {} driver is not compiled in",
            target.system.name()
        );
    }
    with_runtime(|rt| {
        rt.block_on(async {
            let started = start_server(target, prefix).await;
            let ready = match &started {
                Ok(s) => ReadyLine {
                    endpoint: s.endpoint.clone(),
                    version: s.version(),
                    error: None,
                },
                Err(e) => ReadyLine {
                    error: Some(format!("{e:#}")),
                    ..ReadyLine::default()
                },
            };
            {
                let mut out = std::io::stdout().lock();
                writeln!(out, "{}", serde_json::to_string(&ready)?)?;
                out.flush()?;
            }
            let server = started?;
            // Serve until the parent closes stdin (or ends: its end of the pipe closes too).
            let mut stdin = tokio::io::stdin();
            let mut buf = [0u8; 256];
            loop {
                match stdin.read(&mut buf).await {
                    Ok(0) | Err(_) => break,
                    Ok(_) => {}
                }
            }
            server.stop().await;
            Ok(())
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Runs a child server that is `sh -c SCRIPT`.
    #[cfg(unix)]
    async fn sh_server(script: &str) -> anyhow::Result<ChildServer> {
        let mut cmd = tokio::process::Command::new("sh");
        cmd.arg("-c").arg(script);
        ChildServer::start(cmd).await
    }

    #[cfg(unix)]
    fn gone(pid: u32) -> bool {
        !Path::new(&format!("/proc/{pid}")).exists()
    }

    #[cfg(unix)]
    #[test]
    fn child_servers_are_stopped_or_killed() {
        with_runtime(|rt| {
            rt.block_on(async {
                // Dropped (an error or a timeout of the point): killed and reaped at once.
                let s = sh_server(
                    "echo 'a log line'; \
                     echo '{\"endpoint\":\"tcp://127.0.0.1:1\",\"version\":\"v1\"}'; \
                     exec sleep 600",
                )
                .await?;
                assert_eq!(s.ready.endpoint.as_deref(), Some("tcp://127.0.0.1:1"));
                assert_eq!(s.ready.version.as_deref(), Some("v1"));
                let pid = s.child.as_ref().and_then(|c| c.id()).context("pid")?;
                assert!(!gone(pid));
                drop(s);
                assert!(gone(pid), "the dropped child {pid} still exists");

                // stop(): the child ends when its stdin closes.
                let s = sh_server("echo '{}'; cat >/dev/null").await?;
                assert_eq!(s.ready, ReadyLine::default());
                let pid = s.child.as_ref().and_then(|c| c.id()).context("pid")?;
                let t = Instant::now();
                s.stop().await;
                assert!(gone(pid));
                assert!(t.elapsed() < CHILD_STOP_TIMEOUT);

                // A server that could not start says why.
                let e = sh_server("echo '{\"error\":\"no broker here\"}'; exit 1")
                    .await
                    .err()
                    .context("an error")?;
                assert!(format!("{e:#}").contains("no broker here"), "{e:#}");
                // One that ends without a word.
                let e = sh_server("exit 3").await.err().context("an error")?;
                assert!(
                    format!("{e:#}").contains("ended before it was ready"),
                    "{e:#}"
                );
                Ok(())
            })
        })
        .unwrap();
    }

    #[test]
    fn ready_line_is_json() {
        let r = ReadyLine {
            endpoint: Some("http://127.0.0.1:5000".into()),
            version: None,
            error: None,
        };
        let s = serde_json::to_string(&r).unwrap();
        assert!(!s.contains('\n'));
        assert_eq!(serde_json::from_str::<ReadyLine>(&s).unwrap(), r);
        assert_eq!(
            serde_json::from_str::<ReadyLine>("{}").unwrap(),
            ReadyLine::default()
        );
    }
}
