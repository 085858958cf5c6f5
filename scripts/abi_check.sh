#!/usr/bin/env bash
# libkaon's ABI held to the baseline abi/libkaon.abi (abidw's record of the exported functions
# and every public type they reach). Fails when a function is removed or a type changes (size,
# layout, a parameter); an added function passes. The exported functions must also be exactly
# those kaon.h declares (src/api/libkaon.map lists them).
#   scripts/abi_check.sh [LIBRARY]            check (LIBRARY: a libkaon.so.0 with debug info;
#                                             default: build one in build-abi, -O0 -g)
#   scripts/abi_check.sh --update [LIBRARY]   rewrite the baseline after a deliberate change
#                                             (a break also bumps KAON_VERSION_MAJOR, the soname)
set -euo pipefail
cd "$(dirname "$0")/.."
update=0
if [ "${1:-}" = "--update" ]; then update=1; shift; fi
lib=${1:-}
if [ -z "$lib" ]; then
  [ -f build-abi/build.ninja ] || cmake -S . -B build-abi -G Ninja -DCMAKE_BUILD_TYPE=Debug \
    -DCMAKE_C_FLAGS_DEBUG="-g -O0" -DKAON_CUDA=OFF -DKAON_SERVE=OFF -DKAON_TESTS=OFF -DKAON_BENCH=OFF >/dev/null
  ninja -C build-abi kaon_shared >/dev/null
  lib=build-abi/libkaon.so.0
fi
command -v abidw >/dev/null || { echo "abi_check: abidw missing (apt-get install abigail-tools)" >&2; exit 2; }

declared=$(grep -oE '\bkaon_[a-z0-9_]+\(' include/kaon.h | tr -d '(' | sort -u)
exported=$(nm -D --defined-only "$lib" | awk '$2 == "T" { sub(/@.*/, "", $3); print $3 }' | sort -u)
if [ "$declared" != "$exported" ]; then
  echo "abi_check: $lib exports other functions than include/kaon.h declares (< kaon.h, > library):" >&2
  diff <(echo "$declared") <(echo "$exported") >&2 || true
  echo "abi_check: update src/api/libkaon.map" >&2
  exit 1
fi

current=$(mktemp)
trap 'rm -f "$current"' EXIT
abidw --headers-dir include --drop-private-types --drop-undefined-syms --no-corpus-path --no-comp-dir-path --no-show-locs \
  "$lib" >"$current"
if [ $update -eq 1 ]; then
  mkdir -p abi
  cp "$current" abi/libkaon.abi
  echo "abi_check: baseline abi/libkaon.abi updated from $lib ($(echo "$exported" | wc -l) functions)"
  exit 0
fi
# abidiff's status is a bit set: 4 = an ABI change, 8 = an incompatible one, 1/2 = its own error.
# --no-added-syms: a new function is a compatible change.
set +e
abidiff --no-added-syms abi/libkaon.abi "$current" >"$current.diff" 2>&1
rc=$?
set -e
if [ $rc -ne 0 ]; then
  cat "$current.diff" >&2
  rm -f "$current.diff"
  if [ $((rc & 3)) -ne 0 ]; then echo "abi_check: abidiff failed (status $rc)" >&2; exit 2; fi
  echo "abi_check: libkaon's ABI changed against abi/libkaon.abi (see above). If that is meant:" >&2
  echo "  bump KAON_VERSION_MAJOR in include/kaon.h when it breaks callers, then scripts/abi_check.sh --update" >&2
  exit 1
fi
rm -f "$current.diff"
echo "abi_check: ABI matches abi/libkaon.abi ($(echo "$exported" | wc -l) functions)"
