#!/usr/bin/env python3
"""docs/benchmarks.md and its charts from the benchmark results (issue 9). Standard library only;
the charts are drawn by gnuplot (pngcairo, or png where cairo is missing).

  python3 bench/report.py [GPU_RESULTS.json ...] [--cpu CPU.json] [--out docs/benchmarks.md]
                         [--moe MOE.jsonl MOE-BASELINES.jsonl MOE-HOST.jsonl]
  python3 bench/report.py --summary GPU_RESULTS.json ...     (a text table, nothing written)

GPU_RESULTS are bench/compare.sh's results.json (several calls' merge: for each run, a result
beats a skip, and a later file beats an earlier one); default docs/bench/gpu.json when it
exists. CPU.json is bench/cpu.sh's output; default docs/bench/cpu.json when it exists. Machine,
date and commit come from the files' meta objects unless --machine, --date or --commit say.
Charts go to the folder of --out, under bench/.
"""
import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys

SHAPES = ["qwen3-0.6b", "qwen3-8b", "qwen3-32b"]
# parameters of each shape (bench/bench_model.c), when no result says it
PARAMS = {"qwen3-0.6b": 596049920, "qwen3-8b": 8190735360, "qwen3-32b": 32762123264}
SCENARIOS = [
    ("fanout", "Fan-out: 1 trainer GPU to 3 TP-1 replicas",
     "the trainer's GPU holds the whole model; each replica on its own GPU needs all of it"),
    ("colocated", "Colocated: FSDP-4 to TP-4 on the same 4 GPUs",
     "each GPU holds a trainer's FSDP shard and an inference TP rank"),
    ("disaggregated", "Disaggregated: FSDP-2 (GPUs 0, 1) to TP-2 (GPUs 2, 3)",
     "trainers and inference on different GPUs of one host"),
    ("colocated-fp8", "Colocated, FP8-block targets: FSDP-4 to TP-4",
     "as colocated, the receivers quantizing the linear weights to e4m3 with 128x128 block "
     "scales; the peers' scripts have no FP8 path"),
]
# name, legend, gnuplot style (one look per method on every chart)
METHODS = [
    ("wsync-auto", "wsync auto", 'lc rgb "#1b3a8c" lw 3 pt 7 ps 1.4'),
    ("wsync-ipc", "wsync ipc", 'lc rgb "#3d8fd1" lw 2 pt 5'),
    ("wsync-nccl", "wsync nccl", 'lc rgb "#2a9d3a" lw 2 pt 9 ps 1.3'),
    ("a", "(a) per-tensor NCCL + vLLM load", 'lc rgb "#e07b00" lw 2 pt 11 ps 1.3'),
    ("b", "(b) IPC buckets (verl)", 'lc rgb "#c0392b" lw 2 pt 13 ps 1.3'),
    ("c", "(c) raw ncclBroadcast of the model", 'lc rgb "#7f7f7f" lw 2 pt 3'),
]
FLOOR_STYLE = 'lc rgb "black" lw 2 dt 2'
# drawing order: wsync auto last, on top, since a forced run of the scheme auto chose has the
# same points
DRAW_ORDER = METHODS[1:] + METHODS[:1]
RANK = {"ok": 5, "derived": 4, "refused": 3, "failed": 3, "timeout": 3, "n/a": 2, "skipped": 1}


def fail(msg):
    sys.exit("report.py: " + msg)


# ---------------------------------------------------------------------------- loading

def load(paths):
    """(metas, rows): every file's meta object, and one row per run (see the merge rule above)."""
    metas, rows = [], {}
    for p in paths:
        try:
            data = json.load(open(p))
        except (OSError, ValueError) as e:
            fail("%s: %s" % (p, e))
        if not isinstance(data, list):
            fail("%s: expected a JSON array (compare.sh's results.json)" % p)
        for r in data:
            if r.get("kind") == "meta":
                metas.append(r)
                continue
            key = (r.get("kind"), r.get("group") == "refusal", r.get("scenario"),
                   r.get("model_shape"), r.get("replicas"), r.get("method"), r.get("buffer"))
            old = rows.get(key)
            if old is None or RANK.get(r.get("status"), 0) >= RANK.get(old.get("status"), 0):
                rows[key] = r
    return metas, list(rows.values())


def good(r):
    return r is not None and r.get("status") in ("ok", "derived") and r.get("result")


def default_replicas(scenario):
    return 3 if scenario == "fanout" else 1


def find(rows, scenario, shape, method, replicas=None):
    replicas = default_replicas(scenario) if replicas is None else replicas
    for r in rows:
        if (r.get("scenario") == scenario and r.get("model_shape") == shape and
                r.get("method") == method and r.get("replicas") == replicas and
                r.get("group") != "refusal"):
            return r
    return None


def params_of(rows, shape):
    for r in rows:
        if r.get("model_shape") == shape and good(r):
            j = r["result"]
            if j.get("param_elems"):
                return j["param_elems"]
            if r.get("kind") == "baseline" and j.get("bytes"):
                return j["bytes"] // 2
    return PARAMS.get(shape)


def floor_of(rows, scenario, shape, replicas=None):
    """The plan's floor (wsync-bench's floor_seconds): the same for every scheme of a run."""
    v = [find(rows, scenario, shape, m, replicas) for m in ("wsync-auto", "wsync-nccl", "wsync-ipc")]
    v = [r["result"]["floor_seconds"] for r in v if good(r) and r["result"].get("floor_seconds")]
    return min(v) if v else None


# ---------------------------------------------------------------------------- text

def ms(s):
    return "%.3g ms" % (s * 1e3)


def cell(r, floor, mark_derived=True):
    if r is None:
        return "–"
    st = r.get("status")
    if not good(r):
        return {"n/a": "n/a", "skipped": "skipped (time)"}.get(st, st or "?")
    s = r["result"]["seconds"]
    text = ms(s) + (" (%.2f×)" % (s / floor) if floor else "")
    if st == "derived" and mark_derived:
        text += " *"
    return text


def summary(metas, rows):
    out = []
    for m in metas:
        out.append("%s; commit %s; %s; %s of %s s" % (m.get("machine"), m.get("commit"), m.get("date"),
                                                        m.get("elapsed_s"), m.get("budget_s")))
    out.append("%-13s %-14s %-10s %2s %-11s %-8s %10s %7s  %s" % (
        "group", "scenario", "shape", "R", "method", "status", "time", "x floor", "note"))
    for r in rows:
        j = r.get("result") if good(r) else None
        fl = floor_of(rows, r.get("scenario"), r.get("model_shape"), r.get("replicas"))
        t = ms(j["seconds"]) if j else ""
        x = "%.2f" % (j["seconds"] / fl) if j and fl else ""
        if j and j.get("correct") is False:
            x += " WRONG"
        what = r.get("model_shape") or r.get("buffer") or "-"
        out.append("%-13s %-14s %-10s %2s %-11s %-8s %10s %7s  %s" % (
            r.get("group"), r.get("scenario"), what, r.get("replicas"), r.get("method"),
            r.get("status"), t, x, (r.get("note") or "")[:90]))
    counts = {}
    for r in rows:
        counts[r.get("status")] = counts.get(r.get("status"), 0) + 1
    out.append("runs: " + ", ".join("%d %s" % (n, s) for s, n in sorted(counts.items())))
    late = sorted({r.get("group") for r in rows if r.get("status") == "skipped"})
    if late:
        done = sorted({r.get("group") for r in rows} - set(late))
        out.append("groups with runs skipped for time: %s; to run them in another call: "
                   "WSYNC_COMPARE_SKIP=\"%s\" bash bench/compare.sh gpu-carry"
                   % (" ".join(late), " ".join(done)))
    return "\n".join(out)


# ---------------------------------------------------------------------------- charts

def gnuplot_terminal():
    """pngcairo where gnuplot has it, else png (libgd)."""
    try:
        terms = subprocess.run(["gnuplot", "-e", "set terminal"], capture_output=True,
                               text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    text = terms.stdout + terms.stderr
    if "pngcairo" in text:
        return 'pngcairo size 1100,600 noenhanced font "DejaVu Sans,11"'
    return "png size 1100,600 noenhanced"


def datablock(name, points):
    return "$%s << EOD\n%s\nEOD\n" % (name, "\n".join("%.6g %.6g" % p for p in points))


def draw(path, terminal, title, xlabel, series, log, xtics):
    """series: [(legend, style, [(x, y)], is_line_only)]; writes the PNG at path with gnuplot."""
    gp = ["set terminal " + terminal, 'set output "%s"' % path, 'set title "%s"' % title,
          'set xlabel "%s"' % xlabel, 'set ylabel "seconds per version (median)"',
          "set grid xtics ytics mytics", "set key outside right top vertical Left reverse",
          "set xtics (%s)" % ", ".join('"%s" %.6g' % t for t in xtics)]
    xs = [x for _, _, pts, _ in series for x, _ in pts]
    if log:
        gp += ["set logscale xy", 'set format y "%g"',
               "set xrange [%.6g:%.6g]" % (min(xs) / 1.5, max(xs) * 1.5)]
    else:
        gp += ["set yrange [0:*]", "set xrange [%.6g:%.6g]" % (min(xs) - 0.3, max(xs) + 0.3)]
    plots = []
    for i, (legend, style, pts, line_only) in enumerate(series):
        gp.append(datablock("s%d" % i, pts))
        plots.append("$s%d with %s %s title \"%s\"" % (i, "lines" if line_only else "linespoints",
                                                        style, legend))
    gp.append("plot " + ", \\\n     ".join(plots))
    res = subprocess.run(["gnuplot"], input="\n".join(gp) + "\n", capture_output=True, text=True)
    if res.returncode != 0:
        fail("gnuplot failed on %s: %s" % (path, res.stderr.strip()))


def legend_auto(rows, scenario, replicas=None):
    chose = sorted({find(rows, scenario, s, "wsync-auto", replicas)["result"]["scheme"]
                    for s in SHAPES if good(find(rows, scenario, s, "wsync-auto", replicas))})
    return "wsync auto" + (" (chose %s)" % "/".join(chose) if chose else "")


def scenario_chart(rows, scenario, title, path, terminal, machine):
    series = []
    for m, legend, style in DRAW_ORDER:
        pts = [(params_of(rows, s) / 1e9, find(rows, scenario, s, m)["result"]["seconds"])
               for s in SHAPES if good(find(rows, scenario, s, m))]
        if pts:
            series.append((legend_auto(rows, scenario) if m == "wsync-auto" else legend, style, pts, False))
    if scenario == "colocated-fp8":   # what the same run costs with bf16 targets
        pts = [(params_of(rows, s) / 1e9, find(rows, "colocated", s, "wsync-auto")["result"]["seconds"])
               for s in SHAPES if good(find(rows, "colocated", s, "wsync-auto"))]
        if pts:
            series.append(("wsync auto, bf16 targets", 'lc rgb "#1b3a8c" lw 1 dt 3 pt 6', pts, False))
    pts = [(params_of(rows, s) / 1e9, floor_of(rows, scenario, s)) for s in SHAPES
           if floor_of(rows, scenario, s)]
    if pts:
        series.append(("floor (plan bytes at measured link speeds)", FLOOR_STYLE, pts, True))
    if not series:
        return False
    xtics = [("%s" % s.split("-")[1].upper(), params_of(rows, s) / 1e9) for s in SHAPES]
    draw(path, terminal, "%s (%s)" % (title, machine), "model size (billions of parameters, Qwen3 shapes)",
         series, True, xtics)
    return True


def sweep_chart(rows, path, terminal, machine):
    series = []
    for m, legend, style in DRAW_ORDER:
        if m == "b":
            continue
        pts = [(n, find(rows, "fanout", "qwen3-8b", m, n)["result"]["seconds"]) for n in (1, 2, 3)
               if good(find(rows, "fanout", "qwen3-8b", m, n))]
        if pts:
            series.append((legend_auto(rows, "fanout") if m == "wsync-auto" else legend, style, pts, False))
    pts = [(n, floor_of(rows, "fanout", "qwen3-8b", n)) for n in (1, 2, 3)
           if floor_of(rows, "fanout", "qwen3-8b", n)]
    if pts:
        series.append(("floor", FLOOR_STYLE, pts, True))
    if not series:
        return False
    draw(path, terminal, "Fan-out scaling: 1 trainer GPU, Qwen3-8B shape (%s)" % machine,
         "receivers (TP-1 replicas, one GPU each)", series, False, [(str(n), n) for n in (1, 2, 3)])
    return True


# ---------------------------------------------------------------------------- markdown

def meta_line(metas, args):
    machine = args.machine or "; ".join(sorted({m.get("machine", "?") for m in metas}))
    date = args.date or ", ".join(sorted({m.get("date", "?") for m in metas}))
    commit = args.commit or ", ".join(sorted({m.get("commit", "?") for m in metas}))
    return machine, date, commit


def links(rows):
    v = [r["result"] for r in rows if r.get("kind") == "wsync" and good(r) and r["result"].get("peer_gbps")]
    if not v:
        return ""
    med = lambda k: statistics.median(j[k] for j in v)  # noqa: E731
    return ("Links, measured by wsync-bench before each run (median over runs): peer copy %.0f GB/s, "
            "device-to-device copy %.0f GB/s, one 4 GiB ncclBroadcast over the run's GPUs %.0f GB/s."
            % (med("peer_gbps"), med("d2d_gbps"), med("bcast_gbps")))


def shape_label(rows, s):
    n = params_of(rows, s)
    return "%s (%.2f B, %.1f GB)" % (s, n / 1e9, 2 * n / 1e9) if n else s


def ratio_cell(rows, scenario, shape):
    """how many times longer the best peer method (a or b) takes than the best wsync run"""
    w = [find(rows, scenario, shape, m) for m in ("wsync-auto", "wsync-ipc", "wsync-nccl")]
    p = [find(rows, scenario, shape, m) for m in ("a", "b")]
    w = [r["result"]["seconds"] for r in w if good(r)]
    p = [r["result"]["seconds"] for r in p if good(r)]
    return "%.1f×" % (min(p) / min(w)) if w and p else "–"


def gpu_section(metas, rows, args, plot_dir, rel_dir):
    machine, date, commit = meta_line(metas, args)
    m0 = metas[0] if metas else {}
    calls = m0.get("calls") or []
    how = ("in %d calls on one warm machine (%s; %s of %s s)" % (
        len(calls), "; ".join(calls), m0.get("elapsed_s", "?"), m0.get("budget_s", "?"))
        if len(calls) > 1 else
        "in one call (%s of %s s)" % (m0.get("elapsed_s", "?"), m0.get("budget_s", "?")))
    out = ["## GPU: wsync against the peers' methods", "",
           "Machine: %s. Date: %s. Commit: %s. `bench/compare.sh` %s; wsync: "
           "median of %s versions after %s warm-up, every byte checked on every receiver; peers: "
           "median of %s versions, a few tensors checked. `NCCL_NVLS_ENABLE=0`."
           % (machine, date, commit, how,
              m0.get("iters", "?"), m0.get("warmup", "?"), m0.get("baseline_iters", "?")), ""]
    if links(rows):
        out += [links(rows), ""]
    out += ["Each cell: median time per version, then (× the floor): the plan's bytes over the "
            "busiest GPU's links at the speeds measured in the same run (1 is the best possible). "
            "\"peers ÷ wsync\" is the best of (a) and (b) over the best wsync run. (c) is one raw "
            "broadcast of the whole model's bytes, a ceiling for moving them, not a weight sync. "
            "\\* = the `--scheme auto` run, which chose this scheme. n/a: not possible there "
            "(NCCL allows one rank per GPU, so the nccl scheme refuses colocated groups; (b) is "
            "colocated only; the peers have no FP8 path). skipped (time): left out by the time "
            "budget of one call.", ""]
    term = gnuplot_terminal() if not args.no_plots else None
    if not args.no_plots and term is None:
        fail("gnuplot not found: install it (apt-get install gnuplot-nox) or pass --no-plots")
    short = machine.split(",")[0]   # "4x NVIDIA H200": chart titles stay short
    for sc, title, what in SCENARIOS:
        out += ["### " + title, "", what[0].upper() + what[1:] + ".", ""]
        png = "%s.png" % sc
        if term and scenario_chart(rows, sc, title, os.path.join(plot_dir, png), term, short):
            out += ["![%s](%s/%s)" % (title, rel_dir, png), ""]
        out += ["| model | floor | wsync auto | wsync ipc | wsync nccl | (a) | (b) | (c) | peers ÷ wsync |",
                "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
        for s in SHAPES:
            fl = floor_of(rows, sc, s)
            cells = []
            for m, _, _ in METHODS:
                r = find(rows, sc, s, m)
                if r is None and (sc == "colocated-fp8" and m in ("a", "b", "c") or m == "b" and sc != "colocated"
                                  or m == "wsync-nccl" and sc.startswith("colocated")):
                    cells.append("n/a")
                else:
                    cells.append(cell(r, fl))
            auto = find(rows, sc, s, "wsync-auto")
            if good(auto):
                cells[0] += " [%s]" % auto["result"]["scheme"]
            out.append("| %s | %s | %s | %s |" % (shape_label(rows, s), ms(fl) if fl else "–",
                                                  " | ".join(cells), ratio_cell(rows, sc, s)))
        out.append("")
    out += ["### Fan-out scaling: 1, 2, 3 receivers (Qwen3-8B shape)", ""]
    if term and sweep_chart(rows, os.path.join(plot_dir, "fanout-sweep.png"), term, short):
        out += ["![fan-out scaling](%s/fanout-sweep.png)" % rel_dir, ""]
    out += ["| receivers | floor | wsync auto | wsync ipc | wsync nccl | (a) | (c) |",
            "| --- | --- | --- | --- | --- | --- | --- |"]
    carried = []
    for n in (1, 2, 3):
        fl = floor_of(rows, "fanout", "qwen3-8b", n)
        cells = []
        for m in ("wsync-auto", "wsync-ipc", "wsync-nccl", "a", "c"):
            r = find(rows, "fanout", "qwen3-8b", m, n)
            cells.append(cell(r, fl) + (" †" if r and r.get("carried_from") else ""))
            if r and r.get("carried_from"):
                carried.append(r["carried_from"])
        out.append("| %d | %s | %s |" % (n, ms(fl) if fl else "–", " | ".join(cells)))
    out.append("")
    if carried:
        c = carried[0]
        out += ["† from an earlier run of the same scripts on the same kind of machine (%s, commit "
                "%s), not rerun with the rest: %s." % (c.get("date", "?"), c.get("commit", "?"),
                                                        c.get("why", "")), ""]
    ceiling = [r for r in rows if r.get("kind") == "baseline" and r.get("buffer") and good(r)]
    for r in ceiling:
        j = r["result"]
        out += ["Raw ncclBroadcast of a %s buffer from GPU 0 to %d GPUs (the (c) script): %s, %.0f GB/s."
                % (r["buffer"], j.get("receivers", 3), ms(j["seconds"]), j["bytes"] / j["seconds"] / 1e9), ""]
    refusal = [r for r in rows if r.get("group") == "refusal"]
    for r in refusal:
        out += ["The nccl scheme on a colocated group (`--scheme nccl --colocated`, tiny shape), "
                "as run: %s: `%s`" % (r.get("status"), (r.get("note") or "no message").strip()), ""]
    missing = [r for r in rows if r.get("status") in ("skipped", "failed", "timeout")
               and r.get("group") != "refusal"]
    if missing:
        out += ["Runs without a result: " + "; ".join(
            "%s %s %s R=%s: %s%s" % (r.get("method"), r.get("scenario"), r.get("model_shape") or r.get("buffer"),
                                     r.get("replicas"), r.get("status"),
                                     " (%s)" % r["note"][:120] if r.get("note") else "")
            for r in missing) + ".", ""]
    return out


CPU_RUNS = [
    ("ipc-shared", "ipc, host memory, 1 → 2 receivers, 1 GiB; sender's weights shared (read in place)",
     "memcpy, 1 core"),
    ("ipc-private", "ipc, host memory, 1 → 2 receivers, 1 GiB; sender's weights private (staged)",
     "memcpy, 1 core"),
    ("ipc-model", "ipc, host memory, qwen3-0.6b shape, FSDP-2 → TP-2 (fused QKV, gate_up, vocab-parallel)",
     "floor: largest receiver's bytes at 1-core memcpy"),
    ("store-ucx", "store over UCX, 1 GiB, 2 readers (fetch)", "raw UCX gets, same run"),
    ("store-ofi", "store over libfabric, 1 GiB, 2 readers (fetch)", "raw libfabric gets, same run"),
]


def cpu_ratio(j):
    """(wsync GB/s per receiver, baseline GB/s, wsync / baseline) of one run's JSON."""
    if j.get("mode") == "model":   # its baseline is the floor: time / floor inverted
        return j["gbps_per_receiver"], j["memcpy_gbps"], 1.0 / j["ratio_floor"]
    return j["gbps_per_receiver"], j["baseline_gbps"], j["ratio"]


def cpu_section(path, args):
    out = ["## CPU: runnable anywhere, no GPU", ""]
    if not path:
        return out + ["No CPU results yet: run `bash bench/cpu.sh build` (writes docs/bench/cpu.json), "
                      "then `python3 bench/report.py`.", ""]
    data = json.load(open(path))
    meta = next((r for r in data if r.get("kind") == "meta"), {})
    runs = [r for r in data if r.get("kind") == "cpu"]
    out += ["Machine: %s. Date: %s. Commit: %s. Load average %s before, %s after: the cores are shared, "
            "so absolute speeds mean little; each ratio sets wsync against a baseline timed in the "
            "same run. %s runs of each; median ratio (min–max). `bash bench/cpu.sh build`."
            % (meta.get("machine", "?"), meta.get("date", "?"), meta.get("commit", "?"),
               meta.get("load_before", "?"), meta.get("load_after", "?"), meta.get("reps", "?")), "",
            "| run | baseline | wsync GB/s per receiver | baseline GB/s | wsync ÷ baseline |",
            "| --- | --- | --- | --- | --- |"]
    for name, what, base in CPU_RUNS:
        js = [r["result"] for r in runs if r["run"] == name and r.get("rc") == 0 and r.get("result")]
        bad = [r for r in runs if r["run"] == name and (r.get("rc") != 0 or not r.get("result"))]
        if not js:
            out.append("| %s | %s | failed (%d runs) | | |" % (what, base, len(bad)))
            continue
        v = [cpu_ratio(j) for j in js]
        rat = [x[2] for x in v]
        out.append("| %s | %s | %.2f | %.2f | %.2f (%.2f–%.2f)%s |" % (
            what, base, statistics.median(x[0] for x in v), statistics.median(x[1] for x in v),
            statistics.median(rat), min(rat), max(rat), " ; %d failed" % len(bad) if bad else ""))
    agg = []
    for name, label in (("store-ucx", "UCX"), ("store-ofi", "libfabric")):
        v = [r["result"]["ratio_aggregate"] for r in runs if r["run"] == name and r.get("rc") == 0
             and r.get("result") and "ratio_aggregate" in r["result"]]
        if v:
            agg.append("%s %.2f" % (label, statistics.median(v)))
    if agg:
        out += ["", "The store runs also time whole rounds, until both readers are done, which does "
                "not depend on how evenly the owner serves them: median aggregate ratio " +
                ", ".join(agg) + "."]
    return out + [""]


# The MoE rows of tests/gpu/run.sh (its moe.jsonl names): scenario words, wsync-bench arguments
MOE_ROWS = [
    # "{two}" is filled with the 2-GPU stand-in's layout when the run had fewer than 4 GPUs
    ("coloc-ep", "colocated FSDP-4 → EP-4{two:FSDP-2 → EP-2}, bf16",
     "--scheme ipc --senders 4 --ep 4 --colocated"),
    ("coloc-tp", "colocated FSDP-4 → TP-4{two:FSDP-2 → TP-2}, bf16",
     "--scheme ipc --senders 4 --tp 4 --colocated"),
    ("coloc-ep-fp8", "colocated FSDP-4 → EP-4{two:FSDP-2 → EP-2}, fp8-block",
     "--scheme ipc --senders 4 --ep 4 --colocated --quant fp8-block"),
    ("disagg-ep", "disaggregated FSDP-2 (GPUs 0, 1) → EP-2 (GPUs 2, 3), bf16",
     "--scheme nccl --senders 2 --ep 2"),
    ("coloc-ep-fused", "colocated, senders holding fused experts (whole experts each) → EP-4, bf16 "
     "(`WSYNC_MOE_FUSED=1`)", "--scheme ipc --senders 4 --ep 4 --colocated --fused-experts"),
]


def moe_words(words, ngpu):
    """a MOE_ROWS label as run: the 2-GPU stand-in named only when the run had fewer than 4"""
    a = words.find("{two:")
    if a < 0:
        return words
    b = words.index("}", a)
    return words[:a] + (" (2 GPUs: %s)" % words[a + 5:b] if 0 < ngpu < 4 else "") + words[b + 1:]


def jsonl(path):
    if not path or not os.path.exists(path):
        return []
    return [json.loads(l) for l in open(path) if l.strip()]


def moe_label(j):
    """a chart's tic for one MoE run, as run (on 2 GPUs: FSDP-2 → EP-2), on two lines"""
    layout = "FSDP-%d → %s-%d" % (j["senders"], "EP" if j.get("ep", 1) > 1 else "TP", j["tp"])
    if j.get("sender_experts") == "fused":
        return "%s\\nfused-expert senders" % layout
    return "%s\\n%s" % (layout, "fp8-block" if j["quant"] != "none" else "bf16")


def secs(s):
    return "%.2f s" % s if s >= 1 else ms(s)


def moe_chart(runs, path, terminal, title):
    """runs: [(tic, wsync s, floor s, all-gather s or None)]; per run three bars on a log time axis
    (the all-gather baseline is ~100x wsync's time, the floor within a few tens of percent of it),
    each labelled with its time and its ratio, so both gaps read at once."""
    gp = ["set terminal " + terminal, 'set output "%s"' % path, "set encoding utf8",
          'set title "%s"' % title, 'set ylabel "seconds per version (median, log scale)"',
          "set logscale y", 'set format y "%g"', "set grid ytics mytics",
          "set key outside top center horizontal maxcols 3 Left reverse samplen 2", "set bmargin 4",
          "set style fill solid 0.85 border -1",
          "set xrange [-0.6:%.1f]" % (len(runs) - 0.4),
          "set xtics (%s)" % ", ".join('"%s" %d' % (r[0], i) for i, r in enumerate(runs))]
    ys = [y for r in runs for y in r[1:] if y]
    lo, hi = min(ys) / 5, max(ys) * 4
    gp.append("set yrange [%.6g:%.6g]" % (lo, hi))
    w = 0.25
    # bars: floor left, wsync middle, all-gather right: x y xlow xhigh ylow yhigh. Labels above
    # wsync's and all-gather's bars; the floor's, being as tall as wsync's, written up inside it
    bars = {"floor": [], "wsync": [], "gather": []}
    for i, (_, t, fl, g) in enumerate(runs):
        bars["floor"].append((i - w, fl, None))
        gp.append('set label "%s" at %.6g,%.6g left rotate by 90 offset 0.5,0.6 front '
                  'font ",10" tc rgb "white"' % (secs(fl), i - w, lo))
        bars["wsync"].append((i, t, "%s\\n%.2f× floor" % (secs(t), t / fl)))
        if g:
            bars["gather"].append((i + w, g, "%s\\n%.1f× wsync" % (secs(g), g / t)))
        else:
            gp.append('set label "the peers have no FP8 path" at %.6g,%.6g left rotate by 90 '
                      'offset 0.5,0.6 front font ",10"' % (i + w, lo))
    looks = [("floor", "floor (plan bytes, measured links)", 'lc rgb "#9a9a9a"'),
             ("wsync", "wsync (ipc)", 'lc rgb "#1b3a8c"'),
             ("gather", "all-gather (the peers' method)", 'lc rgb "#e07b00"')]
    plots = []
    for k, legend, style in looks:
        pts = bars[k]
        for x, y, text in pts:
            if text:
                gp.append('set label "%s" at %.6g,%.6g center offset 0,1.6 front font ",10"'
                          % (text, x, y))
        if pts:
            gp.append("$%s << EOD\n%s\nEOD" % (k, "\n".join(
                "%.6g %.6g %.6g %.6g %.6g %.6g" % (x, y, x - w / 2, x + w / 2, lo, y) for x, y, _ in pts)))
            plots.append("$%s with boxxyerror %s title \"%s\"" % (k, style, legend))
    gp.append("plot " + ", \\\n     ".join(plots))
    res = subprocess.run(["gnuplot"], input="\n".join(gp) + "\n", capture_output=True, text=True)
    if res.returncode != 0:
        fail("gnuplot failed on %s: %s" % (path, res.stderr.strip()))


def moe_section(gpu_path, base_path, host_path, terminal=None, plot_dir=None, rel_dir="bench"):
    """Mixture of experts (issue 16): tests/gpu/run.sh's moe.jsonl and moe-baselines.jsonl (copied
    to docs/bench/), and a host-memory run's JSON lines (docs/bench/moe-host.jsonl); ratios
    only, each against a baseline timed in the same run."""
    out = ["## Mixture of experts (issue 16)", "",
           "Qwen3-30B-A3B's shape (48 layers of 128 experts, 18,867 params, 61 GB of bf16), FSDP dim-0 "
           "shards of every checkpoint tensor (one per expert) to vLLM's FusedMoE layout: with EP, each "
           "inference rank holds whole experts (`w13_weight` [E/EP, 2·I, Hd], `w2_weight` [E/EP, Hd, I]) "
           "and its TP slice of attention; with TP, every rank holds every expert split inside "
           "(I/T). Against the floor of the same run (`wsync-bench --help`) and the peers' method, "
           "all-gather each param then let the engine slice (bench/baselines/a_nccl_per_tensor.py "
           "with a MoE shape: every expert's tensor gathered whole, each rank keeping its slice), in "
           "one call on the GPU machine:", "",
           "```",
           "bash tests/gpu/pack.sh build-gpu gpu-carry     # here; carry gpu-carry.tgz",
           "tar xzf gpu-carry.tgz && WSYNC_GPU_SKIP=\"kernels schemes faults python bench baselines\" \\",
           "    bash tests/gpu/run.sh gpu-carry           # there: the MoE rows only (~3 min on 2 GPUs)",
           "cp $OUT/moe.jsonl $OUT/moe-baselines.jsonl docs/bench/ && python3 bench/report.py",
           "```", "",
           "One row by hand: `wsync-bench --model-shape qwen3-30b-a3b --mem cuda --json` plus the row's "
           "arguments below; the baseline: `python3 -m torch.distributed.run --standalone "
           "--nproc-per-node 4 bench/baselines/suite.py --runs a:colocated:qwen3-30b-a3b:ep,"
           "a:colocated:qwen3-30b-a3b,a:disaggregated:qwen3-30b-a3b:ep` (on 2 GPUs `colocated2`). "
           "`qwen3-235b-a22b` (470 GB) and `deepseek-v3` (1.34 TB) are shapes too; a run that does "
           "not fit is refused before it starts, naming the bytes needed and free per GPU.", ""]
    rows = {r["bench"]: r for r in jsonl(gpu_path)}
    base = jsonl(base_path)

    def baseline(j):
        for b in base:
            if (b.get("colocated") == j["colocated"] and b.get("senders") == j["senders"]
                    and b.get("tp") == j["tp"] and (b.get("ep", 1) > 1) == (j["ep"] > 1)):
                return b
        return None

    machine = next((r["result"].get("gpu") for r in rows.values() if r.get("result")), None)
    ngpu = next((r["result"]["ngpu"] for r in rows.values() if r.get("result")), 0)
    out += ["GPU: %s." % ("%s, %d GPUs" % (machine, ngpu) if machine
                          else "no results yet (the lead fills these in)"), ""]
    if machine and ngpu < 4:
        out += ["These are %d-GPU figures standing in for the issue's 4-GPU targets: each colocated "
                "row ran FSDP-%d → EP-%d (or TP-%d) on %d GPUs, with `--senders %d --ep %d` (`--tp %d`) "
                "where the table gives the 4-GPU arguments. The disaggregated row needs 4 GPUs (2 "
                "trainers, 2 inference ranks) and was not run: no 4-GPU machine was lent."
                % ((ngpu,) * 8), ""]
    runs = []
    for name, _, _ in MOE_ROWS:
        j = (rows.get(name) or {}).get("result")
        if j and j.get("floor_seconds"):
            b = baseline(j) if j["quant"] == "none" else None
            runs.append((moe_label(j), j["seconds"], j["floor_seconds"], b["seconds"] if b else None))
    if terminal and runs:
        moe_chart(runs, os.path.join(plot_dir, "moe.png"), terminal,
                  "Qwen3-30B-A3B shape, colocated, %d× %s" % (ngpu, machine))
    out += ["| scenario | wsync-bench arguments | wsync ÷ floor | all-gather ÷ wsync | fp8 ÷ bf16 | correct |",
            "| --- | --- | --- | --- | --- | --- |"]
    for name, words, argv in MOE_ROWS:
        r = rows.get(name)
        j = r.get("result") if r else None
        if not j:
            note = ("not run (needs 4 GPUs)" if name.startswith("disagg") and machine and ngpu < 4
                    else "not run" if not r else "no result (exit %s)" % r.get("rc"))
            out.append("| %s | `%s` | %s | — | — | — |" % (moe_words(words, ngpu), argv, note))
            continue
        b = baseline(j) if j["quant"] == "none" else None
        bf = rows.get(name[:-4], {}).get("result") if name.endswith("-fp8") else None
        out.append("| %s | `%s` | %.2f | %s | %s | %s |" % (
            moe_words(words, ngpu), argv, j["ratio_floor"], "%.1f" % (b["seconds"] / j["seconds"]) if b else "—",
            "%.2f" % (j["seconds"] / bf["seconds"]) if bf else "—", "yes" if j["correct"] else "NO"))
    out += ["", "Targets (issue 16): colocated FSDP-4 → EP-4 at ≤ 1.3 × the floor and ≥ 10 × faster "
            "than the all-gather method.", ""]
    if terminal and runs:
        out += ["![Mixture of experts: wsync, floor and all-gather](%s/moe.png)" % rel_dir, "",
                "Median seconds per version (log scale) of each colocated run above, as run on %d "
                "GPUs: the floor, wsync (labelled × the floor) and the all-gather method (labelled × "
                "wsync's time; the fused-expert run is set against the same per-expert all-gather)."
                % ngpu, ""]
    host = jsonl(host_path)
    if host:
        out += ["Host memory, a shared 2-core machine without GPU (`wsync-bench --model-shape SHAPE "
                "--mem host --scheme ipc --senders 2 --ep 2|--tp 2 [--fused-experts] --iters 3`; the floor "
                "is the largest receiver's bytes at one core's memcpy measured in the same run, so a "
                "ratio below 1 means the receivers' copies ran on both cores; ratios only, "
                "`qwen3-30b-a3b-2l` being Qwen3-30B-A3B's first 2 layers, 3.7 GB). One run each on a "
                "machine shared with other work, where the memcpy floor itself moved up to 2x between "
                "runs: read them as MoE targets synced and checked end to end, not as speeds.", "",
                "| shape | layout | wsync ÷ floor | correct |", "| --- | --- | --- | --- |"]
        for j in host:
            out.append("| %s | FSDP-%d%s → %s-%d%s | %.2f | %s |" % (
                j["model_shape"], j["senders"],
                " (fused experts: whole experts per sender)" if j.get("sender_experts") == "fused" else "",
                "EP" if j.get("ep", 1) > 1 else "TP", j["tp"],
                ", fp8-block" if j["quant"] != "none" else "", j["ratio_floor"],
                "yes" if j["correct"] else "NO"))
        out.append("")
    return out


# ---------------------------------------------------------------------------- delta versions

def delta_label(j):
    """scheme words of one --delta run: "store (ucx)", "nccl (sockets)", "ipc"."""
    if j["scheme"] == "store":
        return "store (%s)" % ("UCX" if j["transport"] == "ucx" else "libfabric")
    return j["scheme"] + (" colocated" if j.get("colocated") else "")


def delta_transport(name, j):
    """what carried one --delta run's bytes: the store's transport (and its forced provider), NCCL's
    sockets (tests/gpu/run.sh's nccl-sock runs force them), or the ipc scheme's memory."""
    if j["scheme"] == "store":
        t = "UCX" if j["transport"] == "ucx" else "libfabric"
        hint = j.get("store_provider")
        if hint:
            return "%s, %s" % (t, hint)
        # the host rows ran where both transports had only TCP (docs/bench/delta-host.jsonl)
        return t + (" (default)" if j["mem"] == "cuda" else " (tcp here)")
    if j["scheme"] == "nccl":
        return "NCCL sockets" if (name or "").startswith("nccl-sock") else "NCCL"
    return "CUDA IPC" if j["mem"] == "cuda" else "shared memory"


def delta_series(name, j):
    """one chart line per scheme, transport, memory and link: run.sh's store-link rows
    ("store-ofi-25g 1e-6") ran with lo limited to that rate (bench/shaped_link.sh)"""
    link = re.search(r"-([0-9.]+)g$", (name or "").split(" ")[0])
    return "%s, %s, %s%s%s" % (j["scheme"], delta_transport(name, j), j["mem"],
                               ", colocated" if j.get("colocated") else "",
                               ", %s Gbit/s" % link.group(1) if link else "")


def delta_rows(path):
    """(meta, [(run name, rc, result or None)]) of a --delta JSON lines file: lines
    {"run"|"bench": name, "rc": n, "result": wsync-bench --delta --json} and an optional
    {"kind": "meta", ...} line."""
    meta, rows = {}, []
    for r in jsonl(path):
        if r.get("kind") == "meta":
            meta = r
        else:
            rows.append((r.get("run") or r.get("bench"), r.get("rc"), r.get("result")))
    return meta, rows


DELTA_SVG = 'svg size 1100,600 dynamic noenhanced font "DejaVu Sans,11"'


def delta_chart(runs, path, title):
    """runs: (name, result) of good --delta runs; wire bytes (% of the full version's, left axis,
    log) and time (delta ÷ full, right axis, log) against lr (log), one colour per scheme,
    transport and memory; an SVG (text: diffs stay readable)."""
    colours = ["#1b3a8c", "#e07b00", "#2a9d3a", "#b5179e", "#6c757d", "#c1121f", "#0096c7",
               "#7f5539"]
    gp = ["set terminal " + DELTA_SVG, 'set output "%s"' % path, "set encoding utf8",
          'set title "%s"' % title, 'set xlabel "learning rate (--lr)"',
          'set ylabel "wire bytes, % of the full version (solid)"',
          'set y2label "seconds per version, delta ÷ full (dashed)"',
          "set logscale x", "set logscale y", "set logscale y2", 'set format x "%.0e"',
          'set format y "%g"', 'set format y2 "%g"', "set ytics nomirror", "set y2tics",
          "set grid xtics ytics", "set key outside right top vertical Left reverse",
          "set xrange [%.6g:%.6g]" % (min(j["lr"] for _, j in runs) / 2,
                                      max(j["lr"] for _, j in runs) * 2),
          # the targets: 4 % of the bytes (lr 1e-6, Qwen3-8B), 0.1 x the time (network
          # bound); and delta = full
          'set arrow from graph 0, first 4 to graph 1, first 4 nohead lc rgb "#444444" dt 3',
          'set label "4 % of the bytes" at graph 0.01, first 4 offset 0,0.6 font ",9"',
          'set arrow from graph 0, second 0.1 to graph 1, second 0.1 nohead lc rgb "#444444" dt 4',
          'set label "0.1 x the time" at graph 0.99, second 0.1 right offset 0,0.6 font ",9"',
          'set arrow from graph 0, second 1 to graph 1, second 1 nohead lc rgb "#999999" dt 2',
          'set label "delta = full" at graph 0.99, second 1 right offset 0,0.6 font ",9"']
    labels = []
    for name, j in runs:
        if delta_series(name, j) not in labels:
            labels.append(delta_series(name, j))
    plots = []
    for i, lab in enumerate(labels):
        pts = sorted((j["lr"], 100 * j["wire_ratio"], j["time_ratio"]) for name, j in runs
                     if delta_series(name, j) == lab)
        c = colours[i % len(colours)]
        gp.append("$w%d << EOD\n%s\nEOD" % (i, "\n".join("%.6g %.6g" % (x, w) for x, w, _ in pts)))
        gp.append("$t%d << EOD\n%s\nEOD" % (i, "\n".join("%.6g %.6g" % (x, t) for x, _, t in pts)))
        # a point type of its own per line: transports with the same wire bytes overlap exactly
        pt = [7, 5, 9, 11, 13, 15][i % 6]
        plots.append('$w%d axes x1y1 with linespoints lc rgb "%s" lw 2 pt %d ps 1.3 title "%s: wire '
                     'bytes"' % (i, c, pt, lab))
        plots.append('$t%d axes x1y2 with linespoints lc rgb "%s" lw 2 dt 2 pt %d ps 1.3 title "%s: '
                     'time"' % (i, c, pt - 1, lab))
    gp.append("plot " + ", \\\n     ".join(plots))
    res = subprocess.run(["gnuplot"], input="\n".join(gp) + "\n", capture_output=True, text=True)
    if res.returncode != 0:
        fail("gnuplot failed on %s: %s" % (path, res.stderr.strip()))


def lr_text(lr):
    """1e-06 -> 1e-6"""
    m, e = ("%.0e" % lr).split("e")
    return "%se%d" % (m, int(e))


def codec_cell(j):
    """(encode + apply) ÷ reading both versions once, and whether the applied bytes were right"""
    if j.get("codec_ratio") is None:
        return "–"
    return "%.2f%s" % (j["codec_ratio"], "" if j.get("codec_correct") else " (applied bytes WRONG)")


def delta_ratio_cell(j):
    """delta ÷ full, and the read floor ÷ full where the run measured it (the store on host memory)"""
    if j.get("read_floor_ratio") is None:
        return "%.3f" % j["time_ratio"]
    return "%.3f (floor %.3f)" % (j["time_ratio"], j["read_floor_ratio"])


def delta_summary(rows):
    """rows: (file's title, run name, rc, result or None) of every --delta run"""
    out = ["| run | lr | scheme | transport | mem | shape | changed | wire ÷ full | time, delta ÷ "
           "full | codec ÷ read both | correct |",
           "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for title, name, rc, j in rows:
        if not j:
            out.append("| %s (%s) | | | | | | | | no result (exit status %s) | | |"
                       % (name, title if title[0].isdigit() else title.lower(), rc))
            continue
        out.append("| %s (%s) | %s | %s | %s | %s | %s | %.2f %% | %.2f %% | %s | %s | %s |" % (
            name, title if title[0].isdigit() else title.lower(), lr_text(j["lr"]), j["scheme"] + (" colocated" if j.get("colocated")
                                                                 else ""),
            delta_transport(name, j), j["mem"], j["model_shape"], 100 * j["changed_fraction"],
            100 * j["wire_ratio"], delta_ratio_cell(j), codec_cell(j), "yes" if j["correct"] else "NO"))
    return out


def delta_table(rows):
    out = ["| run | shape | lr | delta | changed | wire bytes (÷ full) | seconds, delta | seconds, "
           "full | delta ÷ full | codec: encode / apply / read both | versions | correct |",
           "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for name, rc, j in rows:
        if not j:
            out.append("| %s | | | | | no result (exit status %s) | | | | | | |" % (name, rc))
            continue
        codec = ("%s / %s" % (secs(j["encode_seconds"]), secs(j["apply_seconds"]))
                 if j.get("encode_seconds") is not None else "–")
        if j.get("read_both_seconds") is not None:
            codec += " / %s" % secs(j["read_both_seconds"])
        # the store times the fetch; its publish (the push: snapshot, encoding) comes beside it
        pub = j["scheme"] == "store" and j.get("push_seconds") is not None
        sd = secs(j["seconds"]) + (" (publish %s)" % secs(j["push_seconds"]) if pub else "")
        sf = secs(j["full_seconds"]) + (" (publish %s)" % secs(j["full_push_seconds"]) if pub else "")
        out.append("| %s | %s | %s | %s | %.2f %% | %.1f MB of %.1f MB (%.2f %%) | %s | %s | %s | %s | %d + %d | %s |" % (
            delta_label(j), j["model_shape"], lr_text(j["lr"]), j["delta_resolved"],
            100 * j["changed_fraction"], j["wire_bytes"] / 1e6, j["full_wire_bytes"] / 1e6,
            100 * j["wire_ratio"], sd, sf, delta_ratio_cell(j), codec, j["warmup"], j["iters"], "yes" if j["correct"] else "NO"))
    return out


def delta_section(host_path, *gpu_paths, plots=True, plot_dir=None, rel_dir="bench"):
    """Delta versions (issue 17): wsync-bench --delta runs on host memory (docs/bench/delta-host.jsonl,
    with a meta line) and tests/gpu/run.sh's step delta (its delta.jsonl, copied to
    docs/bench/delta.jsonl; further GPU files, e.g. another machine's, after it): one table and
    one chart (delta.svg) of every run, then each file's machine and its runs in full. A file's
    meta "title" names it in the tables ("GPUs" when none)."""
    out = ["## Delta versions (issue 17)", "",
           "`wsync-bench --delta --lr X`: every shard element has an fp32 master (version 1: "
           "about N(0, 0.02²), four uniforms summed); each version adds lr × d, d drawn per "
           "(param, element, version) with |d| uniform in [0, 1) and a random sign (an Adam-like "
           "step), and the bf16 weights are the masters rounded to nearest even. The same versions "
           "are pushed twice in one run, by a group with delta on and then by one with delta off, "
           "and every receiver checks every version of both against its own masters. Changed: "
           "elements the step changed per version. Wire bytes: the senders' push stats (encoded "
           "chunks plus chunks sent plain) against the full version's (version 1: no receiver "
           "holds a base, everything plain). Seconds: median of the timed versions (the slowest "
           "sender's push; the store: the slowest receiver's fetch, with the slowest sender's "
           "publish beside it where the run reported it); delta ÷ full: median of the "
           "per-version ratios, with the floor of the store reader's pass on host memory where "
           "the run measured it (its targets read once on its pool's threads, ÷ full: the least "
           "the check of the new values' hash can take). Codec: the codec timed apart from the sync on the senders' own "
           "version pairs (the schemes report no codec times): on host memory the CPU codec "
           "(core/delta.h, one thread, format 3 as the ipc and nccl senders send it; encode, "
           "then check and apply as a receiver) on every "
           "version, reading both versions once = a memcpy of one; on CUDA memory the batched "
           "kernels (kernels/delta.h; encode, then apply with the hash onto a copy of the old "
           "values) on the last version, CUDA events, medians, reading both = the faster of a "
           "device-to-device copy of one version and an amax over both; codec ÷ read both = "
           "(encode + apply) ÷ that, and the applied bytes are compared with the new ones. "
           "Versions: warm-up + timed, in each mode. Targets (issue 17): wire bytes at lr 1e-6 "
           "on the Qwen3-8B shape ≤ 4 % of the full version's; over a network-bound link (nccl "
           "over sockets, the store over tcp) time per version ≤ 0.1 × full; encode + apply ≤ "
           "1.5 × reading both versions at HBM speed; colocated, auto never slower than full.", ""]
    hmeta, hrows = delta_rows(host_path)
    files = [("Host memory", hmeta, hrows, host_path)]
    for path in gpu_paths:
        gmeta, grows = delta_rows(path)
        files.append((gmeta.get("title", "GPUs"), gmeta, grows, path))
    if not any(rows for _, _, rows, _ in files):
        return out + ["No delta results yet: see bench/README.md (host runs) and tests/gpu/run.sh "
                      "step delta (GPU runs).", ""]
    every = [(title, n, rc, j) for title, _, rows, _ in files for n, rc, j in rows]
    good_runs = [(n, j) for _, n, _, j in every if j]
    if plots and plot_dir and good_runs:
        delta_chart(good_runs, os.path.join(plot_dir, "delta.svg"),
                    "Delta versions: wire bytes and time against lr")
        out += ["![Delta versions: wire bytes and time against lr](%s/delta.svg)" % rel_dir, ""]
    out += ["Every run (%s):" % "; ".join("%s: %s" % (t.lower() if t == "Host memory" else t, p)
                                          for t, _, rows, p in files if rows),
            ""] + delta_summary(every) + [""]
    for title, meta, rows, _ in files:
        if not rows:
            continue
        out += ["### %s" % title, ""]
        if meta:
            out += ["Machine: %s. Date: %s. Commit: %s. Load average %s before, %s after. %s" % (
                meta.get("machine", "?"), meta.get("date", "?"), meta.get("commit", "?"),
                meta.get("load_before", "?"), meta.get("load_after", "?"), meta.get("note", "")), ""]
        else:
            g = next((j.get("gpu") for _, _, j in rows if j and j.get("gpu")), "")
            out += ["Machine: %s (tests/gpu/run.sh step delta)." % (g or "?"), ""]
        out += delta_table(rows) + [""]
        for note in meta.get("notes", []):
            out += [note, ""]
    return out


def hand_written(sec_dir, prefix=""):
    """the hand-written sections of docs/bench/sections/ (figures no generator here produces:
    other tools' runs, arithmetic) whose file names start with prefix, in name order, as lines
    of the page. A name starts with its issue's number: 17_ files are subsections of the delta
    section and go right after it."""
    lines = []
    for name in sorted(os.listdir(sec_dir)) if os.path.isdir(sec_dir) else []:
        if name.endswith(".md") and name.startswith(prefix):
            with open(os.path.join(sec_dir, name)) as f:
                lines += [f.read().rstrip(), ""]
    return lines


def splice_section(path, heading, lines):
    """replace the section of page `path` that starts at `heading` (up to the next heading of
    its level) with lines; the rest of the page stays as it is."""
    with open(path) as f:
        page = f.read().split("\n")
    level = heading.split(" ")[0] + " "
    try:
        a = page.index(heading)
    except ValueError:
        fail("%s has no line %r: regenerate the whole page (without --section)" % (path, heading))
    b = next((i for i in range(a + 1, len(page)) if page[i].startswith(level)), len(page))
    page[a:b] = lines
    with open(path, "w") as f:
        f.write("\n".join(page).rstrip() + "\n")


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("results", nargs="*", help="compare.sh results.json files (default docs/bench/gpu.json)")
    p.add_argument("--cpu", help="cpu.sh's JSON (default docs/bench/cpu.json)")
    p.add_argument("--out", default="docs/benchmarks.md", help="the page (default docs/benchmarks.md)")
    p.add_argument("--summary", action="store_true", help="print a text table of the GPU results only")
    p.add_argument("--machine", help="instead of the results' machine")
    p.add_argument("--date", help="instead of the results' date")
    p.add_argument("--commit", help="instead of the results' commit")
    p.add_argument("--no-plots", action="store_true", help="tables only, no gnuplot")
    p.add_argument("--moe", nargs=3, metavar=("GPU", "BASELINES", "HOST"),
                   default=["docs/bench/moe.jsonl", "docs/bench/moe-baselines.jsonl",
                            "docs/bench/moe-host.jsonl"],
                   help="the MoE section's inputs: tests/gpu/run.sh's moe.jsonl and "
                        "moe-baselines.jsonl, and host runs' wsync-bench JSON lines (defaults under "
                        "docs/bench/; a missing file leaves its rows empty)")
    p.add_argument("--delta", nargs="+", metavar="FILE",
                   default=["docs/bench/delta-host.jsonl", "docs/bench/delta.jsonl",
                            "docs/bench/delta-4gpu.jsonl"],
                   help="the delta section's inputs: wsync-bench --delta JSON lines on host memory, "
                        "then tests/gpu/run.sh's delta.jsonl files, one per machine, each with a "
                        "meta line (defaults under docs/bench/; a missing file has no rows)")
    p.add_argument("--section", choices=["delta"],
                   help="rewrite only this section of the existing page (and its chart), leaving "
                        "the rest as it is")
    args = p.parse_args()
    if len(args.delta) < 2:
        fail("--delta takes the host file, then one or more GPU files")
    if args.section == "delta":
        plot_dir = os.path.join(os.path.dirname(os.path.abspath(args.out)), "bench")
        # the section runs to the next "## " heading: the 17_ subsections are in it
        splice_section(args.out, "## Delta versions (issue 17)",
                       delta_section(*args.delta, plots=not args.no_plots, plot_dir=plot_dir,
                                     rel_dir="bench")
                       + hand_written(os.path.join(plot_dir, "sections"), "17_"))
        print("wrote the delta section of %s" % args.out, file=sys.stderr)
        return 0
    results = args.results or [f for f in ["docs/bench/gpu.json"] if os.path.exists(f)]
    if args.summary:
        if not results:
            fail("--summary needs a results file")
        print(summary(*load(results)))
        return 0
    cpu = args.cpu or ("docs/bench/cpu.json" if os.path.exists("docs/bench/cpu.json") else None)
    out_dir = os.path.dirname(os.path.abspath(args.out))
    plot_dir = os.path.join(out_dir, "bench")
    os.makedirs(plot_dir, exist_ok=True)
    page = ["# Benchmarks", "",
            "Generated by `bench/report.py` from `bench/compare.sh` (GPU, a lent 4× H200 machine) and "
            "`bench/cpu.sh` (CPU) results; see bench/README.md. Charts are drawn by gnuplot.", ""]
    if results:
        metas, rows = load(results)
        page += gpu_section(metas, rows, args, plot_dir, "bench")
    else:
        page += ["## GPU: wsync against the peers' methods", "",
                 "No GPU results here yet. On a lent 4-GPU machine (nvidia-h200-x4), with the build "
                 "carried (`bash tests/gpu/pack.sh build-gpu gpu-carry`): `bash bench/compare.sh gpu-carry` "
                 "(writes results.json, summary.txt and logs.tar.gz under $OUT); copy results.json "
                 "to docs/bench/gpu.json and run `python3 bench/report.py`.", ""]
    term = None if args.no_plots else gnuplot_terminal()
    if not args.no_plots and term is None:
        fail("gnuplot not found: install it (apt-get install gnuplot-nox) or pass --no-plots")
    page += moe_section(*args.moe, terminal=term, plot_dir=plot_dir, rel_dir="bench")
    page += delta_section(*args.delta, plots=term is not None, plot_dir=plot_dir, rel_dir="bench")
    page += hand_written(os.path.join(plot_dir, "sections"))
    page += cpu_section(cpu, args)
    with open(args.out, "w") as f:
        f.write("\n".join(page).rstrip() + "\n")
    print("wrote %s%s" % (args.out, " and charts in " + plot_dir if results and not args.no_plots else ""),
          file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
