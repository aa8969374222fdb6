//! `servetune bench` command-line flags: a drop-in for `vllm bench serve` (same names and
//! defaults where a flag means the same; see vllm/benchmarks/serve.py `add_cli_args`), plus
//! servetune's own (closed loop, early abort, truncated-file handling). Raw flags are turned
//! into a validated [`BenchPlan`] here; nothing is sent before every flag has been checked.

use std::path::PathBuf;
use std::time::{Duration, SystemTime};

use clap::{Args, ValueEnum};
use serde_json::{Map, Value};

use super::abort::{AbortPolicy, LatencyLimit};
use super::client::{MaxTokensField, RequestApi, RequestTemplate};
use super::dataset::{random::RandomSpec, sharegpt, SampleRequest};
use super::metrics::{GoodputSlo, Metric, SummaryConfig};
use super::output::{self, RunInfo};
use super::{BenchError, BenchOutcome, BenchPlan, LoadShape};
use crate::tokenizer::{RemoteTokenizer, Tokenizer, WordTokenizer};

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum DatasetName {
    /// ShareGPT V3 conversations (`--dataset-path` to the JSON file).
    Sharegpt,
    /// Random token prompts of exact length; `--random-prefix-len` adds a shared prefix.
    Random,
}

#[derive(Debug, Clone, Args)]
pub struct BenchArgs {
    /// API flavour: `openai` (/v1/completions) or `openai-chat` (/v1/chat/completions).
    #[arg(long, value_enum, default_value = "openai")]
    pub backend: RequestApi,
    /// Server base URL, e.g. http://127.0.0.1:8080 (overrides --host/--port).
    #[arg(long)]
    pub base_url: Option<String>,
    #[arg(long, default_value = "127.0.0.1")]
    pub host: String,
    #[arg(long, default_value_t = 8000)]
    pub port: u16,
    /// API path; defaults to the backend's (/v1/completions or /v1/chat/completions).
    #[arg(long)]
    pub endpoint: Option<String>,
    /// Model name; by default the first model the server lists at /v1/models.
    #[arg(long)]
    pub model: Option<String>,
    /// Model name to put in requests, when it differs from --model.
    #[arg(long)]
    pub served_model_name: Option<String>,
    /// Tokenizer name, recorded in the results. Tokens are counted by the server's own
    /// /tokenize endpoint; `words` selects the built-in word tokenizer (mock engine, offline).
    #[arg(long)]
    pub tokenizer: Option<String>,
    #[arg(long, value_enum, default_value = "random")]
    pub dataset_name: DatasetName,
    #[arg(long)]
    pub dataset_path: Option<PathBuf>,
    /// Use the complete records of a truncated ShareGPT file instead of failing.
    #[arg(long)]
    pub allow_truncated: bool,
    #[arg(long, default_value_t = 1000)]
    pub num_prompts: usize,
    /// Requests per second (`inf` sends all at once).
    #[arg(long, default_value = "inf", value_parser = parse_rate, allow_negative_numbers = true)]
    pub request_rate: f64,
    /// Gamma shape of the arrival gaps: 1 = Poisson, < 1 burstier, > 1 more regular.
    #[arg(long, default_value_t = 1.0, allow_negative_numbers = true)]
    pub burstiness: f64,
    #[arg(long)]
    pub max_concurrency: Option<usize>,
    /// Closed loop: --max-concurrency workers, each sending its next request when the last ends.
    #[arg(long)]
    pub closed_loop: bool,
    /// Warm-up requests before the measured run (excluded from results).
    #[arg(long, default_value_t = 0)]
    pub num_warmups: usize,
    #[arg(long, default_value_t = 1024)]
    pub random_input_len: u64,
    #[arg(long, default_value_t = 128)]
    pub random_output_len: u64,
    #[arg(long, default_value_t = 0.0)]
    pub random_range_ratio: f64,
    #[arg(long, default_value_t = 0)]
    pub random_prefix_len: u64,
    /// Vocabulary size for random prompts when the server does not report it.
    #[arg(long)]
    pub random_vocab_size: Option<u32>,
    /// Output length for every ShareGPT request instead of the reference completion's.
    #[arg(long)]
    pub sharegpt_output_len: Option<u64>,
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Ask the server to ignore EOS (always on for random prompts, as in vLLM).
    #[arg(long)]
    pub ignore_eos: bool,
    /// Goodput SLOs, e.g. `--goodput ttft:500 tpot:50` (milliseconds).
    #[arg(long, num_args = 1..)]
    pub goodput: Vec<String>,
    /// Metrics to report percentiles for (ttft,tpot,itl,e2el).
    #[arg(long, default_value = "ttft,tpot,itl")]
    pub percentile_metrics: String,
    /// Percentiles to report, comma-separated, e.g. "50,90,99".
    #[arg(long, default_value = "99")]
    pub metric_percentiles: String,
    #[arg(long)]
    pub save_result: bool,
    /// Keep per-request records (and generated texts) in the result JSON.
    #[arg(long)]
    pub save_detailed: bool,
    #[arg(long)]
    pub result_dir: Option<PathBuf>,
    #[arg(long)]
    pub result_filename: Option<String>,
    #[arg(long)]
    pub label: Option<String>,
    #[arg(long)]
    pub temperature: Option<f64>,
    /// Extra JSON object merged into every request body.
    #[arg(long)]
    pub extra_body: Option<String>,
    /// Output-length field: max_tokens, max_completion_tokens or both
    /// (default: max_tokens for openai, max_completion_tokens for openai-chat).
    #[arg(long, value_enum)]
    pub max_tokens_field: Option<MaxTokensField>,
    /// Per-request time limit in seconds.
    #[arg(long, default_value_t = 600.0, allow_negative_numbers = true)]
    pub request_timeout: f64,
    /// Early abort: stop once this success rate (0..1) can no longer be reached.
    #[arg(long, allow_negative_numbers = true)]
    pub min_success_rate: Option<f64>,
    /// Early abort on a latency limit METRIC:STAT:MS, e.g. `tpot:mean:50`, `ttft:p99:2000`.
    #[arg(long = "slo")]
    pub slo: Vec<String>,
    /// Samples needed before a latency limit may abort the run.
    #[arg(long, default_value_t = 20)]
    pub abort_min_samples: usize,
    /// One-sided confidence that a latency limit is breached before aborting.
    #[arg(long, default_value_t = 0.99)]
    pub abort_confidence: f64,
    /// No progress bar.
    #[arg(long)]
    pub disable_tqdm: bool,
}

#[derive(clap::Parser)]
struct FlagsOnly {
    #[command(flatten)]
    args: BenchArgs,
}

impl BenchArgs {
    /// Parses `servetune bench` flags from a list (for callers that build a run in code).
    pub fn from_flags<S: AsRef<str>>(flags: &[S]) -> Result<BenchArgs, clap::Error> {
        use clap::Parser;
        let argv = std::iter::once("bench").chain(flags.iter().map(|s| s.as_ref()));
        FlagsOnly::try_parse_from(argv).map(|f| f.args)
    }
}

fn parse_rate(s: &str) -> Result<f64, String> {
    let v: f64 = match s.trim() {
        "inf" | "Inf" | "infinity" => f64::INFINITY,
        x => x
            .parse()
            .map_err(|_| format!("not a number or 'inf': {x:?}"))?,
    };
    if v > 1e-6 {
        Ok(v)
    } else {
        Err(format!("request rate must be > 0 (at least 1e-6), got {s}"))
    }
}

fn parse_goodput(items: &[String]) -> Result<GoodputSlo, BenchError> {
    let mut g = GoodputSlo::default();
    for item in items.iter().flat_map(|s| s.split_whitespace()) {
        let (k, v) = item.split_once(':').ok_or_else(|| {
            BenchError::Config(format!(
                "--goodput {item:?}: expected KEY:MS such as ttft:500"
            ))
        })?;
        let v: f64 = v.parse().ok().filter(|v: &f64| *v >= 0.0).ok_or_else(|| {
            BenchError::Config(format!(
                "--goodput {item:?}: {v:?} is not a non-negative number of ms"
            ))
        })?;
        match k {
            "ttft" => g.ttft_ms = Some(v),
            "tpot" => g.tpot_ms = Some(v),
            "e2el" => g.e2el_ms = Some(v),
            _ => {
                return Err(BenchError::Config(format!(
                    "--goodput {item:?}: unknown metric {k:?} (ttft, tpot or e2el)"
                )))
            }
        }
    }
    Ok(g)
}

fn parse_metrics(s: &str) -> Result<Vec<Metric>, BenchError> {
    s.split(',')
        .filter(|x| !x.trim().is_empty())
        .map(|x| {
            Metric::parse(x).ok_or_else(|| {
                BenchError::Config(format!(
                    "--percentile-metrics: unknown metric {x:?} (ttft, tpot, itl, e2el)"
                ))
            })
        })
        .collect()
}

fn parse_percentiles(s: &str) -> Result<Vec<f64>, BenchError> {
    s.split(',')
        .filter(|x| !x.trim().is_empty())
        .map(|x| {
            x.trim()
                .parse::<f64>()
                .ok()
                .filter(|p| (0.0..=100.0).contains(p))
                .ok_or_else(|| {
                    BenchError::Config(format!(
                        "--metric-percentiles: {x:?} is not a percentile in [0, 100]"
                    ))
                })
        })
        .collect()
}

impl BenchArgs {
    pub fn base_url(&self) -> String {
        match &self.base_url {
            Some(u) => u.trim_end_matches('/').to_owned(),
            None => format!("http://{}:{}", self.host, self.port),
        }
    }

    /// Checks every flag that needs no network access.
    pub fn validate(&self) -> Result<(), BenchError> {
        let cfg = |m: String| Err(BenchError::Config(m));
        if self.burstiness.is_nan() || self.burstiness <= 0.0 {
            return cfg(format!("--burstiness must be > 0, got {}", self.burstiness));
        }
        if self.max_concurrency == Some(0) {
            return cfg("--max-concurrency must be at least 1".into());
        }
        if !self.request_timeout.is_finite()
            || self.request_timeout <= 0.0
            || self.request_timeout > 1e7
        {
            return cfg(format!(
                "--request-timeout must be a finite number of seconds in (0, 1e7], got {}",
                self.request_timeout
            ));
        }
        if let Some(v) = self.random_vocab_size {
            if v < 2 {
                return cfg(format!("--random-vocab-size must be at least 2, got {v}"));
            }
        }
        if self.sharegpt_output_len.is_some_and(|n| n > 1_000_000)
            || self.random_output_len > 1_000_000
        {
            return cfg("output lengths above 1,000,000 tokens are not supported".into());
        }
        if self.random_input_len > 10_000_000 || self.random_prefix_len > 10_000_000 {
            return cfg("input lengths above 10,000,000 tokens are not supported".into());
        }
        if let Some(r) = self.min_success_rate {
            if !(0.0..=1.0).contains(&r) {
                return cfg(format!(
                    "--min-success-rate is a fraction in [0, 1], got {r} (use 0.99 for 99%)"
                ));
            }
        }
        if !(0.5..1.0).contains(&self.abort_confidence) {
            return cfg("--abort-confidence must be in [0.5, 1)".into());
        }
        if self.dataset_name == DatasetName::Sharegpt && self.dataset_path.is_none() {
            return cfg("--dataset-name sharegpt needs --dataset-path (the ShareGPT_V3 JSON; `servetune setup llamacpp` installs one)".into());
        }
        if self.dataset_name == DatasetName::Random && self.dataset_path.is_some() {
            return cfg("--dataset-path is not used by --dataset-name random".into());
        }
        if let Some(u) = &self.base_url {
            if !u.starts_with("http://") {
                return cfg(format!("--base-url {u:?}: only http:// URLs are supported (engines are benchmarked on the node itself)"));
            }
        }
        parse_goodput(&self.goodput)?;
        parse_metrics(&self.percentile_metrics)?;
        parse_percentiles(&self.metric_percentiles)?;
        self.extra_body()?;
        for s in &self.slo {
            LatencyLimit::parse(s).map_err(BenchError::Config)?;
        }
        Ok(())
    }

    fn extra_body(&self) -> Result<Map<String, Value>, BenchError> {
        match &self.extra_body {
            None => Ok(Map::new()),
            Some(s) => match serde_json::from_str::<Value>(s) {
                Ok(Value::Object(m)) => Ok(m),
                _ => Err(BenchError::Config(format!(
                    "--extra-body must be a JSON object, got {s:?}"
                ))),
            },
        }
    }

    pub fn abort_policy(&self) -> Result<AbortPolicy, BenchError> {
        Ok(AbortPolicy {
            min_success_rate: self.min_success_rate,
            limits: self
                .slo
                .iter()
                .map(|s| LatencyLimit::parse(s))
                .collect::<Result<_, _>>()
                .map_err(BenchError::Config)?,
            min_samples: self.abort_min_samples,
            confidence: self.abort_confidence,
        })
    }

    /// Builds the plan: resolves the model, loads and samples the dataset.
    pub async fn prepare(&self) -> Result<(BenchPlan, RunInfo), BenchError> {
        self.prepare_with(None).await
    }

    /// As `prepare`, reusing requests sampled before with the same dataset flags (a study runs
    /// one workload against many engines; sampling ShareGPT again each time would only cost).
    pub async fn prepare_with(
        &self,
        cached: Option<Vec<SampleRequest>>,
    ) -> Result<(BenchPlan, RunInfo), BenchError> {
        self.validate()?;
        let base = self.base_url();
        // The server's model list, fetched once: it names the default model and, for vLLM and
        // SGLang, the directory of the served model's tokenizer.
        let listing = if self.model.is_none() || self.tokenizer.is_none() {
            Some(list_models(&base).await)
        } else {
            None
        };
        let model = match (&self.model, &listing) {
            (Some(m), _) => m.clone(),
            (None, Some(l)) => first_model(l)?,
            (None, None) => unreachable!("listed when --model is absent"),
        };
        let served = self
            .served_model_name
            .clone()
            .unwrap_or_else(|| model.clone());
        let tokenizer = match self.tokenizer.as_deref() {
            Some("words") => Tokenizer::Words(WordTokenizer {
                vocab_size: self.random_vocab_size.unwrap_or(32_000),
            }),
            Some(name) => match crate::tokenizer::load_local(name)? {
                Some(t) => Tokenizer::Hf(t),
                None => {
                    tracing::warn!(
                        "tokenizer {name:?} is neither a local directory nor in the Hugging Face cache; counting tokens with the server's /tokenize"
                    );
                    Tokenizer::Remote(RemoteTokenizer::new(&base, &served))
                }
            },
            None => match listing
                .as_ref()
                .and_then(|l| l.as_ref().ok())
                .and_then(|l| served_model_tokenizer(l, &model))
            {
                Some(t) => {
                    tracing::debug!("tokenizer: {} (the served model's)", t.path.display());
                    Tokenizer::Hf(t)
                }
                None => Tokenizer::Remote(RemoteTokenizer::new(&base, &served)),
            },
        };
        let requests = match cached {
            Some(r) => r,
            None => self.sample_requests(&tokenizer).await?,
        };
        self.finish_plan(base, model, served, tokenizer, requests)
    }

    async fn sample_requests(
        &self,
        tokenizer: &Tokenizer,
    ) -> Result<Vec<SampleRequest>, BenchError> {
        Ok(match self.dataset_name {
            DatasetName::Sharegpt => {
                let path = self.dataset_path.as_ref().expect("validated");
                let loaded = sharegpt::load(path, self.allow_truncated)?;
                if let Some(at) = loaded.truncated_at {
                    tracing::warn!(
                        "{} is truncated at byte {at}; using the {} complete records before the cut",
                        path.display(),
                        loaded.records_read
                    );
                }
                sharegpt::sample(
                    &loaded,
                    tokenizer,
                    self.num_prompts,
                    self.sharegpt_output_len,
                    self.seed,
                )
                .await?
            }
            DatasetName::Random => {
                let tok = match self.random_vocab_size {
                    Some(v) => tokenizer.clone().with_vocab(v),
                    None => tokenizer.clone(),
                };
                super::dataset::random::sample(
                    &RandomSpec {
                        num_prompts: self.num_prompts,
                        input_len: self.random_input_len,
                        output_len: self.random_output_len,
                        range_ratio: self.random_range_ratio,
                        prefix_len: self.random_prefix_len,
                        seed: self.seed,
                    },
                    &tok,
                )
                .await?
            }
        })
    }

    fn finish_plan(
        &self,
        base: String,
        model: String,
        served: String,
        tokenizer: Tokenizer,
        requests: Vec<SampleRequest>,
    ) -> Result<(BenchPlan, RunInfo), BenchError> {
        let endpoint = self
            .endpoint
            .clone()
            .unwrap_or_else(|| self.backend.default_endpoint().to_owned());
        let template = RequestTemplate {
            url: format!("{base}{endpoint}"),
            backend: self.backend,
            model: served,
            max_tokens_field: self.max_tokens_field.unwrap_or(match self.backend {
                RequestApi::Openai => MaxTokensField::MaxTokens,
                RequestApi::OpenaiChat => MaxTokensField::MaxCompletionTokens,
            }),
            ignore_eos: self.ignore_eos || self.dataset_name == DatasetName::Random,
            temperature: self.temperature,
            extra_body: self.extra_body()?,
            api_key: std::env::var("OPENAI_API_KEY")
                .ok()
                .filter(|k| !k.is_empty()),
            timeout: Duration::from_secs_f64(self.request_timeout),
            keep_text: self.save_detailed,
            connection_close: Default::default(),
        };
        let percentile_metrics = parse_metrics(&self.percentile_metrics)?;
        let goodput = parse_goodput(&self.goodput)?;
        let info = RunInfo {
            backend: self.backend.as_str().to_owned(),
            label: self.label.clone(),
            model_id: model.clone(),
            tokenizer_id: self.tokenizer.clone().unwrap_or(model),
            num_prompts: self.num_prompts,
            request_rate: self.request_rate,
            burstiness: self.burstiness,
            max_concurrency: self.max_concurrency,
            percentile_metrics,
            goodput: !goodput.is_empty(),
            date: crate::util::timestamp_compact(SystemTime::now()),
        };
        let plan = BenchPlan {
            template,
            requests,
            shape: LoadShape {
                request_rate: self.request_rate,
                burstiness: self.burstiness,
                max_concurrency: self.max_concurrency,
                closed_loop: self.closed_loop,
                num_warmups: self.num_warmups,
                seed: self.seed,
            },
            summary: SummaryConfig {
                percentiles: parse_percentiles(&self.metric_percentiles)?,
                goodput,
            },
            abort: self.abort_policy()?,
            tokenizer: Some(tokenizer),
            progress: !self.disable_tqdm,
            label: "bench".into(),
        };
        Ok((plan, info))
    }

    /// The whole `servetune bench` command: prepare, run, print, save.
    pub async fn execute(&self) -> Result<BenchOutcome, BenchError> {
        let (plan, info) = self.prepare().await?;
        println!(
            "Traffic request rate: {}",
            if info.request_rate.is_infinite() {
                "inf".to_owned()
            } else {
                info.request_rate.to_string()
            }
        );
        println!(
            "Burstiness factor: {} ({})",
            info.burstiness,
            if info.burstiness == 1.0 {
                "Poisson process"
            } else {
                "Gamma distribution"
            }
        );
        println!(
            "Maximum request concurrency: {}",
            info.max_concurrency
                .map(|c| c.to_string())
                .unwrap_or_else(|| "None".into())
        );
        let outcome = super::run(plan).await?;
        print!("{}", output::error_lines(&outcome));
        print!("{}", output::vllm_block(&outcome.summary, &info));
        print!("{}", output::extras_block(&outcome));
        if self.save_result || self.save_detailed {
            let name = self
                .result_filename
                .clone()
                .unwrap_or_else(|| output::default_filename(&info));
            let path = match &self.result_dir {
                Some(d) => {
                    std::fs::create_dir_all(d).map_err(|source| BenchError::Write {
                        path: d.display().to_string(),
                        source,
                    })?;
                    d.join(name)
                }
                None => PathBuf::from(name),
            };
            let json = output::result_json(&outcome, &info, self.save_detailed);
            let text = serde_json::to_string(&json).expect("JSON values serialise");
            std::fs::write(&path, text).map_err(|source| BenchError::Write {
                path: path.display().to_string(),
                source,
            })?;
            println!("Results saved to {}", path.display());
        }
        Ok(outcome)
    }
}

/// `data[0].id` of the server's `/v1/models`.
/// The served model's own Hugging Face tokenizer, when the server names a local model: vLLM
/// and SGLang list the directory they serve as the model's `root` (or `id`); a hub id is looked
/// up in the local HF cache. `None` when the listing names nothing local (llama-server's GGUF).
fn served_model_tokenizer(listing: &Value, model: &str) -> Option<crate::tokenizer::HfTokenizer> {
    let entries = listing.get("data")?.as_array()?;
    let entry = entries
        .iter()
        .find(|e| e.get("id").and_then(Value::as_str) == Some(model))
        .or_else(|| entries.first())?;
    ["root", "id"]
        .iter()
        .filter_map(|k| entry.get(*k).and_then(Value::as_str))
        .find_map(|name| match crate::tokenizer::load_local(name) {
            Ok(t) => t,
            Err(e) => {
                tracing::debug!("the served model's tokenizer: {e}");
                None
            }
        })
}

/// `GET /v1/models`: the listing, or why there is none (the message names the URL).
async fn list_models(base: &str) -> Result<Value, String> {
    let url = format!("{base}/v1/models");
    reqwest::Client::new()
        .get(&url)
        .timeout(Duration::from_secs(30))
        .send()
        .await
        .map_err(|e| format!("cannot list models at {url} ({e})"))?
        .json()
        .await
        .map_err(|e| format!("{url} did not answer JSON ({e})"))
        .and_then(|v: Value| {
            v.pointer("/data/0/id")
                .and_then(Value::as_str)
                .is_some()
                .then_some(v)
                .ok_or_else(|| format!("{url} lists no model"))
        })
}

/// The first model a listing names (the default `--model`).
fn first_model(listing: &Result<Value, String>) -> Result<String, BenchError> {
    match listing {
        Ok(v) => Ok(v
            .pointer("/data/0/id")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_owned()),
        Err(e) => Err(BenchError::Config(format!("{e}; pass --model"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        a: BenchArgs,
    }

    fn parse(args: &[&str]) -> BenchArgs {
        let mut v = vec!["bench"];
        v.extend_from_slice(args);
        Cli::try_parse_from(v).unwrap().a
    }

    #[test]
    fn accepts_a_vllm_command_line() {
        let a = parse(&[
            "--backend",
            "openai-chat",
            "--base-url",
            "http://127.0.0.1:8000",
            "--endpoint",
            "/v1/chat/completions",
            "--model",
            "Qwen/Qwen3-32B",
            "--dataset-name",
            "sharegpt",
            "--dataset-path",
            "/x.json",
            "--num-prompts",
            "1000",
            "--request-rate",
            "inf",
            "--max-concurrency",
            "64",
            "--seed",
            "42",
            "--ignore-eos",
            "--goodput",
            "ttft:500",
            "tpot:50",
            "--percentile-metrics",
            "ttft,tpot,itl,e2el",
            "--metric-percentiles",
            "50,90,95,99",
            "--save-result",
            "--result-dir",
            "/tmp",
        ]);
        a.validate().unwrap();
        assert_eq!(a.request_rate, f64::INFINITY);
        assert_eq!(parse_goodput(&a.goodput).unwrap().tpot_ms, Some(50.0));
        assert_eq!(
            parse_percentiles(&a.metric_percentiles).unwrap(),
            vec![50.0, 90.0, 95.0, 99.0]
        );
    }

    #[test]
    fn bad_flags_name_what_is_wrong() {
        let cases: &[(&[&str], &str)] = &[
            (&["--goodput", "ttfx:5"], "ttfx"),
            (&["--goodput", "ttft"], "KEY:MS"),
            (&["--metric-percentiles", "99,101"], "101"),
            (&["--percentile-metrics", "ttft,lat"], "lat"),
            (&["--burstiness", "0"], "--burstiness"),
            (&["--max-concurrency", "0"], "--max-concurrency"),
            (&["--dataset-name", "sharegpt"], "--dataset-path"),
            (&["--extra-body", "[1]"], "--extra-body"),
            (&["--slo", "ttft:p99"], "ttft:p99"),
            (&["--min-success-rate", "99"], "fraction"),
            (&["--base-url", "https://x"], "http://"),
        ];
        for (args, needle) in cases {
            let e = parse(args).validate().unwrap_err().to_string();
            assert!(e.contains(needle), "{args:?}: {e}");
        }
        let mut v = vec!["bench", "--request-rate", "0"];
        assert!(Cli::try_parse_from(&v).is_err());
        v[2] = "fast";
        assert!(Cli::try_parse_from(&v).is_err());
    }
}
