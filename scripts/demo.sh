#!/usr/bin/env bash
# The main job: build everything, then show what ctxstore does — the session
# benchmark, side by side with rewriting a state file and a SQLite blob.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/bootstrap.sh
exec ./build/bench/bench_session --quick "$@"
