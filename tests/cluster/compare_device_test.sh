#!/usr/bin/env bash
# tether-worker --compare-device, the check a GPU worker gets in
# tools/gpu-check, run here against the CPU itself: on a trained run's
# weights, one step's loss and gradients and the test evaluation through
# --device and through the CPU backend; identical for cpu, so it must say OK
# and exit 0. --device cuda on a machine without one exits 1 saying why.
#   tests/cluster/compare_device_test.sh BUILD_DIR
set -euo pipefail
build=$(cd "$1" && pwd)
tmp=$(mktemp -d /tmp/tether-compare-device-test-XXXXXX)
shard=""
trap '[[ -n $shard ]] && kill "$shard" 2> /dev/null; rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }
"$build/tether-server" --listen 127.0.0.1:0 --http off --workers 1 \
  --optimizer adam --lr 0.001 > "$tmp/shard.log" 2>&1 &
shard=$!
for _ in $(seq 100); do
  port=$(grep -o 'listening on [^ ]*' "$tmp/shard.log" | head -1 | sed 's/.*://' || true)
  [[ -n $port ]] && break
  sleep 0.05
done
[[ -n $port ]] || fail "the shard did not start: $(cat "$tmp/shard.log")"
"$build/tether-worker" --coordinator "127.0.0.1:$port" --model mlp --hidden 32 \
  --epochs 1 --batch 256 --eval-every 0 --quiet > "$tmp/train.log" 2>&1 ||
  fail "training: $(tail -3 "$tmp/train.log")"
out=$("$build/tether-worker" --coordinator "127.0.0.1:$port" --model mlp --hidden 32 \
  --batch 256 --compare-device --device cpu 2>&1) || fail "compare cpu with cpu: $out"
echo "$out"
grep -q "one step on 256 training rows: .*largest gradient difference 0 .*: OK" <<< "$out" ||
  fail "no OK step line"
grep -q "test set of 10000 rows: accuracy .*: OK" <<< "$out" || fail "no OK test line"
if out=$("$build/tether-worker" --coordinator "127.0.0.1:$port" --model mlp --hidden 32 \
  --compare-device --device cuda:7 2>&1); then
  if ! grep -q "cuda:7 (" <<< "$out"; then fail "--device cuda:7 succeeded without a GPU: $out"; fi
else
  grep -q -- "--device cuda:7: " <<< "$out" || fail "no reason given: $out"
fi
echo "compare-device: OK"
