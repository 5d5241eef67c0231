# Shared by the shell tests (source it).
#   stop_pids PID...   SIGTERM to each, up to 2 s for each to exit, then
#                      SIGKILL; waits for them (those this shell started)
stop_pids() {
  local p
  for p in "$@"; do kill -TERM "$p" 2> /dev/null || true; done
  for p in "$@"; do
    for _ in $(seq 20); do kill -0 "$p" 2> /dev/null || break; sleep 0.1; done
    kill -KILL "$p" 2> /dev/null || true
    wait "$p" 2> /dev/null || true
  done
}
