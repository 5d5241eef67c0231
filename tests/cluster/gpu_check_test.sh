#!/usr/bin/env bash
# tools/gpu-check's own logic, up to where it finds no GPU (this machine has
# none): a build without the CUDA module fails at check 0, saying so; a pack
# is made from a build, stays under the 64 MiB a GPU machine's tree may
# carry, unpacks and runs its binaries with the libraries it holds, finds
# the module and stops at check 1 with exit 2; every run writes its summary.
#   tests/cluster/gpu_check_test.sh BUILD_DIR
set -euo pipefail
build=$(cd "$1" && pwd)
cd "$(dirname "$0")/../.."
tmp=$(mktemp -d /tmp/tether-gpu-check-test-XXXXXX)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }
# A build dir with the real binaries; the module is what each case varies.
mkdir -p "$tmp/b/tests"
for f in tether-server tether-worker tether-up tests/tether_unit_tests; do
  ln -s "$build/$f" "$tmp/b/$f"
done
rm -f "$tmp/b/libtether_cuda.so"

set +e
out=$(tools/gpu-check --no-build --build-dir "$tmp/b" --summary "$tmp/s0" 2>&1)
rc=$?
set -e
[[ $rc == 1 ]] || fail "no module: exit $rc, expected 1: $out"
grep -q "the CUDA module was not built" "$tmp/s0" || fail "no module: summary $(cat "$tmp/s0")"

# A module file (this machine need not build the real one: only its
# presence is checked before the GPU).
if [[ -f $build/libtether_cuda.so ]]; then
  cp "$build/libtether_cuda.so" "$tmp/b/"
else
  printf 'not a real module' > "$tmp/b/libtether_cuda.so"
fi
out=$(tools/gpu-check --pack "$tmp/pack" --no-build --build-dir "$tmp/b" 2>&1) || fail "pack: $out"
echo "$out"
size=$(stat -c %s "$tmp/pack/gpu-check.tar.xz")
((size < 64 * 1048576)) || fail "pack is $size bytes"
listing=$(tar -tJf "$tmp/pack/gpu-check.tar.xz")
grep -q "lib/librocksdb" <<< "$listing" || fail "pack lacks librocksdb"
grep -q "data/train-images-idx3-ubyte.gz" <<< "$listing" || fail "pack lacks Fashion-MNIST"

# Without nvidia-smi on PATH, as on any machine without a GPU.
set +e
out=$(PATH=/usr/bin:/bin OUT="$tmp/out" tools/gpu-check --from "$tmp/pack" 2>&1)
rc=$?
set -e
echo "$out"
[[ $rc == 2 ]] || fail "from the pack, no GPU: exit $rc, expected 2"
grep -q "^module: /tmp/gpu-check-run/bin/libtether_cuda.so" "$tmp/out/gpu-check-summary.txt" ||
  fail "summary: $(cat "$tmp/out/gpu-check-summary.txt")"
grep -q "^gpu: none (no nvidia-smi on PATH)" "$tmp/out/gpu-check-summary.txt" ||
  fail "summary: $(cat "$tmp/out/gpu-check-summary.txt")"
# The unpacked binaries run on the pack's libraries.
LD_LIBRARY_PATH=/tmp/gpu-check-run/lib /tmp/gpu-check-run/bin/tether-worker --help > /dev/null ||
  fail "the packed tether-worker does not run"
LD_LIBRARY_PATH=/tmp/gpu-check-run/lib /tmp/gpu-check-run/bin/tests/tether_unit_tests \
  --gtest_filter='CudaBackend.RefusesBadLayersAndALastReluNamingThem' > "$tmp/unit.out" 2>&1 ||
  fail "the packed unit tests do not run: $(tail -5 "$tmp/unit.out")"
rm -rf /tmp/gpu-check-run
echo "gpu-check logic: OK"
