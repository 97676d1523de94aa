//! `hayate stream ...`: stream administration on a running broker.

use anyhow::{Context, Result};
use clap::{Args, Subcommand};
use hayate_client::streams::{StreamConfig, StreamInfo};

use crate::cli::DEFAULT_SERVER;

#[derive(Debug, Args)]
pub(crate) struct StreamArgs {
    #[command(subcommand)]
    cmd: StreamCmd,
    /// Broker address (`HOST:PORT` or `unix:PATH`).
    #[arg(long, global = true, env = "HAYATE_SERVER", default_value = DEFAULT_SERVER)]
    server: String,
    /// Print JSON instead of a table.
    #[arg(long, global = true)]
    json: bool,
    #[command(flatten)]
    auth: crate::cli::ClientAuth,
}

#[derive(Debug, Subcommand)]
enum StreamCmd {
    /// Create a stream that keeps the messages of some key expressions.
    Add {
        /// Stream name (A-Z a-z 0-9 _ -, up to 64).
        name: String,
        /// A key expression to capture (repeatable; at least one).
        #[arg(long, required = true, value_name = "EXPR")]
        capture: Vec<String>,
        /// fsync policy: `always` (confirm after fsync, group commit), `interval=<ms>`
        /// (confirm once written, sync in the background) or `never`.
        #[arg(long, default_value = "interval=100")]
        fsync: String,
        /// Remove records older than this many seconds (whole segments).
        #[arg(long, value_name = "SECS")]
        max_age: Option<u64>,
        /// Keep about this many bytes (whole segments).
        #[arg(long, value_name = "BYTES")]
        max_bytes: Option<u64>,
        /// Keep about this many records (whole segments).
        #[arg(long, value_name = "N")]
        max_records: Option<u64>,
        /// Segment file size in bytes (default 128 MiB).
        #[arg(long, value_name = "BYTES")]
        segment_bytes: Option<u64>,
        /// Consumers skip messages stored longer ago than this many ms.
        #[arg(long, value_name = "MS")]
        default_ttl: Option<u64>,
        /// Work-queue retention: remove what every consumer is done with.
        #[arg(long)]
        work_queue: bool,
    },
    /// Delete a stream and its records.
    Rm {
        /// Stream name.
        name: String,
    },
    /// List the streams.
    Ls,
    /// Show one stream.
    Info {
        /// Stream name.
        name: String,
    },
    /// Remove every record of a stream (offsets go on).
    Purge {
        /// Stream name.
        name: String,
    },
}

fn show(info: &[StreamInfo], json: bool) -> Result<()> {
    if json {
        println!("{}", serde_json::to_string_pretty(info)?);
        return Ok(());
    }
    println!(
        "{:<20} {:>12} {:>12} {:>14} {:>9}  {:<14} capture",
        "name", "first", "next", "bytes", "segments", "fsync"
    );
    for i in info {
        println!(
            "{:<20} {:>12} {:>12} {:>14} {:>9}  {:<14} {}",
            i.config.name,
            i.first,
            i.next,
            i.bytes,
            i.segments,
            i.config.fsync,
            i.config.capture.join(" ")
        );
    }
    Ok(())
}

pub(crate) async fn run(a: StreamArgs) -> Result<()> {
    let c = hayate_client::Client::connect_with(&a.server, a.auth.options("hayate-stream"))
        .await
        .with_context(|| format!("cannot connect to {}", crate::redact(&a.server)))?;
    let s = c.streams();
    match a.cmd {
        StreamCmd::Add {
            name,
            capture,
            fsync,
            max_age,
            max_bytes,
            max_records,
            segment_bytes,
            default_ttl,
            work_queue,
        } => {
            let config = StreamConfig {
                name,
                capture,
                fsync,
                max_age_secs: max_age,
                max_bytes,
                max_records,
                segment_bytes,
                default_ttl_ms: default_ttl,
                work_queue,
                owner: None,
            };
            let (info, created) = s.add(&config).await?;
            if !a.json {
                println!(
                    "{} {}",
                    if created { "created" } else { "exists" },
                    info.config.name
                );
            }
            show(&[info], a.json)?;
        }
        StreamCmd::Rm { name } => {
            s.remove(&name).await?;
            println!("deleted {name}");
        }
        StreamCmd::Ls => show(&s.list().await?, a.json)?,
        StreamCmd::Info { name } => show(&[s.info(&name).await?], a.json)?,
        StreamCmd::Purge { name } => {
            let r = s.purge(&name).await?;
            println!(
                "purged {name}: {} records, {} bytes, {} segments",
                r.records, r.bytes, r.segments
            );
        }
    }
    c.close().await?;
    Ok(())
}
