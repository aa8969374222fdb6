#!/usr/bin/env python3
"""Ground truth for a search-quality claim: a small expert grid of an engine's flags measured
on the real engine, interleaved (each round runs every arm, in an order rotated per round),
a fresh engine for every run, with `servetune bench` as the load generator and nothing else
of servetune's. Prints each arm's mean and its change against the defaults with a Welch 95%
interval, the best-known configuration, and 80% of its gain (the bar a study must reach).

    benches/ground_truth.py --rounds 3 \\
        --base "llama-server -m M --ctx-size 8192 --metrics" \\
        --arm "--parallel 16" --arm "--parallel 16 --ubatch-size 32" \\
        -- --dataset-name random --random-input-len 32 --random-output-len 128 \\
           --ignore-eos --num-prompts 32 --max-concurrency 16 --seed 0

The first arm is always the base command alone (the engine's defaults); each `--arm` adds its
flags to it. Commands are split with shlex (never run through a shell). `--json FILE` writes
every run. `benches/ground_truth_decode.sh` runs the decode study's grid.
"""

import argparse
import json
import os
import statistics
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from remeasure import ROOT, exit_on_sigterm, one_run, welch  # noqa: E402


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--base", required=True, help="the engine's command with its defaults")
    p.add_argument("--arm", action="append", default=[], help="flags added to --base (repeat)")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--servetune", default=os.path.join(ROOT, "target/release/servetune"))
    p.add_argument("--json", help="write every run here")
    p.add_argument("bench", nargs=argparse.REMAINDER, help="-- then `servetune bench` flags")
    a = p.parse_args()
    if a.rounds < 2:
        p.error("--rounds must be at least 2 for an interval")
    exit_on_sigterm()
    bench = a.bench[1:] if a.bench[:1] == ["--"] else a.bench
    arms = [("defaults", a.base)] + [(flags, f"{a.base} {flags}") for flags in a.arm]
    workdir = tempfile.mkdtemp(prefix="ground-truth-")
    runs = {name: [] for name, _ in arms}
    for r in range(a.rounds):
        order = arms[r % len(arms):] + arms[:r % len(arms)]
        for i, (name, cmd) in enumerate(order):
            res = one_run(a.servetune, cmd, bench, workdir, f"r{r}-{arms.index((name, cmd))}")
            tput = res["total_token_throughput"]
            runs[name].append({"round": r, "total_token_throughput": tput,
                               "mean_tpot_ms": res.get("mean_tpot_ms"),
                               "p99_ttft_ms": res.get("p99_ttft_ms"),
                               "failed": res.get("failed")})
            print(f"round {r + 1} [{i + 1}/{len(arms)}] {name:40s} {tput:8.2f} tok/s  "
                  f"mean TPOT {res.get('mean_tpot_ms', float('nan')):6.1f} ms  "
                  f"failed {res.get('failed', 0)}", flush=True)
    d = [x["total_token_throughput"] for x in runs["defaults"]]
    md = statistics.mean(d)
    table = []
    print()
    print("| arm | runs | total tok/s mean | sd | change vs defaults (95% CI) |")
    print("|---|---|---|---|---|")
    for name, _ in arms:
        c = [x["total_token_throughput"] for x in runs[name]]
        mc = statistics.mean(c)
        if name == "defaults":
            change, ci = 0.0, [0.0, 0.0]
            cell = "-"
        else:
            diff, lo, hi = welch(c, d)
            change, ci = 100 * diff / md, [100 * lo / md, 100 * hi / md]
            cell = f"{change:+.1f}% ({ci[0]:+.1f}% to {ci[1]:+.1f}%)"
        table.append({"arm": name, "mean": mc, "sd": statistics.stdev(c),
                      "change_pct": change, "ci_pct": ci})
        print(f"| `{name}` | {len(c)} | {mc:.2f} | {statistics.stdev(c):.2f} | {cell} |")
    best = max(table, key=lambda t: t["mean"])
    print(f"\nbest known: `{best['arm']}` at {best['change_pct']:+.1f}% "
          f"(95% CI {best['ci_pct'][0]:+.1f}% to {best['ci_pct'][1]:+.1f}%); "
          f"80% of its gain: {0.8 * best['change_pct']:+.1f}%")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"runs": runs, "table": table, "best": best}, f, indent=1)


if __name__ == "__main__":
    sys.exit(main())
