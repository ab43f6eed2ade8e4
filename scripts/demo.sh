#!/usr/bin/env bash
# The main job: install what is missing, build everything, then run
# `ctxstore demo`: a chat saved turn by turn, closed, resumed and continued,
# side by side with rewriting a state file and a SQLite blob.
# Arguments go to the demo (e.g. --turns 8, --store DIR, --json).
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/bootstrap.sh
exec ./build/tools/ctxstore/ctxstore demo "$@"
