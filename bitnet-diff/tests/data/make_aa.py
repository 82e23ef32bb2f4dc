#!/usr/bin/env python3
"""Makes the A/A fixtures aa-a1.json and aa-a2.json from one bitnet-bench report.

The source report was measured on the project's machine kind with

    bitnet-bench --model bitnet-b1.58-large --batch-sizes 1 4 --context-lengths 32 \
        --kv-precisions f16 int8 --max-new-tokens 32 --warmup 1 --repeat 20 \
        --quality-positions 0 --json-report aa-source.json

Its runs alternate between the two fixtures (odd runs to a1, even runs to a2), as the CI
workflow interleaves base and head runs: two reports of the same build on the same machine,
measured over the same minutes, so the machine's drift is shared. Statistics and the roofline
fraction are recomputed from the samples exactly as bitnet-bench computes them (bitnet-report
recomputes them again when it reads the files).

Usage: make_aa.py aa-source.json OUTDIR
"""
import json
import math
import sys

T975 = [12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160,
        2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056,
        2.052, 2.048, 2.045, 2.042]


def percentile(s, p):
    s = sorted(s)
    rank = p / 100 * (len(s) - 1)
    lo, hi = math.floor(rank), math.ceil(rank)
    return s[lo] + (s[hi] - s[lo]) * (rank - lo)


def stat(samples):
    n = len(samples)
    mean = sum(samples) / n
    sd = math.sqrt(sum((x - mean) ** 2 for x in samples) / (n - 1)) if n > 1 else 0.0
    half = T975[n - 2] * sd / math.sqrt(n) if n > 1 else 0.0
    return {"n": n, "mean": mean, "median": percentile(samples, 50), "stddev": sd,
            "min": min(samples), "max": max(samples), "ci95_low": mean - half,
            "ci95_high": mean + half, "samples": samples}


def main():
    src = json.load(open(sys.argv[1]))
    steps = src["settings"]["max_new_tokens"]
    for k, name in [(0, "aa-a1.json"), (1, "aa-a2.json")]:
        r = json.loads(json.dumps(src))
        r["settings"]["repeat"] = src["settings"]["repeat"] // 2
        for x in r["results"]:
            for path in [("prefill", "tokens_per_sec"), ("prefill", "ttft_ms"), ("decode", "tokens_per_sec")]:
                s = x[path[0]][path[1]]["samples"][k::2]
                x[path[0]][path[1]] = stat(s)
            lat = x["decode"]["latency_ms"]["samples"]
            runs = [lat[i * steps:(i + 1) * steps] for i in range(len(lat) // steps)]
            mine = [v for run in runs[k::2] for v in run]
            x["decode"]["latency_ms"] = {"p50": percentile(mine, 50), "p90": percentile(mine, 90),
                                         "p95": percentile(mine, 95), "p99": percentile(mine, 99),
                                         "samples": mine}
            # The roofline fraction follows this half's median (without step probes).
            bw = r["roofline"]["by_threads"].get(str(x["config"]["threads"]), 0)
            if not x["decode"].get("step_fractions") and bw > 0:
                x["decode"]["roofline_fraction"] = (x["decode"]["bytes_per_step"] * x["decode"]["tokens_per_sec"]["median"]
                                                    / x["config"]["batch"] / (bw * 1e9))
        json.dump(r, open(f"{sys.argv[2]}/{name}", "w"), indent=2)
        open(f"{sys.argv[2]}/{name}", "a").write("\n")


main()
