//! The `servetune` binary: command-line parsing and dispatch into the library, nothing else.

use std::process::ExitCode;

use clap::{Parser, Subcommand};

use servetune::bench::args::BenchArgs;
use servetune::mock::MockConfig;
use servetune::setup::{self, LlamaPaths};

#[derive(Parser)]
#[command(
    name = "servetune",
    version,
    about = "Tunes LLM serving engines by measurement"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Benchmark an OpenAI-compatible server (a drop-in for `vllm bench serve`).
    Bench(Box<BenchArgs>),
    /// The main job on the CPU default: set up llama-server + SmolLM2, benchmark it with ShareGPT.
    Demo(servetune::demo::DemoArgs),
    /// Run the mock OpenAI-compatible engine.
    MockEngine {
        #[arg(long, default_value = "127.0.0.1")]
        host: String,
        #[arg(long, default_value_t = 8000)]
        port: u16,
        #[command(flatten)]
        cfg: MockConfig,
    },
    /// Install a real engine and its assets into the cache.
    Setup {
        #[command(subcommand)]
        what: SetupWhat,
    },
}

#[derive(Subcommand)]
enum SetupWhat {
    /// llama-server (CPU build), SmolLM2-135M-Instruct GGUF and the ShareGPT file.
    Llamacpp {
        /// Print the installed paths as KEY=VALUE lines and exit (fails if anything is missing).
        #[arg(long)]
        print_paths: bool,
    },
}

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("SERVETUNE_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .init();
    let cli = Cli::parse();
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let result: anyhow::Result<u8> = rt.block_on(async move {
        match cli.command {
            Command::Bench(args) => {
                args.execute().await?;
                Ok(0)
            }
            Command::Demo(args) => {
                servetune::demo::run(args).await?;
                Ok(0)
            }
            Command::MockEngine { host, port, cfg } => {
                Ok(servetune::mock::run_cli(&host, port, cfg).await? as u8)
            }
            Command::Setup {
                what: SetupWhat::Llamacpp { print_paths },
            } => {
                let paths = LlamaPaths::default_paths();
                if print_paths {
                    if !paths.ready() {
                        anyhow::bail!(
                            "llama.cpp assets are not all installed under {}; run `servetune setup llamacpp`",
                            paths.root.display()
                        );
                    }
                } else {
                    tokio::task::spawn_blocking(move || setup::llamacpp(&paths)).await??;
                }
                let p = LlamaPaths::default_paths();
                println!("LLAMA_SERVER={}", p.server.display());
                println!("SMOLLM2_GGUF={}", p.model.display());
                println!("SHAREGPT_JSON={}", p.sharegpt.display());
                Ok(0)
            }
        }
    });
    match result {
        Ok(code) => ExitCode::from(code),
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
