#!/usr/bin/env bash
# The decode study's ground truth (studies/llamacpp-smollm2-decode.toml): an expert grid of
# llama-server flags on the study's own workload, 3 interleaved rounds, fresh engines. About
# 9 minutes on 2 cores. Extra arguments go to ground_truth.py (e.g. --rounds 5 --json F).
set -euo pipefail
cd "$(dirname "$0")/.."
bin=target/release/servetune
eval "$("$bin" setup llamacpp --print-paths | grep -E '^(LLAMA_SERVER|SMOLLM2_GGUF)=')"
exec python3 benches/ground_truth.py \
  --base "$LLAMA_SERVER -m $SMOLLM2_GGUF --ctx-size 8192 --metrics" \
  --arm "--parallel 16" \
  --arm "--parallel 32" \
  --arm "--parallel 16 --ubatch-size 32" \
  --arm "--parallel 16 --ubatch-size 32 --flash-attn on" \
  "$@" \
  -- --dataset-name random --random-input-len 32 --random-output-len 128 --ignore-eos \
     --num-prompts 32 --max-concurrency 16 --seed 0
