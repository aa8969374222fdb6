//! The mock engine's performance model: a continuous-batching scheduler and a roofline cost
//! per step, so that throughput and latency *emerge* from an engine's flags under the load that
//! actually arrives (batch caps, token budgets, chunked prefill, prefix caching, KV capacity and
//! preemption, speculative decoding, CUDA-graph coverage, tensor parallelism, CPU threads).
//!
//! Pure and deterministic for a seed: [`Sched::step`] advances one engine iteration and says how
//! long it took and which tokens it produced. The HTTP mock runs it against the wall clock; the
//! tuner's search-quality benchmark runs whole benchmarks in virtual time with [`simulate`].

use std::collections::{HashSet, VecDeque};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use rand_distr::{Distribution, LogNormal};
use serde::Serialize;

/// The machine the mock pretends to be.
#[derive(Debug, Clone, Serialize)]
pub struct Hardware {
    pub name: String,
    /// Memory per GPU (or the host's RAM for a CPU engine), GiB.
    pub mem_gib: f64,
    pub gpus: u32,
    /// CUDA compute capability ×10 (90 = Hopper); 0 on a CPU.
    pub sm: u32,
    /// CPU cores (what `--threads` competes for).
    pub cores: u32,
    /// Memory bandwidth per device, GiB per millisecond.
    pub bw_gib_ms: f64,
    /// Dense compute per device, TFLOP/s actually reached.
    pub tflops: f64,
}

impl Hardware {
    /// Presets: `h200`, `h100`, `a100`, `l4`, `cpu` (this VM's kind: 2 cores).
    pub fn preset(name: &str, cores: u32) -> Option<Hardware> {
        let (mem, sm, bw_tbs, tf) = match name {
            "h200" => (141.0, 90, 4.8, 600.0),
            "h100" => (80.0, 90, 3.35, 600.0),
            "a100" => (80.0, 80, 2.0, 200.0),
            "l4" => (24.0, 89, 0.3, 90.0),
            "cpu" => (24.0, 0, 0.02, 0.05 * cores as f64),
            _ => return None,
        };
        Some(Hardware {
            name: name.into(),
            mem_gib: mem,
            gpus: if sm == 0 { 0 } else { 1 },
            sm,
            cores,
            bw_gib_ms: bw_tbs * 1e12 / (1u64 << 30) as f64 / 1000.0,
            tflops: tf,
        })
    }
}

/// The model the mock pretends to serve.
#[derive(Debug, Clone, Serialize)]
pub struct ModelSpec {
    pub name: String,
    pub weights_gib: f64,
    /// KV cache per token at 16 bits, KiB.
    pub kv_kib_per_token: f64,
    /// GFLOP per token through the model (≈ 2 × parameters).
    pub gflop_per_token: f64,
}

impl ModelSpec {
    /// Presets: `8b` (Llama-3.1-8B-like, bf16), `32b` (Qwen3-32B-like, bf16), `135m`
    /// (SmolLM2-135M, Q4 GGUF).
    pub fn preset(name: &str) -> Option<ModelSpec> {
        let (w, kv, gf) = match name {
            "8b" => (15.0, 128.0, 16.0),
            "32b" => (61.0, 256.0, 64.0),
            "135m" => (0.09, 23.0, 0.27),
            _ => return None,
        };
        Some(ModelSpec {
            name: name.into(),
            weights_gib: w,
            kv_kib_per_token: kv,
            gflop_per_token: gf,
        })
    }
}

/// What an engine's flags mean for the scheduler and the cost of a step, whatever the engine.
#[derive(Debug, Clone, Serialize)]
pub struct Settings {
    /// Sequences in a batch at most.
    pub max_seqs: u32,
    /// Tokens (prefill chunks + decodes) per step at most.
    pub max_batched_tokens: u32,
    pub chunked_prefill: bool,
    /// Reuse of KV blocks of identical prompt prefixes.
    pub prefix_cache: bool,
    pub block_size: u32,
    /// KV capacity in tokens (from the memory budget; computed by the profile).
    pub kv_tokens: u64,
    /// Bytes of KV per token relative to 16 bits (0.5 = fp8/q8).
    pub kv_factor: f64,
    /// Weight bytes relative to 16 bits (0.5 = fp8).
    pub weight_factor: f64,
    /// Compute cost relative to bf16 (fp8 GEMMs are faster).
    pub flop_factor: f64,
    /// Fixed cost per step, ms (kernel launches, scheduling, sampling).
    pub overhead_ms: f64,
    /// Batches up to this size run as captured graphs (cheaper launches); 0 = never.
    pub graph_max_bs: u32,
    /// Speculative tokens per step and the chance each is accepted.
    pub spec_k: u32,
    pub spec_accept: f64,
    /// Tensor-parallel ranks.
    pub tp: u32,
    /// CPU engines: threads for decode and for prefill (0 = one per core).
    pub threads: u32,
    pub threads_batch: u32,
    /// Prefill micro-batch (CPU engines: small ones waste compute).
    pub ubatch: u32,
    /// Attention cost relative to the plain kernel (flash attention < 1).
    pub attn_factor: f64,
    /// Admit new sequences only when the batch is empty (no continuous batching).
    pub static_batching: bool,
    /// Admit only every N steps (SGLang's continuous decode steps).
    pub admit_every: u32,
    /// Per-sequence context limit (llama.cpp slots), 0 = none.
    pub slot_ctx: u64,
    /// Multiplicative step-time noise (log-normal sigma).
    pub noise: f64,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            max_seqs: 256,
            max_batched_tokens: 8192,
            chunked_prefill: true,
            prefix_cache: true,
            block_size: 16,
            kv_tokens: 1 << 20,
            kv_factor: 1.0,
            weight_factor: 1.0,
            flop_factor: 1.0,
            overhead_ms: 1.5,
            graph_max_bs: 512,
            spec_k: 0,
            spec_accept: 0.0,
            tp: 1,
            threads: 0,
            threads_batch: 0,
            ubatch: 512,
            attn_factor: 1.0,
            static_batching: false,
            admit_every: 1,
            slot_ctx: 0,
            noise: 0.02,
        }
    }
}

/// One request inside the scheduler.
#[derive(Debug, Clone)]
struct Seq {
    id: u64,
    /// Tokens to prefill (the prompt, plus the output so far after a preemption).
    prompt: u64,
    /// Prompt tokens found in the prefix cache.
    cached: u64,
    prefilled: u64,
    out: u64,
    max_out: u64,
    /// Chained hashes of the prompt's full blocks.
    blocks: Vec<u64>,
    /// KV tokens this sequence holds.
    kv: u64,
}

/// A request as submitted.
#[derive(Debug, Clone)]
pub struct Submit {
    pub id: u64,
    pub prompt_tokens: u64,
    pub max_tokens: u64,
    /// Chained hashes of the prompt's `block_size`-token blocks (for prefix caching).
    pub blocks: Vec<u64>,
}

/// What one step produced for one request.
#[derive(Debug, Clone, PartialEq)]
pub struct Emit {
    pub id: u64,
    pub tokens: u64,
    pub done: bool,
}

/// A request the scheduler refuses (longer than a slot's context).
#[derive(Debug, Clone, PartialEq)]
pub struct Refusal {
    pub id: u64,
    pub prompt_tokens: u64,
    pub limit: u64,
}

#[derive(Debug, Default, Clone)]
pub struct Step {
    pub duration_s: f64,
    /// Prompt tokens computed in this step (what activation memory scales with).
    pub prefill_tokens: u64,
    pub emits: Vec<Emit>,
    pub refused: Vec<Refusal>,
}

/// Counters over the scheduler's life.
#[derive(Debug, Default, Clone, Serialize)]
pub struct SchedStats {
    pub steps: u64,
    pub preemptions: u64,
    pub prefix_hit_tokens: u64,
    pub prompt_tokens: u64,
    pub max_running: u64,
    pub max_kv_used: u64,
    /// The most prompt tokens computed in one step.
    pub max_prefill_tokens: u64,
}

/// The continuous-batching scheduler with its cost model.
pub struct Sched {
    pub settings: Settings,
    hw: Hardware,
    model: ModelSpec,
    waiting: VecDeque<Seq>,
    running: Vec<Seq>,
    kv_used: u64,
    cache: HashSet<u64>,
    cache_order: VecDeque<u64>,
    rng: StdRng,
    noise: LogNormal<f64>,
    step_no: u64,
    pub stats: SchedStats,
}

impl Sched {
    pub fn new(settings: Settings, hw: Hardware, model: ModelSpec, seed: u64) -> Sched {
        let noise = LogNormal::new(0.0, settings.noise.max(0.0))
            .unwrap_or_else(|_| LogNormal::new(0.0, 0.0).expect("sigma 0 is valid"));
        Sched {
            settings,
            hw,
            model,
            waiting: VecDeque::new(),
            running: Vec::new(),
            kv_used: 0,
            cache: HashSet::new(),
            cache_order: VecDeque::new(),
            rng: StdRng::seed_from_u64(seed),
            noise,
            step_no: 0,
            stats: SchedStats::default(),
        }
    }

    pub fn submit(&mut self, r: Submit) {
        self.waiting.push_back(Seq {
            id: r.id,
            prompt: r.prompt_tokens.max(1),
            cached: 0,
            prefilled: 0,
            out: 0,
            max_out: r.max_tokens.max(1),
            blocks: r.blocks,
            kv: 0,
        });
    }

    /// Drops a request (the client went away).
    pub fn cancel(&mut self, id: u64) {
        self.waiting.retain(|s| s.id != id);
        if let Some(i) = self.running.iter().position(|s| s.id == id) {
            let s = self.running.remove(i);
            self.kv_used -= s.kv;
        }
    }

    pub fn idle(&self) -> bool {
        self.waiting.is_empty() && self.running.is_empty()
    }

    pub fn running(&self) -> usize {
        self.running.len()
    }

    pub fn waiting(&self) -> usize {
        self.waiting.len()
    }

    /// KV usage, 0..1.
    pub fn kv_usage(&self) -> f64 {
        self.kv_used as f64 / self.settings.kv_tokens.max(1) as f64
    }

    fn remember_blocks(&mut self, blocks: &[u64]) {
        let cap =
            (self.settings.kv_tokens / self.settings.block_size.max(1) as u64).max(1) as usize;
        for b in blocks {
            if self.cache.insert(*b) {
                self.cache_order.push_back(*b);
            }
        }
        while self.cache_order.len() > cap {
            if let Some(old) = self.cache_order.pop_front() {
                self.cache.remove(&old);
            }
        }
    }

    fn admit(&mut self, out: &mut Step) {
        let st = &self.settings;
        if st.static_batching && !self.running.is_empty() {
            return;
        }
        if st.admit_every > 1
            && self.step_no % st.admit_every as u64 != 0
            && !self.running.is_empty()
        {
            return;
        }
        while (self.running.len() as u32) < st.max_seqs {
            let Some(front) = self.waiting.front() else {
                break;
            };
            if st.slot_ctx > 0 && front.prompt >= st.slot_ctx {
                let s = self.waiting.pop_front().expect("front exists");
                out.refused.push(Refusal {
                    id: s.id,
                    prompt_tokens: s.prompt,
                    limit: st.slot_ctx,
                });
                continue;
            }
            let need = front.prompt + 1;
            if self.kv_used + need > st.kv_tokens && !self.running.is_empty() {
                break;
            }
            let mut s = self.waiting.pop_front().expect("front exists");
            if st.prefix_cache && s.prefilled == 0 && s.out == 0 {
                let hits = s
                    .blocks
                    .iter()
                    .take_while(|b| self.cache.contains(b))
                    .count() as u64;
                s.cached = (hits * st.block_size as u64).min(s.prompt - 1);
                self.stats.prefix_hit_tokens += s.cached;
            }
            self.stats.prompt_tokens += s.prompt;
            s.kv = need.min(st.kv_tokens);
            self.kv_used += s.kv;
            self.running.push(s);
        }
        self.stats.max_running = self.stats.max_running.max(self.running.len() as u64);
    }

    /// Preempts the most recently admitted sequences until `extra` more KV tokens fit
    /// (recompute: the sequence re-prefills its prompt and output so far).
    fn make_room(&mut self, extra: u64) {
        while self.kv_used + extra > self.settings.kv_tokens && self.running.len() > 1 {
            let mut s = self.running.pop().expect("len > 1");
            self.kv_used -= s.kv;
            s.kv = 0;
            s.prompt += s.out;
            s.max_out -= s.out.min(s.max_out - 1);
            s.out = 0;
            s.prefilled = 0;
            s.cached = 0;
            self.stats.preemptions += 1;
            self.waiting.push_front(s);
        }
    }

    /// One engine iteration. Call only when not idle.
    pub fn step(&mut self) -> Step {
        let mut out = Step::default();
        self.admit(&mut out);
        self.step_no += 1;
        self.stats.steps += 1;
        let st = self.settings.clone();
        let decoding = self
            .running
            .iter()
            .filter(|s| s.cached + s.prefilled >= s.prompt)
            .count() as u64;
        let per_decode = 1 + st.spec_k as u64;
        self.make_room(decoding);
        let mut budget = st.max_batched_tokens as u64;
        let mut decode_tokens = 0u64;
        let mut prefill_tokens = 0u64;
        let mut ctx_sum = 0u64;
        let mut spec_rng_draws = Vec::new();
        // Decodes first, then prefill chunks in arrival order.
        for s in self.running.iter_mut() {
            if s.cached + s.prefilled >= s.prompt {
                let cost = per_decode.min(budget.max(1));
                budget = budget.saturating_sub(cost);
                decode_tokens += cost;
                ctx_sum += s.prompt + s.out;
                spec_rng_draws.push(s.id);
            }
        }
        let mut finishing_prefill = Vec::new();
        for s in self.running.iter_mut() {
            let left = s.prompt - (s.cached + s.prefilled).min(s.prompt);
            if left == 0 || budget == 0 {
                continue;
            }
            let chunk = if st.chunked_prefill {
                left.min(budget)
            } else if left <= budget {
                left
            } else {
                continue;
            };
            budget -= chunk;
            prefill_tokens += chunk;
            s.prefilled += chunk;
            if s.cached + s.prefilled >= s.prompt {
                finishing_prefill.push(s.id);
            }
        }
        out.prefill_tokens = prefill_tokens;
        self.stats.max_prefill_tokens = self.stats.max_prefill_tokens.max(prefill_tokens);
        out.duration_s = self.cost_ms(decode_tokens, decoding, prefill_tokens, ctx_sum) / 1000.0
            * self.noise.sample(&mut self.rng);
        // Tokens: one per finished prefill (the first token), one plus accepted drafts per decode.
        let mut done = Vec::new();
        let mut new_blocks = Vec::new();
        for s in self.running.iter_mut() {
            let produced = if finishing_prefill.contains(&s.id) {
                new_blocks.extend(s.blocks.iter().copied());
                1
            } else if spec_rng_draws.contains(&s.id) {
                let mut n = 1;
                while n <= st.spec_k as u64 && self.rng.random_bool(st.spec_accept.clamp(0.0, 1.0))
                {
                    n += 1;
                }
                n
            } else {
                0
            };
            if produced == 0 {
                continue;
            }
            let produced = produced.min(s.max_out - s.out);
            s.out += produced;
            let grow = produced.min(st.kv_tokens.saturating_sub(self.kv_used));
            s.kv += grow;
            self.kv_used += grow;
            let fin = s.out >= s.max_out;
            out.emits.push(Emit {
                id: s.id,
                tokens: produced,
                done: fin,
            });
            if fin {
                done.push(s.id);
            }
        }
        if st.prefix_cache {
            self.remember_blocks(&new_blocks);
        }
        self.stats.max_kv_used = self.stats.max_kv_used.max(self.kv_used);
        for id in done {
            self.cancel(id);
        }
        out
    }

    /// Milliseconds for a step: fixed overhead, then the roofline of weight reads against
    /// compute, plus attention reading each sequence's KV.
    fn cost_ms(
        &self,
        decode_tokens: u64,
        decode_seqs: u64,
        prefill_tokens: u64,
        ctx_sum: u64,
    ) -> f64 {
        let st = &self.settings;
        let hw = &self.hw;
        let m = &self.model;
        let tp = st.tp.max(1) as f64;
        let batch = decode_seqs as u32;
        let mut overhead = st.overhead_ms;
        if hw.sm > 0 && (st.graph_max_bs == 0 || batch > st.graph_max_bs || prefill_tokens > 0) {
            // Eager launches: a few µs per kernel, more kernels with more sequences.
            overhead = overhead * 2.5 + 0.004 * decode_seqs as f64;
        }
        let (compute_units, prefill_units) = if hw.sm == 0 {
            let cores = hw.cores.max(1) as f64;
            let eff = |t: u32| {
                let t = if t == 0 { cores } else { t as f64 };
                // Oversubscribed threads spin against each other.
                if t <= cores {
                    t
                } else {
                    cores / (t / cores).powf(0.7)
                }
            };
            (eff(st.threads), eff(st.threads_batch))
        } else {
            (1.0, 1.0)
        };
        let weights_ms = m.weights_gib * st.weight_factor / hw.bw_gib_ms / tp
            * if hw.sm == 0 {
                2.0 / compute_units.min(2.0)
            } else {
                1.0
            };
        let flop_ms_per_token = m.gflop_per_token * st.flop_factor / (hw.tflops * 1e3) / tp;
        let ubatch_eff = if hw.sm == 0 {
            let u = st.ubatch.max(1) as f64;
            u / (u + 48.0)
        } else {
            1.0
        };
        let decode_ms = decode_tokens as f64 * flop_ms_per_token / compute_units;
        let prefill_ms = prefill_tokens as f64 * flop_ms_per_token / prefill_units / ubatch_eff;
        let attn_ms = ctx_sum as f64 * m.kv_kib_per_token * st.kv_factor
            / (1u64 << 20) as f64
            / hw.bw_gib_ms
            / tp
            * st.attn_factor;
        let allreduce = if st.tp > 1 { 0.05 * (tp - 1.0) } else { 0.0 };
        overhead + weights_ms.max(decode_ms + prefill_ms) + attn_ms + allreduce
    }
}

/// Chained hashes of a token sequence's full blocks: block i's hash covers tokens 0..(i+1)·B,
/// so two prompts share block hashes exactly as far as they share a block-aligned prefix.
pub fn block_hashes(tokens: &[u64], block: usize) -> Vec<u64> {
    let mut h = 0xcbf2_9ce4_8422_2325u64;
    let mut out = Vec::new();
    for chunk in tokens.chunks(block.max(1)) {
        if chunk.len() < block.max(1) {
            break;
        }
        for t in chunk {
            h ^= *t;
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
        out.push(h);
    }
    out
}

/// A request of a simulated benchmark.
#[derive(Debug, Clone)]
pub struct SimRequest {
    pub arrival_s: f64,
    pub prompt_tokens: u64,
    pub max_tokens: u64,
    pub blocks: Vec<u64>,
}

/// Per-request outcome of a simulated benchmark (what a client would have measured).
#[derive(Debug, Clone, Default)]
pub struct SimOutcome {
    pub ok: bool,
    pub ttft_s: f64,
    pub e2el_s: f64,
    pub output_tokens: u64,
    pub prompt_tokens: u64,
}

/// Runs a whole benchmark in virtual time: requests arrive at their times, the scheduler steps
/// back to back while busy. Returns the outcomes (in request order) and the makespan.
pub fn simulate(
    sched: &mut Sched,
    reqs: &[SimRequest],
    max_concurrency: Option<usize>,
) -> (Vec<SimOutcome>, f64) {
    let mut outcomes = vec![SimOutcome::default(); reqs.len()];
    let mut order: Vec<usize> = (0..reqs.len()).collect();
    order.sort_by(|a, b| reqs[*a].arrival_s.total_cmp(&reqs[*b].arrival_s));
    let mut next = 0usize;
    let mut now = 0.0f64;
    let mut in_flight = 0usize;
    let mut pending: VecDeque<usize> = VecDeque::new();
    let mut start = vec![0.0f64; reqs.len()];
    let mut finished = 0usize;
    while finished < reqs.len() {
        while next < order.len() && reqs[order[next]].arrival_s <= now {
            pending.push_back(order[next]);
            next += 1;
        }
        while let Some(&i) = pending.front() {
            if max_concurrency.is_some_and(|c| in_flight >= c) {
                break;
            }
            pending.pop_front();
            start[i] = now.max(reqs[i].arrival_s);
            outcomes[i].prompt_tokens = reqs[i].prompt_tokens;
            in_flight += 1;
            sched.submit(Submit {
                id: i as u64,
                prompt_tokens: reqs[i].prompt_tokens,
                max_tokens: reqs[i].max_tokens,
                blocks: reqs[i].blocks.clone(),
            });
        }
        if sched.idle() {
            match order.get(next) {
                Some(&i) => {
                    now = now.max(reqs[i].arrival_s);
                    continue;
                }
                None if pending.is_empty() => break,
                None => continue,
            }
        }
        let step = sched.step();
        now += step.duration_s;
        for r in step.refused {
            let i = r.id as usize;
            outcomes[i].ok = false;
            outcomes[i].e2el_s = now - start[i];
            finished += 1;
            in_flight -= 1;
        }
        for e in step.emits {
            let i = e.id as usize;
            if outcomes[i].output_tokens == 0 {
                outcomes[i].ttft_s = now - start[i];
            }
            outcomes[i].output_tokens += e.tokens;
            if e.done {
                outcomes[i].ok = true;
                outcomes[i].e2el_s = now - start[i];
                finished += 1;
                in_flight -= 1;
            }
        }
    }
    (outcomes, now)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sched(s: Settings) -> Sched {
        Sched::new(
            Settings { noise: 0.0, ..s },
            Hardware::preset("h100", 16).unwrap(),
            ModelSpec::preset("8b").unwrap(),
            1,
        )
    }

    fn load(n: usize, prompt: u64, out: u64) -> Vec<SimRequest> {
        (0..n)
            .map(|i| SimRequest {
                arrival_s: 0.0,
                prompt_tokens: prompt,
                max_tokens: out,
                blocks: block_hashes(
                    &(0..prompt)
                        .map(|t| t + i as u64 * 100_000)
                        .collect::<Vec<_>>(),
                    16,
                ),
            })
            .collect()
    }

    fn throughput(s: Settings, reqs: &[SimRequest]) -> (f64, Vec<SimOutcome>) {
        let mut sc = sched(s);
        let (o, t) = simulate(&mut sc, reqs, None);
        let tokens: u64 = o.iter().map(|x| x.output_tokens + x.prompt_tokens).sum();
        (tokens as f64 / t, o)
    }

    #[test]
    fn bigger_batches_raise_throughput_and_latency_until_compute_bound() {
        let reqs = load(512, 256, 128);
        let (t8, o8) = throughput(
            Settings {
                max_seqs: 8,
                ..Default::default()
            },
            &reqs,
        );
        let (t128, _) = throughput(
            Settings {
                max_seqs: 128,
                ..Default::default()
            },
            &reqs,
        );
        let (t512, o512) = throughput(
            Settings {
                max_seqs: 512,
                ..Default::default()
            },
            &reqs,
        );
        assert!(t128 > 4.0 * t8, "{t8} {t128}");
        assert!(t512 > t128, "{t128} {t512}");
        let tpot = |o: &[SimOutcome]| {
            o.iter()
                .map(|x| (x.e2el_s - x.ttft_s) / (x.output_tokens - 1) as f64)
                .sum::<f64>()
                / o.len() as f64
        };
        assert!(tpot(&o512) > tpot(&o8));
        assert!(o8.iter().all(|x| x.ok && x.output_tokens == 128));
    }

    #[test]
    fn kv_capacity_preempts_and_prefix_cache_saves_prefill() {
        let reqs = load(64, 1024, 256);
        let mut small = sched(Settings {
            kv_tokens: 8 * 1024,
            ..Default::default()
        });
        let (o, _) = simulate(&mut small, &reqs, None);
        assert!(o.iter().all(|x| x.ok && x.output_tokens == 256));
        assert!(small.stats.preemptions > 0);
        // The same 1024-token prompt 64 times: all but the first hit the cache.
        let same: Vec<SimRequest> = (0..64)
            .map(|i| SimRequest {
                arrival_s: i as f64 * 0.05,
                prompt_tokens: 1024,
                max_tokens: 4,
                blocks: block_hashes(&(0..1024).collect::<Vec<_>>(), 16),
            })
            .collect();
        let mut on = sched(Settings::default());
        simulate(&mut on, &same, None);
        assert!(on.stats.prefix_hit_tokens >= 60 * 1008, "{:?}", on.stats);
        let (t_on, _) = throughput(Settings::default(), &same);
        let (t_off, _) = throughput(
            Settings {
                prefix_cache: false,
                ..Default::default()
            },
            &same,
        );
        assert!(t_on >= t_off);
    }

    #[test]
    fn speculation_helps_small_batches_and_slots_refuse_long_prompts() {
        let reqs = load(4, 128, 256);
        let plain = Settings {
            max_seqs: 4,
            ..Default::default()
        };
        let spec = Settings {
            spec_k: 3,
            spec_accept: 0.7,
            ..plain.clone()
        };
        let (a, _) = throughput(plain, &reqs);
        let (b, _) = throughput(spec, &reqs);
        assert!(b > 1.3 * a, "{a} {b}");
        let mut sc = sched(Settings {
            slot_ctx: 512,
            ..Default::default()
        });
        let mut reqs = load(2, 100, 8);
        reqs[1].prompt_tokens = 600;
        let (o, _) = simulate(&mut sc, &reqs, None);
        assert!(o[0].ok && !o[1].ok);
    }

    #[test]
    fn same_seed_same_numbers() {
        let reqs = load(100, 300, 50);
        let run = || {
            let mut s = Sched::new(
                Settings::default(),
                Hardware::preset("h200", 16).unwrap(),
                ModelSpec::preset("8b").unwrap(),
                7,
            );
            simulate(&mut s, &reqs, Some(32)).1
        };
        assert_eq!(run(), run());
    }
}
