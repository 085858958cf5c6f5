#!/usr/bin/env bash
# The Python package as a user gets it: `pip install .` (scikit-build-core from PyPI builds
# libkaon.so.0 with CMake into the package) in a fresh venv in a temporary folder, then
# tests/python with that venv, against the CLI of $KAON_BUILD (default build/) and the default
# model (scripts/setup.sh fetches both).
set -euo pipefail
cd "$(dirname "$0")/.."
build=${KAON_BUILD:-$PWD/build}
[ -x "$build/kaon" ] || { echo "test_python: $build/kaon missing (run scripts/setup.sh)" >&2; exit 2; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
python3 -m venv "$tmp/venv"
echo "test_python: pip install . (builds libkaon.so.0)"
t0=$(date +%s)
# scikit-build-core builds in a folder of its own: this tree's build folders play no part.
# numpy: tests/python/test_plugins.py writes its model with the tests/ref helpers.
"$tmp/venv/bin/pip" install -q --disable-pip-version-check pytest numpy .
echo "test_python: installed in $(( $(date +%s) - t0 )) s"
# From the venv: `import kaon` is the installed package, not python/ of this tree.
KAON_BUILD=$build "$tmp/venv/bin/python" -m pytest -q -p no:cacheprovider tests/python "$@"
