//! What each imitated engine makes of its flags: the memory budget (and the start-up failure,
//! with the engine's own message, when it does not fit) and the scheduler settings; also the
//! machine imitated ([`Machine`]) and the start-up failure ([`Fatal`]), which `profile` re-exports.
//!
//! Messages (exact text; sources):
//! - vLLM `vllm/v1/core/kv_cache_utils.py` (KV cache too small, no memory for cache blocks),
//!   torch's `CUDACachingAllocator.cpp` OOM text as in vllm#12529, capture OOM as vllm#19186,
//!   `vllm/config/parallel.py` world size (vllm PR #30140), `SchedulerConfig.verify_max_model_len`.
//! - SGLang `pool_configurator.py` ("Not enough memory. Please try to increase
//!   --mem-fraction-static."), `cuda_graph_runner.py` capture failure.
//! - TensorRT-LLM `py_executor_creator.py` insufficient GPU memory, `fp8BlockScalingGemm.cpp`
//!   (NVIDIA/TensorRT-LLM#4599).
//! - llama.cpp `ggml-backend.cpp`, `llama-kv-cache.cpp`, `llama-context.cpp` allocation chain.

use std::collections::BTreeMap;

use crate::space::Value;

use super::sim::{Hardware, ModelSpec, Settings};

/// Why the mock engine refuses to serve, and how the real engine would say it.
#[derive(Debug, Clone, PartialEq)]
pub struct Fatal {
    /// Log lines, as the engine prints them (stderr).
    pub log: String,
    pub exit_code: i32,
    /// Seconds of "start-up" before dying (loading weights, capturing graphs).
    pub after_s: f64,
}

/// The mock's own knobs, before `--`.
#[derive(Debug, Clone)]
pub struct Machine {
    pub hw: Hardware,
    pub model: ModelSpec,
    pub version: String,
}

fn int(cfg: &BTreeMap<String, Value>, k: &str) -> i64 {
    match cfg.get(k) {
        Some(Value::Int(i)) => *i,
        Some(Value::Float(x)) => *x as i64,
        Some(Value::Str(s)) => s.parse().unwrap_or(0),
        _ => 0,
    }
}

fn float(cfg: &BTreeMap<String, Value>, k: &str) -> f64 {
    match cfg.get(k) {
        Some(Value::Float(x)) => *x,
        Some(Value::Int(i)) => *i as f64,
        _ => 0.0,
    }
}

fn boolean(cfg: &BTreeMap<String, Value>, k: &str) -> bool {
    matches!(cfg.get(k), Some(Value::Bool(true)))
}

fn text<'a>(cfg: &'a BTreeMap<String, Value>, k: &str) -> &'a str {
    match cfg.get(k) {
        Some(Value::Str(s)) => s,
        _ => "",
    }
}

fn die(log: String, after_s: f64) -> Fatal {
    Fatal {
        log,
        exit_code: 1,
        after_s,
    }
}

/// torch's CUDA OOM text (c10/cuda/CUDACachingAllocator.cpp), as vLLM and SGLang print it.
fn torch_oom(tried_gib: f64, total_gib: f64, free_gib: f64) -> String {
    format!(
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate {tried_gib:.2} GiB. GPU 0 has a total capacity of {total_gib:.2} GiB of which {free_gib:.2} GiB is free. Including non-PyTorch memory, this process has {:.2} GiB memory in use. Of the allocated memory {:.2} GiB is allocated by PyTorch, and 18.97 MiB is reserved by PyTorch but unallocated. If reserved but unallocated memory is large try setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.  See documentation for Memory Management  (https://docs.pytorch.org/docs/stable/notes/cuda.html#optimizing-memory-usage-with-pytorch-cuda-alloc-conf)\n",
        total_gib - free_gib,
        (total_gib - free_gib) * 0.97
    )
}

/// Activation memory per batched token, GiB (grows with the model's width).
fn act_gib_per_token(m: &Machine) -> f64 {
    m.model.gflop_per_token * 1e-5
}

/// Graph pool per captured batch size, GiB.
const GRAPH_GIB_PER_BS: f64 = 0.006;

/// The log line of an engine that ran out of memory prefilling `tokens` in one step.
pub fn runtime_oom_log(profile: &str, tokens: u64, total_gib: f64) -> String {
    let tried = tokens as f64 * 1e-5 * 16.0;
    if profile == "trtllm" {
        "[TRT-LLM] [E] Encountered an error in forward function: [TensorRT-LLM][ERROR] CUDA runtime error in ::cudaMallocAsync(ptr, n, mCudaStream->get()): out of memory (tllmBuffers.h:112)".to_owned()
    } else {
        format!("Scheduler hit an exception: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate {tried:.2} GiB. GPU 0 has a total capacity of {total_gib:.2} GiB of which 0.31 GiB is free.")
    }
}

/// Scheduler settings, start-up log and run-time OOM threshold, or the start-up failure.
pub fn settings(
    profile: &str,
    cfg: &BTreeMap<String, Value>,
    max_model_len: u64,
    m: &Machine,
) -> Result<(Settings, String, Option<u64>), Fatal> {
    let hw = &m.hw;
    let gpu = hw.sm > 0;
    let tp = int(cfg, "tensor_parallel_size")
        .max(int(cfg, "tp_size"))
        .max(1) as u32;
    if gpu && tp > hw.gpus {
        let log = match profile {
            "vllm" => format!("(APIServer pid=1) pydantic_core._pydantic_core.ValidationError: 1 validation error for ParallelConfig\n  Value error, World size ({tp}) is larger than the number of available GPUs ({}) in this node. If this is intentional and you are using:\n- ray, set '--distributed-executor-backend ray'.\n- multiprocessing, set '--nnodes' appropriately. [type=value_error]\n", hw.gpus),
            _ => format!("RuntimeError: CUDA error: invalid device ordinal (tp_size {tp} > {} visible GPUs)\n", hw.gpus),
        };
        return Err(die(log, 0.5));
    }
    let mut s = Settings {
        tp,
        noise: 0.02,
        ..Settings::default()
    };
    let (banner, oom_prefill) = match profile {
        "vllm" => vllm(&mut s, cfg, max_model_len, m)?,
        "sglang" => sglang(&mut s, cfg, max_model_len, m)?,
        "trtllm" => trtllm(&mut s, cfg, max_model_len, m)?,
        _ => llamacpp(&mut s, cfg, max_model_len, m)?,
    };
    Ok((s, banner, oom_prefill))
}

/// vLLM: reads the scheduler flags, then budgets memory; returns the start-up log and no
/// run-time OOM threshold (the budget already holds the activations of a full step).
fn vllm(
    s: &mut Settings,
    cfg: &BTreeMap<String, Value>,
    max_model_len: u64,
    m: &Machine,
) -> Result<(String, Option<u64>), Fatal> {
    vllm_scheduler(s, cfg, max_model_len, m)?;
    let banner = vllm_memory(s, cfg, max_model_len, m)?;
    Ok((banner, None))
}

/// vLLM's scheduler flags (batch limits, chunked prefill, quantization, graphs, speculation)
/// into `s`, with the validation errors vLLM raises for inconsistent ones.
fn vllm_scheduler(
    s: &mut Settings,
    cfg: &BTreeMap<String, Value>,
    max_model_len: u64,
    m: &Machine,
) -> Result<(), Fatal> {
    let hw = &m.hw;
    let gpu = hw.sm > 0;
    let mode = text(cfg, "performance_mode");
    let mut seqs = int(cfg, "max_num_seqs");
    let mut tokens = int(cfg, "max_num_batched_tokens");
    if mode == "throughput" {
        if seqs == 1024 {
            seqs *= 2;
        }
        if tokens == 8192 {
            tokens *= 2;
        }
    }
    s.max_seqs = seqs.max(1) as u32;
    s.max_batched_tokens = tokens.max(1) as u32;
    s.chunked_prefill = boolean(cfg, "enable_chunked_prefill");
    s.prefix_cache = boolean(cfg, "enable_prefix_caching");
    s.block_size = int(cfg, "block_size").max(1) as u32;
    if s.max_batched_tokens < s.max_seqs {
        // As vLLM 0.32.0 prints it (pydantic validates SchedulerConfig; run here).
        return Err(die(format!("pydantic_core._pydantic_core.ValidationError: 1 validation error for SchedulerConfig\n  Value error, max_num_batched_tokens ({}) must be greater than or equal to max_num_seqs ({}). [type=value_error, input_value=ArgsKwargs(()), input_type=ArgsKwargs]\n", s.max_batched_tokens, s.max_seqs), 0.3));
    }
    if !s.chunked_prefill && (s.max_batched_tokens as u64) < max_model_len {
        return Err(die(format!("pydantic_core._pydantic_core.ValidationError: 1 validation error for SchedulerConfig\n  Value error, max_num_batched_tokens ({}) is smaller than max_model_len ({max_model_len}). This effectively limits the maximum sequence length to max_num_batched_tokens and makes vLLM reject longer sequences. Please increase max_num_batched_tokens or decrease max_model_len. [type=value_error, input_value=ArgsKwargs(()), input_type=ArgsKwargs]\n", s.max_batched_tokens), 0.3));
    }
    if text(cfg, "quantization") == "fp8" {
        if gpu && hw.sm < 80 {
            return Err(die(format!("ValueError: The quantization method fp8 is not supported for the current GPU. Minimum capability: 80. Current capability: {}.\n", hw.sm), 1.0));
        }
        s.weight_factor = 0.5;
        s.flop_factor = if hw.sm >= 89 { 0.6 } else { 1.0 };
    }
    if text(cfg, "kv_cache_dtype").starts_with("fp8") {
        s.kv_factor = 0.5;
    }
    let graphs = text(cfg, "cudagraph_mode");
    s.graph_max_bs = if graphs == "NONE" {
        0
    } else {
        s.max_seqs.min(512)
    };
    s.overhead_ms = 1.2 * if graphs == "PIECEWISE" { 1.3 } else { 1.0 };
    if mode == "interactivity" {
        s.overhead_ms *= 0.85;
    }
    let spec = text(cfg, "speculative_method");
    if !boolean(cfg, "async_scheduling") || spec != "none" {
        s.overhead_ms += 0.8;
    }
    if spec != "none" {
        s.spec_k = int(cfg, "num_speculative_tokens").max(1) as u32;
        s.spec_accept = if spec == "mtp" { 0.75 } else { 0.35 };
    }
    Ok(())
}

/// vLLM's memory budget (weights, activations, KV cache, graph pool) under
/// `gpu_memory_utilization`: sets the KV capacity in `s` and returns the start-up log, or the
/// failure vLLM reports when something does not fit.
fn vllm_memory(
    s: &mut Settings,
    cfg: &BTreeMap<String, Value>,
    max_model_len: u64,
    m: &Machine,
) -> Result<String, Fatal> {
    let tp = s.tp;
    let kv_kib = m.model.kv_kib_per_token;
    let total = m.hw.mem_gib;
    let frac = float(cfg, "gpu_memory_utilization");
    let budget = total * frac;
    let weights = m.model.weights_gib * s.weight_factor / tp as f64;
    let act = s.max_batched_tokens as f64 * act_gib_per_token(m);
    if weights > budget {
        return Err(die(
            format!(
                "(EngineCore pid=2) ERROR [core.py:330] {}",
                torch_oom(weights - budget + 0.5, total, total - budget)
            ),
            1.0,
        ));
    }
    let kv_gib = budget - weights - act;
    if kv_gib <= 0.0 {
        return Err(die("(EngineCore pid=2) ERROR [core.py:708] ValueError: No available memory for the cache blocks. Try increasing `gpu_memory_utilization` when initializing the engine. See https://docs.vllm.ai/en/latest/configuration/conserving_memory/ for more details.\n".into(), 1.5));
    }
    s.kv_tokens = (kv_gib * tp as f64 * (1u64 << 20) as f64 / (kv_kib * s.kv_factor)) as u64;
    if s.kv_tokens < max_model_len {
        let need = max_model_len as f64 * kv_kib * s.kv_factor / (1u64 << 20) as f64 / tp as f64;
        return Err(die(format!("(EngineCore pid=2) ERROR [core.py:708] ValueError: To serve at least one request with the model's max seq len ({max_model_len}), ({need:.2} GiB KV cache is needed, which is larger than the available KV cache memory ({kv_gib:.2} GiB). Based on the available memory, the estimated maximum model length is {}. Try increasing `gpu_memory_utilization` or decreasing `max_model_len` when initializing the engine. See https://docs.vllm.ai/en/latest/configuration/conserving_memory/ for more details.\n", s.kv_tokens), 1.5));
    }
    let graph_gib = s.graph_max_bs as f64 * GRAPH_GIB_PER_BS;
    if graph_gib > total - budget {
        return Err(die(String::from("Capturing CUDA graphs (decode, FULL): 37%|███▋      | 19/51 [00:01<00:02, 15.2it/s]\n(VllmWorker rank=0 pid=3) ERROR [multiproc_executor.py:470] RuntimeError: CUDA error: out of memory\nCUDA kernel errors might be asynchronously reported at some other API call, so the stacktrace below might be incorrect.\nFor debugging consider passing CUDA_LAUNCH_BLOCKING=1\n"), 2.0));
    }
    Ok(format!(
        "(EngineCore pid=2) INFO [kv_cache_utils.py:1733] GPU KV cache size: {} tokens\n(EngineCore pid=2) INFO [kv_cache_utils.py:1734] Maximum concurrency for {max_model_len} tokens per request: {:.2}x\n",
        s.kv_tokens,
        s.kv_tokens as f64 / max_model_len as f64
    ))
}

/// SGLang: its flags and its static memory pool (`mem_fraction_static`); returns the start-up
/// log and the prefill size that runs out of memory at run time, if any.
fn sglang(
    s: &mut Settings,
    cfg: &BTreeMap<String, Value>,
    max_model_len: u64,
    m: &Machine,
) -> Result<(String, Option<u64>), Fatal> {
    let tp = s.tp;
    let kv_kib = m.model.kv_kib_per_token;
    let total = m.hw.mem_gib;
    let mut oom_prefill = None;
    let frac = match float(cfg, "mem_fraction_static") {
        f if f > 0.0 => f,
        _ => 0.88,
    };
    let chunk = int(cfg, "chunked_prefill_size");
    s.chunked_prefill = chunk > 0;
    s.max_batched_tokens = if chunk > 0 { chunk as u32 } else { 16384 };
    s.prefix_cache = !boolean(cfg, "disable_radix_cache");
    s.block_size = 1;
    if text(cfg, "kv_cache_dtype").starts_with("fp8") {
        s.kv_factor = 0.5;
    }
    s.graph_max_bs = int(cfg, "cuda_graph_max_bs").max(0) as u32;
    let steps = int(cfg, "num_continuous_decode_steps").max(1) as u32;
    s.admit_every = steps;
    s.overhead_ms = 1.3 * (1.0 - 0.1 * (steps - 1) as f64 / steps as f64);
    if boolean(cfg, "enable_mixed_chunk") {
        s.overhead_ms -= 0.1;
    }
    if boolean(cfg, "enable_torch_compile") {
        s.flop_factor = 0.92;
    }
    if text(cfg, "speculative_algorithm") == "NGRAM" {
        s.spec_k = 4;
        s.spec_accept = 0.35;
        s.overhead_ms += 0.5;
    }
    let weights = m.model.weights_gib / tp as f64;
    if weights > total * 0.98 {
        return Err(die(torch_oom(weights - total + 1.0, total, 0.3), 1.0));
    }
    let kv_gib = total * frac - weights;
    if kv_gib <= 0.0 {
        return Err(die(
            "RuntimeError: Not enough memory. Please try to increase --mem-fraction-static.\n"
                .into(),
            1.0,
        ));
    }
    s.kv_tokens = (kv_gib * tp as f64 * (1u64 << 20) as f64 / (kv_kib * s.kv_factor)) as u64;
    let reqs = int(cfg, "max_running_requests");
    s.max_seqs = if reqs > 0 {
        reqs as u32
    } else {
        (s.kv_tokens / 512).clamp(64, 4096) as u32
    };
    let free = total * (1.0 - frac);
    if s.graph_max_bs as f64 * GRAPH_GIB_PER_BS * 2.0 > free {
        return Err(die("Exception: Capture cuda graph failed: CUDA error: out of memory\nPossible solutions:\n1. set --mem-fraction-static to a smaller value (e.g., 0.8 or 0.7)\n2. set --cuda-graph-max-bs to a smaller value (e.g., 16)\n3. disable torch compile by not using --enable-torch-compile\n4. disable CUDA graph by --disable-cuda-graph. (Not recommended. Huge performance loss)\nOpen an issue on GitHub https://github.com/sgl-project/sglang/issues/new/choose \n".into(), 2.0));
    }
    // What is left outside the static pool holds the activations of a prefill chunk.
    let room = free - s.graph_max_bs as f64 * GRAPH_GIB_PER_BS;
    let fits = (room / act_gib_per_token(m)).max(0.0) as u64;
    if fits < s.max_batched_tokens as u64 {
        oom_prefill = Some(fits);
    }
    let banner = format!(
        "KV Cache is allocated. #tokens: {}, K size: {:.2} GB, V size: {:.2} GB\nmax_total_num_tokens={}, chunked_prefill_size={chunk}, max_running_requests={}, context_len={max_model_len}\n",
        s.kv_tokens, kv_gib / 2.0, kv_gib / 2.0, s.kv_tokens, s.max_seqs
    );
    Ok((banner, oom_prefill))
}

/// TensorRT-LLM: its flags and the KV cache carved from the memory left after weights,
/// activations and graphs; returns the start-up log and the prefill size that runs out of
/// memory at run time, if any.
fn trtllm(
    s: &mut Settings,
    cfg: &BTreeMap<String, Value>,
    max_model_len: u64,
    m: &Machine,
) -> Result<(String, Option<u64>), Fatal> {
    let hw = &m.hw;
    let tp = s.tp;
    let kv_kib = m.model.kv_kib_per_token;
    let total = hw.mem_gib;
    let mut oom_prefill = None;
    s.max_seqs = int(cfg, "max_batch_size").max(1) as u32;
    s.max_batched_tokens = int(cfg, "max_num_tokens").max(1) as u32;
    s.chunked_prefill = boolean(cfg, "enable_chunked_prefill");
    s.prefix_cache = boolean(cfg, "kv_cache_reuse");
    s.block_size = 32;
    if text(cfg, "kv_cache_dtype") == "fp8" {
        if hw.sm < 89 {
            return Err(die("[TRT-LLM] [E] Failed to initialize executor on rank 0: Unsupported SM version for FP8 block scaling GEMM\nRuntimeError: Unsupported SM version for FP8 block scaling GEMM\n".into(), 2.0));
        }
        s.kv_factor = 0.5;
    }
    let gmax = int(cfg, "cuda_graph_max_batch_size").max(0) as u32;
    s.graph_max_bs = gmax;
    s.overhead_ms = 1.0
        * if boolean(cfg, "cuda_graph_padding") {
            1.0
        } else {
            1.2
        };
    if boolean(cfg, "disable_overlap_scheduler") {
        s.overhead_ms += 1.0;
    }
    if text(cfg, "attn_backend") == "FLASHINFER" {
        s.attn_factor = 1.1;
    }
    if text(cfg, "speculative_decoding") == "MTP" {
        s.spec_k = int(cfg, "mtp_num_nextn_predict_layers").max(1) as u32;
        s.spec_accept = 0.7;
    }
    if !s.chunked_prefill && (s.max_batched_tokens as u64) < max_model_len {
        // Requests longer than max_num_tokens are refused at run time.
        s.slot_ctx = s.max_batched_tokens as u64;
    }
    let weights = m.model.weights_gib / tp as f64;
    let act = s.max_batched_tokens as f64 * act_gib_per_token(m);
    let free_after = total - weights - act - gmax as f64 * GRAPH_GIB_PER_BS;
    let frac = float(cfg, "kv_cache_free_gpu_memory_fraction");
    if free_after <= 0.5 {
        return Err(die(format!("[TRT-LLM] [RANK 0] [E] Failed to initialize executor on rank 0: Executor creation failed due to insufficient GPU memory.\n\nThe following component could not be created: KV cache\nTotal GPU memory (GiB): {total:.2}\nFree GPU memory before component creation attempt (GiB): {:.2}\n\nPlease refer to the TensorRT LLM documentation for information on how to control the memory usage through TensorRT LLM configuration options. Possible options include:\n  KV cache: reduce free_gpu_memory_fraction\n  Model: reduce max_num_tokens and/or shard the model weights across GPUs by enabling pipeline and/or tensor parallelism\n", free_after.max(0.0)), 2.0));
    }
    s.kv_tokens =
        (free_after * frac * tp as f64 * (1u64 << 20) as f64 / (kv_kib * s.kv_factor)) as u64;
    if frac > 0.93 {
        // Little left beside the pool: the largest prefills run out at run time.
        oom_prefill = Some((s.max_batched_tokens as f64 * 0.6) as u64);
    }
    let banner = format!(
        "[TRT-LLM] [I] max_tokens in paged KV cache: {}\n",
        s.kv_tokens
    );
    Ok((banner, oom_prefill))
}

/// llama.cpp: slots sharing one context, threads, batch sizes and a quantized cache; returns
/// the start-up log (llama-server has no run-time OOM here), or the allocation failure when
/// weights and cache do not fit in memory.
fn llamacpp(
    s: &mut Settings,
    cfg: &BTreeMap<String, Value>,
    max_model_len: u64,
    m: &Machine,
) -> Result<(String, Option<u64>), Fatal> {
    let hw = &m.hw;
    let kv_kib = m.model.kv_kib_per_token;
    // llama.cpp: slots share the context; -1 = auto (4 slots, unified KV; server.cpp:169).
    let parallel = int(cfg, "parallel");
    let unified = boolean(cfg, "kv_unified") || parallel < 0;
    let slots = if parallel < 0 { 4 } else { parallel.max(1) } as u64;
    s.max_seqs = slots as u32;
    s.kv_tokens = max_model_len;
    s.slot_ctx = if unified {
        max_model_len
    } else {
        max_model_len / slots
    };
    s.max_batched_tokens = int(cfg, "batch_size").max(1) as u32;
    s.ubatch = int(cfg, "ubatch_size").clamp(1, s.max_batched_tokens as i64) as u32;
    s.threads = int(cfg, "threads").max(0) as u32;
    s.threads_batch = match int(cfg, "threads_batch") {
        t if t > 0 => t as u32,
        _ => s.threads,
    };
    s.prefix_cache = true;
    s.block_size = 1;
    s.static_batching = !boolean(cfg, "cont_batching");
    s.graph_max_bs = 0;
    s.overhead_ms = 0.3;
    s.attn_factor = if text(cfg, "flash_attn") == "off" {
        1.0
    } else {
        0.85
    };
    let kvf = |t: &str| match t {
        "q8_0" => 0.53,
        "q5_1" | "q5_0" => 0.37,
        "q4_1" | "q4_0" => 0.28,
        _ => 1.0,
    };
    s.kv_factor = (kvf(text(cfg, "cache_type_k")) + kvf(text(cfg, "cache_type_v"))) / 2.0;
    if s.kv_factor < 1.0 {
        // Dequantizing the cache costs compute.
        s.attn_factor *= 1.0 + (1.0 - s.kv_factor) * 0.3;
    }
    let kv_bytes = (max_model_len as f64 * kv_kib * s.kv_factor * 1024.0) as u64;
    let need = m.model.weights_gib
        + kv_bytes as f64 / (1u64 << 30) as f64
        + s.max_batched_tokens as f64 * 2e-5;
    if need > hw.mem_gib {
        return Err(die(format!("ggml_backend_cpu_buffer_type_alloc_buffer: failed to allocate buffer of size {kv_bytes}\nalloc_tensor_range: failed to allocate CPU buffer of size {kv_bytes}\nllama_init_from_model: failed to initialize the context: failed to allocate buffer for kv cache\nsrv    load_model: failed to create_context with model '{}'\nsrv  llama_server: exiting due to model loading error\n", m.model.name), 0.3));
    }
    let banner = format!(
        "srv    load_model: n_slots = {slots}, n_ctx_slot = {}\n",
        s.slot_ctx
    );
    Ok((banner, None))
}
