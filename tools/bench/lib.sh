# Shared by the benchmark scripts in tools/bench/ (source it):
#   bench_setup              a work dir in $work, removed on exit with every
#                            process whose pid is added to pids
#   port_of LOG              waits for "listening on HOST:PORT" in LOG and
#                            prints PORT (fails the script after 5 s)
#   median V...              the median of the values
bench_setup() {
  work=$(mktemp -d /tmp/tether-bench-XXXXXX)
  pids=()
  trap 'kill "${pids[@]}" 2> /dev/null || true; wait 2> /dev/null || true; rm -rf "$work"' EXIT
}

port_of() {
  local line
  for _ in $(seq 100); do
    line=$(grep -m1 -o 'listening on [^ ]*' "$1" 2> /dev/null || true)
    [[ -n $line ]] && { echo "${line##*:}"; return; }
    sleep 0.05
  done
  echo "no listening line in $1" >&2
  cat "$1" >&2
  exit 1
}

median() { printf '%s\n' "$@" | sort -g | awk '{v[NR] = $1} END {print v[int((NR + 1) / 2)]}'; }
