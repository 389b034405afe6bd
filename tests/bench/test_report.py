"""bench/report.py --section delta on a copy of docs/: the delta section is rewritten from its
JSON, and nothing else of the page changes. The hand-written subsections of the delta issue
(docs/bench/sections/17_*.md) lie inside that section: they must come back whole, as the full
page's generation places them; the page before and after the section stays byte for byte."""
import os
import shutil
import subprocess
import sys
import tempfile

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
HEAD = "## Delta versions (issue 17)"


def main():
    failed = 0

    def check(ok, what):
        nonlocal failed
        if not ok:
            failed += 1
            print("FAIL: " + what)

    with tempfile.TemporaryDirectory() as tmp:
        shutil.copytree(os.path.join(ROOT, "docs"), os.path.join(tmp, "docs"))
        page = os.path.join(tmp, "docs", "benchmarks.md")
        with open(page) as f:
            before = f.read()
        r = subprocess.run([sys.executable, os.path.join(ROOT, "bench", "report.py"), "--section",
                            "delta", "--no-plots", "--out", page], cwd=tmp,
                           capture_output=True, text=True)
        check(r.returncode == 0, "report.py exited %d: %s" % (r.returncode, r.stderr))
        with open(page) as f:
            after = f.read()
        a, b = before.index(HEAD), after.index(HEAD)
        check(before[:a] == after[:b], "the page before the delta section changed")
        nxt = before.index("\n## ", a + 1)
        tail = before[nxt:]
        check(after.endswith(tail), "the page after the delta section changed")
        sec_dir = os.path.join(tmp, "docs", "bench", "sections")
        names = sorted(n for n in os.listdir(sec_dir) if n.startswith("17_") and n.endswith(".md"))
        check(names != [], "no 17_ sections to check in " + sec_dir)
        for n in names:
            with open(os.path.join(sec_dir, n)) as f:
                text = f.read().rstrip()
            check(text in after, "docs/bench/sections/%s is not in the rewritten section" % n)
        # the generated part: a row per run of the delta files (the first host row by name)
        check("| ipc 1e-6 (host memory) | 1e-6 | ipc |" in after, "the delta table's host row is missing")
    print("%s" % ("ok" if failed == 0 else "%d checks failed" % failed))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
