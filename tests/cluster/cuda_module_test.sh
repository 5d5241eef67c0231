#!/usr/bin/env bash
# What `--device cuda` says when the CUDA module cannot be used, on any
# machine: none next to the program ("this build has no CUDA backend"), one
# that does not load ("found ... but could not load it: REASON"), and one
# from another build ("is from another build (version ...)").
#   tests/cluster/cuda_module_test.sh BUILD_DIR
set -euo pipefail
build=$(cd "$1" && pwd)
tmp=$(mktemp -d /tmp/tether-cuda-module-test-XXXXXX)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }
cp "$build/tether-worker" "$tmp/"
says() {  # EXPECTED: tether-worker --device cuda must fail saying it
  local out
  if out=$("$tmp/tether-worker" --coordinator 127.0.0.1:1 --device cuda 2>&1); then
    fail "--device cuda succeeded: $out"
  fi
  grep -qF -- "$1" <<< "$out" || fail "expected '$1', got: $out"
  echo "ok: $out"
}
says "this build has no CUDA backend (no libtether_cuda.so next to the program"
printf 'not a shared object' > "$tmp/libtether_cuda.so"
says "found $tmp/libtether_cuda.so but could not load it: "
cat > "$tmp/old.cc" << 'CC'
extern "C" const char* tether_cuda_module_version() { return "0.0.1/fc1"; }
extern "C" void tether_make_cuda_backend() {}
CC
g++ -shared -fPIC -o "$tmp/libtether_cuda.so" "$tmp/old.cc"
says "$tmp/libtether_cuda.so is from another build (version 0.0.1/fc1, this program "
echo "cuda module messages: OK"
