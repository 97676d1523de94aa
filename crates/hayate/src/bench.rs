//! `hayate bench`: wired to the hayate-bench crate.

use clap::Args;

#[derive(Debug, Args)]
pub(crate) struct BenchArgs {}

pub(crate) async fn run(_a: BenchArgs) -> anyhow::Result<()> {
    anyhow::bail!("bench is being wired")
}
