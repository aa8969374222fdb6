//! `servetune demo`: the main job out of the box on a CPU machine. Installs llama-server,
//! SmolLM2 and ShareGPT if needed (`setup`), runs the shipped study
//! (`studies/llamacpp-smollm2-sharegpt.toml`: llama-server + SmolLM2 + ShareGPT, constraints on
//! success rate and TPOT) with its progress on screen, and writes the report (Markdown with SVG
//! charts, and HTML) under the state directory, saying where. An interrupted demo resumes.

use std::path::PathBuf;

use anyhow::Context;

use crate::setup::{self, LlamaPaths};

#[derive(Debug, Clone, clap::Args)]
pub struct DemoArgs {
    /// Where the store, the trial logs and the report are written.
    #[arg(long, default_value = "state")]
    pub state_dir: PathBuf,
    /// The study to run.
    #[arg(long, default_value = "studies/llamacpp-smollm2-sharegpt.toml")]
    pub study: PathBuf,
    /// Start the study afresh instead of resuming (or re-reporting) an earlier run.
    #[arg(long)]
    pub restart: bool,
}

pub async fn run(args: DemoArgs) -> anyhow::Result<()> {
    let paths = LlamaPaths::default_paths();
    if !paths.ready() {
        eprintln!(
            "[demo] installing llama-server, SmolLM2 and ShareGPT (once; ~16 minutes on 2 cores)"
        );
    }
    let p2 = paths.clone();
    tokio::task::spawn_blocking(move || setup::llamacpp(&p2))
        .await
        .context("setup task")??;
    eprintln!(
        "[demo] tuning llama-server with {} (progress below, one line per trial)",
        args.study.display()
    );
    let rec = crate::cli::tune(&args.study, &args.state_dir, args.restart, false).await?;
    let store = crate::cli::open_store(&args.state_dir)?;
    let dir = args.state_dir.join("reports");
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let md = dir.join(format!("{}.md", rec.id));
    let html = dir.join(format!("{}.html", rec.id));
    crate::report::render(&store, &rec.id, "md", Some(&md))?;
    crate::report::render(&store, &rec.id, "html", Some(&html))?;
    eprintln!(
        "[demo] report: {} (and {}, charts beside it)",
        md.display(),
        html.display()
    );
    Ok(())
}
