#!/usr/bin/env bash
# The whole test suite (every label: unit and crash), after a build.
# Extra arguments go to `meson test` (e.g. --suite unit).
set -uo pipefail
cd "$(dirname "$0")/.."
./scripts/bootstrap.sh || exit 1
meson test -C build --print-errorlogs --num-processes 2 "$@"
status=$?
# One closing line that any CI reads: N passed, N failed.
python3 - build/meson-logs/testlog.json <<'PY' || true
import json, re, sys
passed = failed = skipped = 0
synthesis = re.compile(r"Synthesis: Tested: (\d+) \| Passing: (\d+) \| Failing: (\d+) \| Crashing: (\d+)")
for line in open(sys.argv[1]):
    t = json.loads(line)
    m = synthesis.search((t.get("stdout") or "") + (t.get("stderr") or ""))
    if m:  # a Criterion suite: count its tests, skipped ones included in Tested
        tested, ok, bad, crashed = map(int, m.groups())
        passed += ok
        failed += bad + crashed
        skipped += max(0, tested - ok - bad - crashed)
    elif t["result"] in ("OK", "EXPECTEDFAIL"): passed += 1
    elif t["result"] == "SKIP": skipped += 1
    else: failed += 1
print(f"tests: {passed} passed, {failed} failed, {skipped} skipped")
PY
exit $status
