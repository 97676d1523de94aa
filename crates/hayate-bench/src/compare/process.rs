//! The processes a comparison starts and stops: [`Cleanup`], the peer scripts, free ports.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};

use anyhow::{Context, bail};
use hayate_core::sync::lock;

#[cfg(doc)]
use super::compare;

/// A started process to stop at the end.
pub(super) enum Running {
    Child(String, Child),
    Script { script: PathBuf, port: Option<u16> },
}

/// The processes a comparison started; [`Cleanup::stop_all`] stops them (idempotent). Clone it
/// before calling [`compare`] to stop everything from a Ctrl-C handler.
#[derive(Clone, Default)]
pub struct Cleanup(Arc<Mutex<Vec<Running>>>);

impl Cleanup {
    pub(super) fn push(&self, r: Running) {
        lock(&self.0).push(r);
    }

    /// Stops every process started so far, newest first.
    pub fn stop_all(&self) {
        let running: Vec<Running> = std::mem::take(&mut *lock(&self.0));
        for r in running.into_iter().rev() {
            match r {
                Running::Child(name, mut c) => {
                    let _ = c.kill();
                    let _ = c.wait();
                    eprintln!("compare: stopped {name}");
                }
                Running::Script { script, port } => {
                    let mut args = vec!["stop".to_string()];
                    args.extend(port.map(|p| p.to_string()));
                    if let Err(e) = run_script(&script, &args) {
                        eprintln!("compare: {} stop: {e:#}", script.display());
                    }
                }
            }
        }
    }
}

/// Stops everything when dropped (error paths and panics).
pub(super) struct Guard(pub(super) Cleanup);

impl Drop for Guard {
    fn drop(&mut self) {
        self.0.stop_all();
    }
}

/// Runs `bash SCRIPT ARGS...`; stdout on success, the output tail as the error otherwise.
pub(super) fn run_script(script: &Path, args: &[String]) -> anyhow::Result<String> {
    let out = Command::new("bash")
        .arg(script)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .with_context(|| format!("running {}", script.display()))?;
    let stdout = String::from_utf8_lossy(&out.stdout).to_string();
    if !out.status.success() {
        let err = String::from_utf8_lossy(&out.stderr);
        let tail: Vec<&str> = err.lines().chain(stdout.lines()).rev().take(3).collect();
        bail!(
            "{} {} failed ({}): {}",
            script.display(),
            args.join(" "),
            out.status,
            tail.into_iter().rev().collect::<Vec<_>>().join(" / ")
        );
    }
    Ok(stdout)
}

pub(super) fn free_port() -> anyhow::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

pub(crate) struct KillOnDrop(pub(crate) Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}
