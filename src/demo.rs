//! `servetune demo`: the main job out of the box on a CPU machine. Installs llama-server,
//! SmolLM2 and ShareGPT if needed (`setup`), launches llama-server through the engine process
//! primitive, benchmarks it with ShareGPT, saves the result under the state directory and tears
//! the engine down, verifying that nothing is left running.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;

use crate::bench::args::BenchArgs;
use crate::engine::process::{free_port, EngineProcess};
use crate::setup::{self, LlamaPaths};

#[derive(Debug, Clone, clap::Args)]
pub struct DemoArgs {
    /// Where logs and results are written.
    #[arg(long, default_value = "state")]
    pub state_dir: PathBuf,
    /// ShareGPT prompts to send.
    #[arg(long, default_value_t = 48)]
    pub num_prompts: usize,
    /// llama-server parallel slots, and the client's concurrency.
    #[arg(long, default_value_t = 8)]
    pub parallel: usize,
    /// Output tokens per request.
    #[arg(long, default_value_t = 64)]
    pub output_len: u64,
}

pub async fn run(args: DemoArgs) -> anyhow::Result<()> {
    let paths = LlamaPaths::default_paths();
    let p2 = paths.clone();
    let paths = tokio::task::spawn_blocking(move || setup::llamacpp(&p2))
        .await
        .context("setup task")??;
    let logs = args.state_dir.join("logs");
    let results = args.state_dir.join("results");
    for d in [&logs, &results] {
        std::fs::create_dir_all(d).with_context(|| format!("creating {}", d.display()))?;
    }
    let port = free_port().context("finding a free port")?;
    let log = logs.join(format!(
        "llama-server-{}.log",
        crate::util::timestamp_compact(std::time::SystemTime::now())
    ));
    let ctx = 2048 * args.parallel;
    let argv: Vec<String> = vec![
        paths.server.display().to_string(),
        "-m".into(),
        paths.model.display().to_string(),
        "-np".into(),
        args.parallel.to_string(),
        "-c".into(),
        ctx.to_string(),
        "--host".into(),
        "127.0.0.1".into(),
        "--port".into(),
        port.to_string(),
    ];
    eprintln!("[demo] launching: {}", argv.join(" "));
    let mut engine = EngineProcess::spawn(&argv, &[], &log)?;
    let base = format!("http://127.0.0.1:{port}");
    // The engine runs in its own process group, so Ctrl-C does not reach it: every await below
    // races the signal, and a signal tears the engine down before servetune exits.
    let health = format!("{base}/health");
    let ready = tokio::select! {
        r = engine.wait_http_ok(&health, Duration::from_secs(180)) => r,
        _ = crate::signals::terminated() => {
            engine.terminate(Duration::from_secs(10))?;
            anyhow::bail!("interrupted; llama-server stopped");
        }
    };
    ready?;
    eprintln!("[demo] llama-server ready (log: {})", log.display());
    let flags: Vec<String> = vec![
        "--base-url".into(),
        base,
        "--dataset-name".into(),
        "sharegpt".into(),
        "--dataset-path".into(),
        paths.sharegpt.display().to_string(),
        "--allow-truncated".into(),
        "--num-prompts".into(),
        args.num_prompts.to_string(),
        "--sharegpt-output-len".into(),
        args.output_len.to_string(),
        "--ignore-eos".into(),
        "--max-concurrency".into(),
        args.parallel.to_string(),
        "--percentile-metrics".into(),
        "ttft,tpot,itl,e2el".into(),
        "--metric-percentiles".into(),
        "50,90,99".into(),
        "--save-result".into(),
        "--result-dir".into(),
        results.display().to_string(),
        "--label".into(),
        "demo-llama-server".into(),
    ];
    let bench = BenchArgs::from_flags(&flags)?;
    let outcome = tokio::select! {
        o = bench.execute() => o,
        _ = crate::signals::terminated() => {
            engine.terminate(Duration::from_secs(10))?;
            anyhow::bail!("interrupted; llama-server stopped");
        }
    };
    // Tear down before reporting, whatever the benchmark did.
    let pgid = engine.pgid();
    engine.terminate(Duration::from_secs(10))?;
    eprintln!("[demo] llama-server (process group {pgid}) stopped; nothing left running");
    let outcome = outcome?;
    eprintln!(
        "[demo] {} requests, {:.1} total tok/s; results in {}",
        outcome.summary.completed,
        outcome.summary.total_token_throughput,
        results.display()
    );
    Ok(())
}
