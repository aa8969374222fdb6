//! Failure classification: what went wrong with an engine, proved by the log line that shows it.
//! Patterns are plain substrings, per class, from the engine's search-space file
//! (`[engine.failures]`) plus built-in ones for the engines servetune ships; the ladder supplies
//! the classes that no log line proves (start-up timeout, hang, crash).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// When an out-of-memory happened.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OomPhase {
    Startup,
    GraphCapture,
    Run,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "class")]
pub enum FailureClass {
    OutOfMemory {
        phase: OomPhase,
    },
    /// The hardware cannot run this configuration (e.g. FP8 kernels on an older SM).
    Unsupported,
    BadFlag,
    PortInUse,
    StartupTimeout,
    /// The process died (during start-up or during the benchmark) with no known pattern.
    Crash,
    /// Healthy by its endpoints but produces no tokens.
    Hang,
}

impl FailureClass {
    pub fn key(self) -> &'static str {
        match self {
            FailureClass::OutOfMemory { .. } => "oom",
            FailureClass::Unsupported => "unsupported",
            FailureClass::BadFlag => "bad_flag",
            FailureClass::PortInUse => "port_in_use",
            FailureClass::StartupTimeout => "startup_timeout",
            FailureClass::Crash => "crash",
            FailureClass::Hang => "hang",
        }
    }
}

/// A classification with the evidence.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Failure {
    pub class: FailureClass,
    /// The log line that proved the class (empty when the ladder, not the log, decided).
    pub evidence: String,
}

/// Built-in patterns, each from a real log line (source in the comment).
const BUILTIN: &[(&str, &str)] = &[
    // llama-server 11434.0.0, `llama-server --bogus-flag` (run here).
    ("bad_flag", "error: invalid argument:"),
    // argparse, as vLLM / SGLang / trtllm-serve print an unknown flag.
    ("bad_flag", "error: unrecognized arguments:"),
    // click (trtllm-serve) for an unknown option.
    ("bad_flag", "Error: No such option:"),
    // llama-server 11434.0.0 with its port taken (run here).
    ("port_in_use", "couldn't bind HTTP server socket"),
    // uvicorn / Python: "[Errno 98] error while attempting to bind on address ...: address already in use"
    ("port_in_use", "address already in use"),
    ("port_in_use", "Address already in use"),
    // vllm-project/vllm#15598: "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 MiB."
    ("oom", "CUDA out of memory"),
    // vllm-project/vllm#19186 (during cudagraph capture_end): "RuntimeError: CUDA error: out of memory"
    ("oom", "CUDA error: out of memory"),
    // vLLM 0.32.0's CPU worker (v1/worker/cpu_worker.py), run here with the defaults on a
    // machine whose memory node had less free than 92% of it: "ValueError: Available memory on
    // node 0 (10.4/12.21 GiB) on startup is less than desired CPU memory utilization (0.92,
    // 11.24 GiB). ..."
    ("oom", "is less than desired CPU memory utilization"),
    // The same worker when VLLM_CPU_KVCACHE_SPACE asks for more than is free.
    ("oom", "allocation is less than requested memory for kv"),
    // vLLM when the KV cache gets no memory.
    ("oom", "No available memory for the cache blocks"),
    // llama.cpp when a buffer cannot be allocated.
    ("oom", "failed to allocate"),
    // NVIDIA/TensorRT-LLM#4599 and the Qwen3-32B seed report: "RuntimeError: Unsupported SM version for FP8 block scaling GEMM"
    ("unsupported", "Unsupported SM version"),
    ("unsupported", "is not supported on this GPU"),
    // vLLM model_loader: "The quantization method fp8 is not supported for the current GPU.
    // Minimum capability: 80. Current capability: 75."
    ("unsupported", "is not supported for the current GPU"),
    // vllm/config/parallel.py (vllm PR #30140): "World size (2) is larger than the number of
    // available GPUs (1) in this node."
    ("unsupported", "is larger than the number of available GPUs"),
    ("unsupported", "invalid device ordinal"),
    // vllm/v1/core/kv_cache_utils.py: the KV cache cannot hold one max-length request
    // (vllm#25350: "To serve at least one request with the models's max seq len (221000), ...").
    ("oom", "To serve at least one request with the model"),
    // SGLang pool_configurator.py / model_runner.py.
    (
        "oom",
        "Not enough memory. Please try to increase --mem-fraction-static",
    ),
    // TensorRT-LLM py_executor_creator.py (NVIDIA/TensorRT-LLM#5872).
    (
        "oom",
        "Executor creation failed due to insufficient GPU memory",
    ),
    ("oom", "out of memory"),
    // vLLM SchedulerConfig: contradictory scheduler flags are refused at start.
    ("bad_flag", "is smaller than max_model_len"),
    ("bad_flag", "must be greater than or equal to max_num_seqs"),
    // argparse for a flag value of the wrong type: "error: argument --max-num-seqs: invalid int value".
    ("bad_flag", "error: argument "),
    // llama.cpp common/arg.cpp for a value it cannot parse.
    ("bad_flag", "error while handling argument"),
];

/// Lines that mean CUDA-graph capture was under way (vllm-project/vllm#15598, #12438).
const GRAPH_CAPTURE: &[&str] = &[
    "Capturing cudagraphs",
    "Capturing CUDA graph",
    "capture_end",
    "cuda_graph",
    "Capture cuda graph",
];

/// Class patterns: the engine file's first, then the built-ins.
#[derive(Debug, Clone)]
pub struct Patterns {
    by_class: Vec<(String, String)>,
}

impl Default for Patterns {
    /// The built-in patterns only.
    fn default() -> Self {
        Patterns::new(&BTreeMap::new())
    }
}

/// The order in which classes are tried: a bad flag or a taken port explains everything after
/// it. The same classes as `space::FAILURE_CLASSES` (a unit test checks).
const PRIORITY: [&str; 4] = ["bad_flag", "port_in_use", "oom", "unsupported"];

impl Patterns {
    pub fn new(engine: &BTreeMap<String, Vec<String>>) -> Self {
        let mut by_class: Vec<(String, String)> = engine
            .iter()
            .flat_map(|(k, v)| v.iter().map(move |p| (k.clone(), p.clone())))
            .collect();
        by_class.extend(BUILTIN.iter().map(|(k, p)| (k.to_string(), p.to_string())));
        Patterns { by_class }
    }

    /// Classifies a log. `after_ready`: the engine had passed its readiness ladder (a failure is
    /// then "during the run"). Returns `None` when no pattern matches.
    pub fn classify(&self, log: &str, after_ready: bool) -> Option<Failure> {
        for class in PRIORITY {
            for (k, pat) in &self.by_class {
                if k != class {
                    continue;
                }
                let Some(pos) = log.find(pat.as_str()) else {
                    continue;
                };
                let line = line_at(log, pos);
                let class = match class {
                    "bad_flag" => FailureClass::BadFlag,
                    "port_in_use" => FailureClass::PortInUse,
                    "unsupported" => FailureClass::Unsupported,
                    _ => FailureClass::OutOfMemory {
                        phase: if after_ready {
                            OomPhase::Run
                        } else if GRAPH_CAPTURE
                            .iter()
                            .any(|g| log[..pos].contains(g) || line.contains(g))
                        {
                            OomPhase::GraphCapture
                        } else {
                            OomPhase::Startup
                        },
                    },
                };
                return Some(Failure {
                    class,
                    evidence: line.trim().to_owned(),
                });
            }
        }
        None
    }
}

fn line_at(text: &str, pos: usize) -> &str {
    let start = text[..pos].rfind('\n').map(|i| i + 1).unwrap_or(0);
    let end = text[pos..]
        .find('\n')
        .map(|i| pos + i)
        .unwrap_or(text.len());
    &text[start..end]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_priority_covers_exactly_the_classes_an_engine_file_may_name() {
        let mut a: Vec<&str> = PRIORITY.to_vec();
        let mut b: Vec<&str> = crate::space::FAILURE_CLASSES.to_vec();
        a.sort_unstable();
        b.sort_unstable();
        assert_eq!(a, b);
    }

    fn classify(log: &str, after: bool) -> Option<Failure> {
        Patterns::new(&BTreeMap::new()).classify(log, after)
    }

    #[test]
    fn real_log_lines_are_classified_with_evidence() {
        // llama-server 11434.0.0, run on this machine.
        let f = classify(
            "load_backend: loaded CPU backend\nerror: invalid argument: --bogus-flag\n",
            false,
        )
        .unwrap();
        assert_eq!(f.class, FailureClass::BadFlag);
        assert_eq!(f.evidence, "error: invalid argument: --bogus-flag");
        let f = classify(
            "0.00.006.051 E srv         start: couldn't bind HTTP server socket, hostname: 127.0.0.1, port: 18601\n0.00.006.195 E srv  llama_server: exiting due to HTTP server error\n",
            false,
        )
        .unwrap();
        assert_eq!(f.class, FailureClass::PortInUse);
        // vllm-project/vllm#15598 (title line).
        let f = classify("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 MiB. GPU 6 has a total capacity of 44.53 GiB of which 448.00 KiB is free.", false).unwrap();
        assert_eq!(
            f.class,
            FailureClass::OutOfMemory {
                phase: OomPhase::Startup
            }
        );
        // vllm-project/vllm#19186: OOM at the end of a CUDA-graph capture.
        let log = "(VllmWorker rank=3 pid=1090) ERROR 06-05 06:18:13 [multiproc_executor.py:470]     self.cuda_graph.capture_end()\n(VllmWorker rank=3 pid=1090) ERROR 06-05 06:18:13 [multiproc_executor.py:470] RuntimeError: CUDA error: out of memory\n";
        let f = classify(log, false).unwrap();
        assert_eq!(
            f.class,
            FailureClass::OutOfMemory {
                phase: OomPhase::GraphCapture
            }
        );
        assert!(f
            .evidence
            .contains("RuntimeError: CUDA error: out of memory"));
        // The same OOM after the engine was ready is a run-time OOM.
        assert_eq!(
            classify("RuntimeError: CUDA error: out of memory", true)
                .unwrap()
                .class,
            FailureClass::OutOfMemory {
                phase: OomPhase::Run
            }
        );
        // NVIDIA/TensorRT-LLM#4599, and the FP8 attempt of the Qwen3-32B seed report.
        let f = classify(
            "RuntimeError: Unsupported SM version for FP8 block scaling GEMM",
            false,
        )
        .unwrap();
        assert_eq!(f.class, FailureClass::Unsupported);
        // argparse (vLLM).
        let f = classify(
            "vllm serve: error: unrecognized arguments: --max-num-seq 5",
            false,
        )
        .unwrap();
        assert_eq!(f.class, FailureClass::BadFlag);
        assert!(classify("INFO all good\n", false).is_none());
    }

    #[test]
    fn engine_file_patterns_come_first() {
        let mut m = BTreeMap::new();
        m.insert(
            "unsupported".to_string(),
            vec!["KeyError: 'weight'".to_string()],
        );
        // The AWQ failure of the Qwen3-32B seed report (TensorRT-LLM 1.2.0rc1).
        let f = Patterns::new(&m)
            .classify("Traceback ...\nKeyError: 'weight'\n", false)
            .unwrap();
        assert_eq!(f.class, FailureClass::Unsupported);
        assert_eq!(f.evidence, "KeyError: 'weight'");
    }
}
