#!/usr/bin/env bash
# benches/peer_compare.sh: servetune's client side by side with guidellm 0.8.1 and an
# independent stdlib client (sse_probe.py), in one run, on this machine. Prints a Markdown
# table of ratios. Needs the peer set up (../shared/tools/peer/peer_setup.sh) and
# `servetune setup llamacpp`. Not part of the tests: the figures are noisy by nature.
#   PEER=../shared/tools/peer  OUT=/tmp/servetune-peer  bash benches/peer_compare.sh
set -euo pipefail
cd "$(dirname "$0")/.."
PEER=${PEER:-../shared/tools/peer}
OUT=${OUT:-/tmp/servetune-peer}
GL=${GL_VENV:-/tmp/gl}/bin/guidellm
mkdir -p "$OUT"
cargo build --release -q
ST=$PWD/target/release/servetune
eval "$($ST setup llamacpp --print-paths)"
[ -x "$GL" ] || { echo "guidellm missing: run $PEER/peer_setup.sh" >&2; exit 2; }
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; }
trap cleanup EXIT
wait_http() { for _ in $(seq 1 600); do curl -sf "$1" >/dev/null && return 0; sleep 0.2; done; echo "not ready: $1" >&2; return 1; }
j() { python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print(eval(sys.argv[2]))" "$@"; }
st_bench() { # NAME BASE extra flags...
  local name=$1 base=$2; shift 2
  $ST bench --base-url "$base" --disable-tqdm --save-result --result-dir "$OUT" --result-filename "$name.json" "$@" > "$OUT/$name.log" 2>&1
}
row() { printf '| %s |\n' "$*"; }

echo "## servetune vs guidellm vs sse_probe ($(date -u +%F), $(nproc) cores)"
echo

# 1. Client cost and capacity: our mock at 0/0 ms (the client is the bottleneck), conc 64,
#    2048 requests x 64 tokens, every client driving the same mock process.
taskset -c 1 "$ST" mock-engine --port 18401 --ttft-ms 0 --itl-ms 0 >/dev/null 2>&1 & pids+=($!)
wait_http http://127.0.0.1:18401/health
st_bench cost_st http://127.0.0.1:18401 --tokenizer words --random-input-len 128 --random-output-len 64 --num-prompts 2048 --max-concurrency 64 --model llama-3.1-8b-instruct
GL_SEED=1 bash "$PEER/guidellm_run.sh" http://127.0.0.1:18401 llama-3.1-8b-instruct 64 2048 64 "$OUT/cost_gl.json" > "$OUT/cost_gl.line"
GUIDELLM__MAX_WORKER_PROCESSES=1 GL_SEED=2 bash "$PEER/guidellm_run.sh" http://127.0.0.1:18401 llama-3.1-8b-instruct 64 2048 64 "$OUT/cost_gl1.json" > "$OUT/cost_gl1.line"
python3 "$PEER/sse_probe.py" 127.0.0.1:18401 64 2048 64 > "$OUT/cost_probe.line"
# capacity: client pinned to one core, mock on the other
taskset -c 0 "$ST" bench --base-url http://127.0.0.1:18401 --disable-tqdm --tokenizer words --random-input-len 16 --random-output-len 512 --num-prompts 1000 --max-concurrency 64 --save-result --result-dir "$OUT" --result-filename cap_st.json > "$OUT/cap_st.log" 2>&1
kv() { tr ' ' '\n' < "$1" | sed -n "s/^$2=//p"; }
st_cpu=$(j "$OUT/cost_st.json" "d['servetune']['client_cpu_s']/d['total_output_tokens']*1e6")
gl_cpu=$(kv "$OUT/cost_gl.line" cpu_win_per_Mtok_s); gl1_cpu=$(kv "$OUT/cost_gl1.line" cpu_win_per_Mtok_s)
pr_cpu=$(kv "$OUT/cost_probe.line" cpu_per_Mevents_s)
echo "### Client cost: CPU-s per million streamed output tokens (our mock at 0/0 ms, 64 streams, 2048 x 64 tokens)"
echo; row "client | CPU-s/Mtok | out tok/s | ratio to servetune"; row "---|---|---|---"
row "servetune | $(printf %.1f "$st_cpu") | $(j "$OUT/cost_st.json" "round(d['output_throughput'])") | 1.0"
row "guidellm (default, 10 procs) | $gl_cpu | $(kv "$OUT/cost_gl.line" out_tok_s) | $(python3 -c "print(round($gl_cpu/$st_cpu,1))")"
row "guidellm (1 worker proc) | $gl1_cpu | $(kv "$OUT/cost_gl1.line" out_tok_s) | $(python3 -c "print(round($gl1_cpu/$st_cpu,1))")"
row "sse_probe (stdlib asyncio) | $pr_cpu | $(kv "$OUT/cost_probe.line" events_per_s) | $(python3 -c "print(round($pr_cpu/$st_cpu,1))")"
echo
echo "Capacity (client pinned to 1 core, mock on the other): $(j "$OUT/cap_st.json" "round(d['servetune']['events']/d['servetune']['client_cpu_s'])") streamed events per client CPU-second; $(j "$OUT/cap_st.json" "round(d['servetune']['events']/d['duration'])") events/s achieved (target >= 100k per core)."
echo

# 1b. Client cost against a server that writes one event per packet, as real engines stream:
#     guidellm's own mock-server at 0/0 ms (our mock coalesces events that are due together),
#     the same 64 streams x 2048 requests x 64 tokens, every client against the same process.
$GL mock-server --host 127.0.0.1 --port 18405 --ttft-ms 0 --itl-ms 0 --output-tokens 64 >/dev/null 2>&1 & pids+=($!)
wait_http http://127.0.0.1:18405/health
st_bench glcost_st http://127.0.0.1:18405 --tokenizer words --random-vocab-size 1000 --random-input-len 128 --random-output-len 64 --num-prompts 2048 --max-concurrency 64 --model m
GL_SEED=3 bash "$PEER/guidellm_run.sh" http://127.0.0.1:18405 m 64 2048 64 "$OUT/glcost_gl.json" > "$OUT/glcost_gl.line"
st2_cpu=$(j "$OUT/glcost_st.json" "d['servetune']['client_cpu_s']/d['total_output_tokens']*1e6")
glm_cpu=$(kv "$OUT/glcost_gl.line" cpu_win_per_Mtok_s)
echo "### Client cost against guidellm's mock-server (0/0 ms, one event per packet; 64 streams, 2048 x 64 tokens)"
echo; row "client | CPU-s/Mtok | streamed events per client CPU-s | ratio to servetune"; row "---|---|---|---"
row "servetune | $(printf %.1f "$st2_cpu") | $(j "$OUT/glcost_st.json" "round(d['servetune']['events']/d['servetune']['client_cpu_s'])") | 1.0"
row "guidellm (default) | $glm_cpu | - | $(python3 -c "print(round($glm_cpu/$st2_cpu,1))")"
echo

# 2. Accuracy against guidellm's mock-server (50 ms TTFT, 10 ms ITL) at a load it keeps up with.
$GL mock-server --host 127.0.0.1 --port 18402 --ttft-ms 50 --itl-ms 10 --output-tokens 64 >/dev/null 2>&1 & pids+=($!)
wait_http http://127.0.0.1:18402/health
python3 "$PEER/sse_probe.py" 127.0.0.1:18402 4 128 64 > "$OUT/acc_probe.line"
st_bench acc_st http://127.0.0.1:18402 --tokenizer words --random-vocab-size 1000 --random-input-len 128 --random-output-len 64 --num-prompts 128 --max-concurrency 4 --model m
python3 "$PEER/sse_probe.py" 127.0.0.1:18402 4 128 64 > "$OUT/acc_probe2.line"
echo "### Accuracy vs an independent client: guidellm mock-server (TTFT 50 ms, ITL 10 ms), 4 streams, 128 x 64 tokens"
echo; row "client | TTFT mean ms | ITL mean ms | TPOT mean ms"; row "---|---|---|---"
row "sse_probe (before) | $(kv "$OUT/acc_probe.line" ttft_mean_ms) | $(kv "$OUT/acc_probe.line" itl_mean_ms) | $(kv "$OUT/acc_probe.line" tpot_mean_ms)"
row "servetune | $(j "$OUT/acc_st.json" "round(d['mean_ttft_ms'],2)") | $(j "$OUT/acc_st.json" "round(d['mean_itl_ms'],2)") | $(j "$OUT/acc_st.json" "round(d['mean_tpot_ms'],2)")"
row "sse_probe (after) | $(kv "$OUT/acc_probe2.line" ttft_mean_ms) | $(kv "$OUT/acc_probe2.line" itl_mean_ms) | $(kv "$OUT/acc_probe2.line" tpot_mean_ms)"
echo

# 3. Our mock at 1000 concurrent streams: the client must add no latency under load. Requests
#    arrive at 400/s (a 1000-request burst at t=0 measures the 2-core machine's connect storm,
#    not the client) and each lasts 3.25 s, so the 1000-stream cap is reached and held;
#    20k events/s keep client + mock + loopback kernel work inside the 2 cores.
"$ST" mock-engine --port 18403 --ttft-ms 100 --itl-ms 50 >/dev/null 2>&1 & pids+=($!)
wait_http http://127.0.0.1:18403/health
st_bench k1_st http://127.0.0.1:18403 --tokenizer words --random-input-len 32 --random-output-len 64 --num-prompts 4000 --max-concurrency 1000 --request-rate 400
echo "### servetune at 1000 concurrent streams against its mock (configured TTFT 100 ms, ITL 50 ms)"
echo; row "metric | configured | measured | error"; row "---|---|---|---"
for m in ttft:100 itl:50 tpot:50; do
  k=${m%%:*}; c=${m##*:}; v=$(j "$OUT/k1_st.json" "d['mean_${k}_ms']")
  row "mean $k | $c | $(printf %.2f "$v") | $(python3 -c "print(f'{($v-$c)/$c*100:+.2f}%')")"
done
row "peak concurrent | 1000 | $(j "$OUT/k1_st.json" "d['max_concurrent_requests']") |"
echo

# 4. Agreement on the real CPU engine: llama-server + SmolLM2, 8 streams, 64 x (128 prompt + 64 out),
#    after a warm-up run, alternating the clients (A B A B) so that drift hits both alike.
"$LLAMA_SERVER" -m "$SMOLLM2_GGUF" -np 8 -c 16384 --host 127.0.0.1 --port 18404 >"$OUT/llama.log" 2>&1 & pids+=($!)
wait_http http://127.0.0.1:18404/health
st_bench agr_warm http://127.0.0.1:18404 --random-input-len 128 --random-output-len 16 --num-prompts 16 --max-concurrency 8 --seed 99
for r in 1 2; do
  GL_SEED=$((10 + r)) bash "$PEER/guidellm_run.sh" http://127.0.0.1:18404 "$SMOLLM2_GGUF" 8 64 64 "$OUT/agr_gl$r.json" > "$OUT/agr_gl$r.line"
  st_bench agr_st$r http://127.0.0.1:18404 --random-input-len 128 --random-output-len 64 --num-prompts 64 --max-concurrency 8 --seed $((20 + r))
done
st_bench agr_sg http://127.0.0.1:18404 --dataset-name sharegpt --dataset-path "$SHAREGPT_JSON" --allow-truncated --num-prompts 64 --sharegpt-output-len 64 --ignore-eos --max-concurrency 8 --seed 11
echo "### Agreement on llama-server + SmolLM2-135M (8 streams, 64 requests, 64 output tokens; runs alternate)"
echo; row "run | client, prompts | total tok/s | out tok/s | TTFT mean ms | ITL mean ms"; row "---|---|---|---|---|---"
for r in 1 2; do
  row "$r | guidellm, synthetic 128-token | $(kv "$OUT/agr_gl$r.line" total_tok_s) | $(kv "$OUT/agr_gl$r.line" out_tok_s) | $(kv "$OUT/agr_gl$r.line" ttft_mean_ms) | $(kv "$OUT/agr_gl$r.line" itl_mean_ms)"
  row "$r | servetune, random 128-token | $(j "$OUT/agr_st$r.json" "round(d['total_token_throughput'],1)") | $(j "$OUT/agr_st$r.json" "round(d['output_throughput'],1)") | $(j "$OUT/agr_st$r.json" "round(d['mean_ttft_ms'],1)") | $(j "$OUT/agr_st$r.json" "round(d['mean_itl_ms'],2)")"
done
row "- | servetune, ShareGPT | $(j "$OUT/agr_sg.json" "round(d['total_token_throughput'],1)") | $(j "$OUT/agr_sg.json" "round(d['output_throughput'],1)") | $(j "$OUT/agr_sg.json" "round(d['mean_ttft_ms'],1)") | $(j "$OUT/agr_sg.json" "round(d['mean_itl_ms'],2)")"
echo
echo "Raw outputs: $OUT"
