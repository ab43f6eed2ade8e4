#!/usr/bin/env bash
# The whole test suite (every label: unit and crash), after a build.
# Extra arguments go to `meson test` (e.g. --suite unit).
set -uo pipefail
cd "$(dirname "$0")/.."
./scripts/bootstrap.sh || exit 1
# Criterion names a skipped test ("[SKIP] suite::test: why") only at
# verbosity 1, and leaves it out of its Synthesis line: the closing line
# counts those lines.
CRITERION_VERBOSITY_LEVEL=1 meson test -C build --print-errorlogs --num-processes 2 "$@"
status=$?
# One closing line that any CI reads: N passed, N failed, N skipped.
python3 - build/meson-logs/testlog.json <<'PY' || true
import json, re, sys
passed = failed = skipped = 0
synthesis = re.compile(r"Synthesis: Tested: \d+ \| Passing: (\d+) \| Failing: (\d+) \| Crashing: (\d+)")
skip = re.compile(r"^\[SKIP\] ", re.M)
# pytest's summary line: "3 failed, 45 passed, 2 skipped in 4.2s".
pytest_summary = re.compile(r"^=* ?((?:\d+ [a-z]+(?:, )?)+) in [\d.]+s", re.M)
color = re.compile(r"\x1b\[[0-9;]*m")
for line in open(sys.argv[1]):
    t = json.loads(line)
    log = color.sub("", (t.get("stdout") or "") + "\n" + (t.get("stderr") or ""))
    m = synthesis.search(log)
    if m:  # a Criterion suite: count its tests
        ok, bad, crashed = map(int, m.groups())
        n_skip = len(skip.findall(log))
        passed += ok
        failed += bad + crashed
        skipped += n_skip
        # Its exit status has the last word: 77 is a skip (test_cuda without
        # a device), any other failure one more failed.
        if t["result"] == "SKIP" and n_skip == 0: skipped += 1
        elif t["result"] not in ("OK", "SKIP", "EXPECTEDFAIL") and bad + crashed == 0: failed += 1
        continue
    summaries = pytest_summary.findall(log)
    if summaries:  # a pytest suite (python/tests): count its tests
        counts = {w: int(n) for n, w in re.findall(r"(\d+) ([a-z]+)", summaries[-1])}
        bad = counts.get("failed", 0) + counts.get("error", 0) + counts.get("errors", 0)
        passed += counts.get("passed", 0) + counts.get("xfailed", 0)
        failed += bad + counts.get("xpassed", 0)
        skipped += counts.get("skipped", 0)
        # Killed, timed out, or failed outside any test: one more failed.
        if t["result"] not in ("OK", "SKIP", "EXPECTEDFAIL") and bad == 0: failed += 1
    elif t["result"] in ("OK", "EXPECTEDFAIL"): passed += 1
    elif t["result"] == "SKIP": skipped += 1
    else: failed += 1
print(f"tests: {passed} passed, {failed} failed, {skipped} skipped")
PY
exit $status
