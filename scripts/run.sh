#!/usr/bin/env bash
# Sets up (scripts/setup.sh) and starts the main job: the OpenAI-compatible server on the
# default model, at http://127.0.0.1:8000 (extra arguments go to `kaon serve`).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
exec build/kaon serve "$@"
