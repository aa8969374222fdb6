#!/usr/bin/env bash
# A real llama-server study with parallel trials on this 2-core machine: the decode study
# (studies/llamacpp-smollm2-decode.toml) with `cores_per_trial = 1`, so two single-core
# slots, each trial's engine pinned to its core (`--threads` at the slot's one core where
# the configuration leaves it at its default). Prints the study's log; the interference
# check's result is its "interference check" lines (and `servetune trials --json`).
# Extra arguments: the budget (default 8 trials) and the state directory.
set -euo pipefail
cd "$(dirname "$0")/.."
bin="${SERVETUNE_BIN:-target/release/servetune}"
budget="${1:-8}"
state="${2:-$(mktemp -d)}"
dir="$(mktemp -d)"
sed -e 's/^name = "llamacpp-smollm2-decode"/name = "llamacpp-smollm2-decode-2slots"\ncores_per_trial = 1/' \
    -e "s/^trials = 12/trials = $budget/" \
    studies/llamacpp-smollm2-decode.toml > "$dir/decode-2slots.toml"
mkdir -p "$dir/search-spaces" && cp search-spaces/*.toml "$dir/search-spaces/"
echo "state: $state" >&2
"$bin" tune "$dir/decode-2slots.toml" --state "$state"
"$bin" trials llamacpp-smollm2-decode-2slots --state "$state"
