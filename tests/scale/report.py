#!/usr/bin/env python3
"""docs/scale.md's figures: runs tests/scale's test_scale for each participant count, with
doorbells off (WSYNC_DOORBELL=0: BEGIN, COMMIT and DONE as TCP messages) and on, and
wsync-bench's one-receiver control cost both ways; writes docs/scale/scale.json and the chart
docs/scale/scale.png (gnuplot), and prints the markdown tables for docs/scale.md.

    python3 tests/scale/report.py BUILD_DIR [COUNTS]      # COUNTS default 16,64,256,1024
    python3 tests/scale/report.py --from docs/scale/scale.json   # tables and chart only

Standard library and gnuplot only (as bench/report.py)."""
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
OUT = os.path.join(ROOT, "docs", "scale")


def run_scale(build, n, bells):
    env = dict(os.environ, WSYNC_SCALE_PARTICIPANTS=str(n), WSYNC_DOORBELL="1" if bells else "0")
    p = subprocess.run([os.path.join(build, "tests", "test_scale")], env=env, capture_output=True,
                       text=True, timeout=1800)
    rows = [json.loads(l) for l in p.stdout.splitlines() if l.startswith("{")]
    if p.returncode != 0 or not rows:
        sys.stderr.write(p.stderr[-3000:])
        raise SystemExit("test_scale failed for %d participants (doorbells %s)" % (n, bells))
    row = rows[-1]
    row["doorbells"] = bells
    return row


def run_bench(build, bells, reps=5):
    """Median push time (ms) of 4 KiB to one receiver: the per-version control cost."""
    env = dict(os.environ, WSYNC_DOORBELL="1" if bells else "0")
    out = []
    for _ in range(reps):
        p = subprocess.run([os.path.join(build, "bin", "wsync-bench"), "--scheme", "ipc", "--mem",
                            "host", "--receivers", "1", "--bytes", "4K", "--iters", "400",
                            "--json"], env=env, capture_output=True, text=True, timeout=600)
        line = [l for l in p.stdout.splitlines() if l.startswith("{")]
        if p.returncode != 0 or not line:
            sys.stderr.write(p.stderr[-2000:])
            raise SystemExit("wsync-bench failed (doorbells %s)" % bells)
        j = json.loads(line[-1])
        out.append(float(j["seconds"]) * 1e3)
    return statistics.median(out), out


def chart(rows, png):
    gp = shutil.which("gnuplot")
    if gp is None:
        print("gnuplot not found: no chart", file=sys.stderr)
        return
    fd, data = tempfile.mkstemp(suffix=".dat")
    with os.fdopen(fd, "w") as f:
        for bells in (False, True):
            f.write("# doorbells %s\n" % ("on" if bells else "off"))
            for r in sorted((r for r in rows if r["doorbells"] == bells),
                            key=lambda r: r["participants"]):
                f.write("%d %.4f %.2f %d\n" % (r["participants"], r["control_ms"], r["rss_mib"],
                                               r["fds"]))
            f.write("\n\n")
    script = """
set terminal pngcairo size 900,420 font ',10' noenhanced
set output '%s'
set multiplot layout 1,2
set logscale xy
set xlabel 'participants (1 sender + receivers)'
set grid
set key top left
set title 'coordinator control time per version'
set ylabel 'ms'
plot '%s' index 0 using 1:2 with linespoints title 'messages (WSYNC_DOORBELL=0)', \\
     '' index 1 using 1:2 with linespoints title 'doorbells'
set title 'sender-0 process: descriptors and memory'
set ylabel 'open descriptors'
set y2label 'RSS MiB'
set y2tics
unset logscale y
set logscale y
plot '%s' index 1 using 1:4 with linespoints title 'descriptors', \\
     '' index 1 using 1:3 axes x1y2 with linespoints title 'RSS (MiB)'
unset multiplot
""" % (png, data, data)
    p = subprocess.run([gp], input=script, text=True, capture_output=True)
    if p.returncode != 0:
        # an older gnuplot without pngcairo
        p = subprocess.run([gp], input=script.replace("pngcairo", "png"), text=True,
                           capture_output=True)
    os.unlink(data)
    if p.returncode != 0:
        print("gnuplot failed: " + p.stderr, file=sys.stderr)


def tables(doc):
    rows = doc["scale"]
    by = {(r["participants"], r["doorbells"]): r for r in rows}
    counts = sorted({r["participants"] for r in rows})
    print("| participants | control ms, messages | control ms, doorbells | ratio | push ms "
          "(doorbells) | data ms | per receiver us (doorbells) | RSS MiB | descriptors | "
          "setup s |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for n in counts:
        off, on = by.get((n, False)), by.get((n, True))
        ref = on or off
        print("| %d | %s | %s | %s | %.3f | %.4f | %s | %.1f | %d | %.1f |" % (
            n, "%.3f" % off["control_ms"] if off else "-",
            "%.3f" % on["control_ms"] if on else "-",
            "%.2f" % (off["control_ms"] / on["control_ms"]) if off and on else "-",
            ref["push_ms"], ref["data_ms"],
            "%.1f" % (on["control_ms_per_receiver"] * 1e3) if on else "-",
            ref["rss_mib"], ref["fds"], ref["setup_s"]))
    if "bench" in doc:
        b = doc["bench"]
        print()
        print("| wsync-bench, 4 KiB to 1 receiver | median push ms (runs) |")
        print("| --- | --- |")
        print("| messages (WSYNC_DOORBELL=0) | %.4f (%s) |" % (
            b["off_ms"], ", ".join("%.4f" % x for x in b["off_runs"])))
        print("| doorbells | %.4f (%s) |" % (b["on_ms"], ", ".join("%.4f" % x
                                                                for x in b["on_runs"])))
        print("| ratio | %.2f |" % (b["off_ms"] / b["on_ms"]))


def main():
    os.makedirs(OUT, exist_ok=True)
    if len(sys.argv) >= 3 and sys.argv[1] == "--from":
        doc = json.load(open(sys.argv[2]))
    else:
        if len(sys.argv) < 2:
            raise SystemExit(__doc__)
        build = sys.argv[1]
        counts = [int(x) for x in (sys.argv[2] if len(sys.argv) > 2 else
                                   "16,64,256,1024").split(",")]
        rows = []
        for n in counts:
            for bells in (False, True):
                rows.append(run_scale(build, n, bells))
                print(json.dumps(rows[-1]), file=sys.stderr)
        off, off_runs = run_bench(build, False)
        on, on_runs = run_bench(build, True)
        doc = {"scale": rows, "bench": {"off_ms": off, "off_runs": off_runs, "on_ms": on,
                                        "on_runs": on_runs}}
        json.dump(doc, open(os.path.join(OUT, "scale.json"), "w"), indent=1)
    chart(doc["scale"], os.path.join(OUT, "scale.png"))
    tables(doc)


if __name__ == "__main__":
    main()
