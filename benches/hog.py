#!/usr/bin/env python3
"""A study with a CPU hog started during one of its trials, then the verdict checked by an
independent re-measurement (`benches/remeasure.py`: interleaved rounds, fresh engines).

    benches/hog.py STUDY.toml --runs 5 --seed 1 [--remeasure-rounds 5] [--out results.jsonl]
    benches/hog.py STUDY.toml --no-hog --study-seeds 0,1,2 --need-gain 40 [--out …]

For each run: a fresh state directory; the study (`servetune tune`) in the background; one
trial index drawn at random among the search trials (trial 0, the defaults, included); when
that trial's directory appears, as many busy processes as there are cores start and run until
the next trial's directory appears; then the verdict. When the study recommends a command,
the defaults and that command are re-measured on the primary workload, and the run passes
when the re-measured change is not a loss beyond the study's tolerance. "Keep the defaults"
passes by construction (it recommends nothing slower than the defaults). One JSON line per run.

With `--no-hog` the same pipeline checks a study's verdicts on a quiet machine: with
`--study-seeds`, one run per optimiser seed (the study file's `seed` replaced), and with
`--need-gain PCT` a run passes only when the study recommends a command whose re-measured gain
over the defaults is at least PCT percent.
"""

import argparse
import json
import multiprocessing
import os
import random
import re
import shlex
import subprocess
import sys
import tempfile
import time
import tomllib

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BIN = os.path.join(ROOT, "target/release/servetune")


def hog():
    while True:
        pass


def paths():
    out = subprocess.run([BIN, "setup", "llamacpp", "--print-paths"], check=True,
                         capture_output=True, text=True).stdout
    return dict(line.split("=", 1) for line in out.split() if "=" in line)


def resolve(args, p):
    return [p["SHAREGPT_JSON"] if a == "@sharegpt" else a for a in args]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("study")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--remeasure-rounds", type=int, default=5)
    ap.add_argument("--out", default=None)
    ap.add_argument("--no-hog", action="store_true", help="no hog: check the verdicts as they are")
    ap.add_argument("--study-seeds", default=None, help="comma-separated optimiser seeds, one run each")
    ap.add_argument("--need-gain", type=float, default=None,
                    help="pass only when the re-measured gain is at least this many percent")
    a = ap.parse_args()
    rng = random.Random(a.seed)
    with open(a.study, "rb") as f:
        spec = tomllib.load(f)
    name = spec["study"]["name"]
    budget = spec.get("budget", {}).get("trials", 30)
    tol = spec.get("validation", {}).get("tolerance", 0.05)
    primary = next((w for w in spec["workload"] if w.get("primary")), spec["workload"][0])
    p = paths()
    seeds = [int(x) for x in a.study_seeds.split(",")] if a.study_seeds else None
    with open(a.study) as f:
        study_text = f.read()
    for run in range(len(seeds) if seeds else a.runs):
        state = tempfile.mkdtemp(prefix=f"hog-{run}-")
        k = rng.randrange(0, budget)
        if a.no_hog:
            k = -10
        study_file = a.study
        if seeds:
            # The same study with another optimiser seed, in the run's state directory, with the
            # search spaces named by absolute path (write dataset paths as @aliases or absolute).
            text, n = re.subn(r"(?m)^seed\s*=\s*\d+", f"seed = {seeds[run]}", study_text, count=1)
            if n != 1:
                sys.exit(f"{a.study}: no `seed = N` line to replace")
            study_file = os.path.join(state, os.path.basename(a.study))
            if "space_dir" not in text:
                text = text.replace("[study]\n", f'[study]\nspace_dir = "{ROOT}/search-spaces"\n', 1)
            with open(study_file, "w") as f:
                f.write(text)
        t0 = time.time()
        study = subprocess.Popen([BIN, "tune", study_file, "--state", state],
                                 stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        trials = os.path.join(state, "trials", name)
        hogs, hog_span = [], None
        log = []
        os.set_blocking(study.stdout.fileno(), False)
        while study.poll() is None:
            try:
                chunk = study.stdout.read()
                if chunk:
                    log.append(chunk)
            except (BlockingIOError, TypeError):
                pass
            started = k >= 0 and os.path.isdir(os.path.join(trials, f"trial-{k:04d}"))
            ended = os.path.isdir(os.path.join(trials, f"trial-{k + 1:04d}"))
            if started and not ended and not hogs and hog_span is None:
                hogs = [multiprocessing.Process(target=hog, daemon=True)
                        for _ in range(os.cpu_count() or 2)]
                for h in hogs:
                    h.start()
                hog_span = [time.time() - t0, None]
            if hogs and ended:
                for h in hogs:
                    h.terminate()
                hogs = []
                hog_span[1] = time.time() - t0
            time.sleep(0.2)
        for h in hogs:
            h.terminate()
        rest = study.stdout.read()
        if rest:
            log.append(rest)
        text = "".join(log)
        rec = json.loads(subprocess.run([BIN, "trials", name, "--state", state, "--json"],
                                        capture_output=True, text=True).stdout or "[]")
        report = subprocess.run([BIN, "report", name, "--state", state, "--format", "json"],
                                capture_output=True, text=True).stdout
        out = json.loads(report)["study"]["outcome"] if report else None
        verdict = out["verdict"] if out else text.strip().splitlines()[-1:]
        result = {"run": run, "hog_trial": None if a.no_hog else k, "hog_span_s": hog_span,
                  "study_seed": seeds[run] if seeds else None, "verdict": verdict,
                  "recommended": out and out["recommended"], "study_s": time.time() - t0}
        if out and out.get("recommended") is not None:
            base = next(t for t in rec if t["seq"] == out["baseline_trial"])
            cand_cmd = out["recommended_command"]
            r = subprocess.run([sys.executable, os.path.join(ROOT, "benches/remeasure.py"),
                                "--rounds", str(a.remeasure_rounds),
                                "--defaults", base["command"], "--candidate", cand_cmd,
                                "--json", os.path.join(state, "remeasure.json"), "--"]
                               + resolve(primary["args"], p), capture_output=True, text=True)
            try:
                with open(os.path.join(state, "remeasure.json")) as f:
                    rm = json.load(f)
                result["remeasured_change_pct"] = rm["change_pct"]
                result["remeasured_ci_pct"] = rm["ci_pct"]
                result["pass"] = rm["change_pct"] >= (
                    a.need_gain if a.need_gain is not None else -100 * tol)
            except (OSError, ValueError):
                result["remeasure_error"] = r.stderr[-500:]
                result["pass"] = None
        else:
            # Keeping the defaults never recommends a loss; it misses a gain that is needed.
            result["pass"] = a.need_gain is None
        print(json.dumps(result), flush=True)
        if a.out:
            with open(a.out, "a") as f:
                f.write(json.dumps(result) + "\n")


if __name__ == "__main__":
    sys.exit(main())
