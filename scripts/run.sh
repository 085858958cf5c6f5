#!/usr/bin/env bash
# Sets up (scripts/setup.sh) and runs the main job on the default model.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
exec build/kaon run -p "${KAON_PROMPT:-The three most useful things to know about the ocean are}" -n 96 "$@"
