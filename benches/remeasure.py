#!/usr/bin/env python3
"""Independent re-measurement of a verdict: the engine's defaults against a recommended
command, interleaved (A B, B A, ...), a fresh engine for every run, with `servetune bench`.

It shares nothing with the study that made the verdict but the load generator: its own
engine processes (argv lists, never a shell), its own ports, its own rounds and statistics.

    benches/remeasure.py --rounds 5 \
        --defaults "llama-server -m M --ctx-size 8192 --metrics" \
        --candidate "llama-server -m M --ctx-size 8192 --metrics --parallel 16" \
        -- --dataset-name random --random-input-len 32 --random-output-len 128 \
           --ignore-eos --num-prompts 64 --max-concurrency 16 --seed 0

The commands are split with shlex (as a shell would, without running one); `--port N` in them
is replaced by a free port. Prints one line per run and a table: mean, standard deviation and
95% interval (Welch, t quantile from scipy when installed, else the table row at or below
the degrees of freedom, which widens the interval) of total token
throughput and the candidate's change against the defaults. `--json FILE` writes the runs.
"""

import argparse
import json
import math
import os
import shlex
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Two-sided 95% Student t quantiles (t_{0.975, df}), for when scipy is missing.
T975 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306,
        9: 2.262, 10: 2.228, 12: 2.179, 15: 2.131, 20: 2.086, 30: 2.042, 60: 2.000}


def t975(df):
    try:
        from scipy.stats import t  # type: ignore
        return float(t.ppf(0.975, df))
    except ImportError:
        # The row at or below df: a quantile at least the true one (a conservative interval).
        below = [k for k in T975 if k <= max(df, 1)]
        return T975[max(below)] if df < 120 else 1.96


def exit_on_sigterm():
    """SIGTERM unwinds like an exception, so `one_run`'s `finally` stops the engine it
    started (Python's default SIGTERM ends the process at once and leaves it running)."""
    def handler(signum, _frame):
        raise SystemExit(128 + signum)
    signal.signal(signal.SIGTERM, handler)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def argv_with_port(cmd, port):
    argv = shlex.split(cmd)
    out, i = [], 0
    while i < len(argv):
        if argv[i] == "--port" and i + 1 < len(argv):
            i += 2
            continue
        if argv[i] == "--host" and i + 1 < len(argv):
            i += 2
            continue
        out.append(argv[i])
        i += 1
    return out + ["--host", "127.0.0.1", "--port", str(port)]


def wait_ready(port, proc, limit_s=300):
    t0 = time.time()
    while time.time() - t0 < limit_s:
        if proc.poll() is not None:
            raise RuntimeError(f"engine exited with {proc.returncode}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
                if r.status == 200:
                    return time.time() - t0
        except Exception:
            pass
        time.sleep(0.25)
    raise RuntimeError("engine not ready in time")


def stop(proc):
    try:
        os.killpg(proc.pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    try:
        proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def one_run(servetune, cmd, bench_args, workdir, label):
    port = free_port()
    log = open(os.path.join(workdir, f"{label}.log"), "ab")
    proc = subprocess.Popen(argv_with_port(cmd, port), stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True)
    try:
        wait_ready(port, proc)
        out = os.path.join(workdir, f"{label}.json")
        subprocess.run([servetune, "bench", "--base-url", f"http://127.0.0.1:{port}",
                        "--save-result", "--result-dir", workdir, "--result-filename",
                        os.path.basename(out), "--disable-tqdm"] + bench_args,
                       check=True, stdout=subprocess.DEVNULL)
        with open(out) as f:
            r = json.load(f)
        return r
    finally:
        stop(proc)
        log.close()


def welch(a, b):
    ma, mb = statistics.mean(a), statistics.mean(b)
    va, vb = statistics.variance(a) / len(a), statistics.variance(b) / len(b)
    se = math.sqrt(va + vb)
    df = (va + vb) ** 2 / (va * va / (len(a) - 1) + vb * vb / (len(b) - 1)) if se > 0 else 1e9
    h = t975(df) * se
    d = ma - mb
    return d, d - h, d + h


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--defaults", required=True, help="the engine's command with its defaults")
    p.add_argument("--candidate", required=True, help="the recommended command")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--servetune", default=os.path.join(ROOT, "target/release/servetune"))
    p.add_argument("--json", help="write every run here")
    p.add_argument("bench", nargs=argparse.REMAINDER, help="-- then `servetune bench` flags")
    a = p.parse_args()
    exit_on_sigterm()
    bench = a.bench[1:] if a.bench[:1] == ["--"] else a.bench
    workdir = tempfile.mkdtemp(prefix="remeasure-")
    runs = {"defaults": [], "candidate": []}
    for r in range(a.rounds):
        order = ["defaults", "candidate"] if r % 2 == 0 else ["candidate", "defaults"]
        for arm in order:
            cmd = a.defaults if arm == "defaults" else a.candidate
            res = one_run(a.servetune, cmd, bench, workdir, f"r{r}-{arm}")
            tput = res["total_token_throughput"]
            runs[arm].append({"round": r, "total_token_throughput": tput,
                              "mean_tpot_ms": res.get("mean_tpot_ms"),
                              "p99_ttft_ms": res.get("p99_ttft_ms"),
                              "completed": res.get("completed"), "failed": res.get("failed")})
            print(f"round {r + 1} {arm:9s} {tput:8.2f} tok/s  mean TPOT "
                  f"{res.get('mean_tpot_ms', float('nan')):7.1f} ms  failed {res.get('failed', 0)}",
                  flush=True)
    d = [x["total_token_throughput"] for x in runs["defaults"]]
    c = [x["total_token_throughput"] for x in runs["candidate"]]
    md = statistics.mean(d)
    if min(len(d), len(c)) < 2:
        # One round (a probe): a point estimate, no spread and no interval.
        change, ci = 100 * (statistics.mean(c) - md) / md, None
        print(f"\nchange: {change:+.1f}% (one round: no interval)")
    else:
        diff, lo, hi = welch(c, d)
        change, ci = 100 * diff / md, [100 * lo / md, 100 * hi / md]
        print()
        print("| arm | runs | total tok/s mean | sd |")
        print("|---|---|---|---|")
        print(f"| defaults | {len(d)} | {md:.2f} | {statistics.stdev(d):.2f} |")
        print(f"| candidate | {len(c)} | {statistics.mean(c):.2f} | {statistics.stdev(c):.2f} |")
        print(f"\nchange: {change:+.1f}% (95% CI {ci[0]:+.1f}% to {ci[1]:+.1f}%)")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"runs": runs, "change_pct": change, "ci_pct": ci}, f, indent=1)


if __name__ == "__main__":
    sys.exit(main())
