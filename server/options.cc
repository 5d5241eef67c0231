#include "server/options.h"

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <optional>

#include "schema/connection.h"
#include "server/settings_fields.h"

namespace tether {
namespace {

constexpr const char* kSummary =
    "One shard of a tether parameter server. Shard 0 is the coordinator:\n"
    "other shards and workers register with it, and it owns the run-wide\n"
    "settings (--workers, --max-staleness, --reject-staleness, --block-size,\n"
    "--seed and the optimizer flags), which other shards take from it.";

// A comma-separated list of directories into *dirs; kInvalidArgument
// naming `flag` for an empty one.
Status SplitDirs(const std::string& text, const std::string& flag,
                 std::vector<std::string>* dirs) {
  dirs->clear();
  size_t begin = 0;
  while (begin <= text.size()) {
    const size_t end = std::min(text.find(',', begin), text.size());
    if (end == begin) {
      return InvalidArgument(flag + ": empty directory in '" + text + "'");
    }
    dirs->push_back(text.substr(begin, end - begin));
    begin = end + 1;
  }
  return Status::Ok();
}

// Binds every flag to its field; shared by parsing and usage.
void Bind(FlagParser& p, ServerOptions& o) {
  p.AddInt("shard-id", &o.shard_id, "this shard's index, 0..shards-1");
  BindSettingFlags(p, &o.run, [](const SettingField&) { return true; });
  p.AddString("listen", &o.listen,
              "HOST:PORT to accept workers on (port 0: any free port)");
  p.AddString("advertise", &o.advertise,
              "HOST:PORT workers should dial (default: the listen address)");
  p.AddString("coordinator", &o.coordinator,
              "HOST:PORT of shard 0 (required for shards > 0)");
  p.AddString("data-dir", &o.data_dir,
              "directory for this shard's checkpoints");
  p.AddString("resume", &o.resume,
              "resume every shard from a complete round: latest or a round "
              "number (shard 0; other shards follow it)");
  p.AddCustom("reshard-from",
              "DIR[,DIR...]: the data dirs of every shard that wrote the "
              "round to resume, readable from this host (read-only); needed "
              "when it was written by another number of shards than "
              "--shards: each shard loads its part of it (any shard)",
              "", [&o](const std::string& text) {
                return SplitDirs(text, "--reshard-from", &o.reshard_from);
              });
  p.AddString("replay", &o.replay,
              "DIR: this shard's data dir in a run made with --record: take "
              "pushes and pulls in that run's order, so that it ends "
              "bit-identical (from the round given with --resume, if any)");
  p.AddInt("threads", &o.threads,
           "I/O threads, each serving its share of the connections");
  p.AddInt("spin-us", &o.spin_us,
           "after answering a worker that sends its requests back to back, "
           "poll its socket this long for the next one before sleeping: no "
           "wake-up per request, for up to this much CPU time per pause in "
           "its requests (plain TCP); 0: never");
  p.AddInt("apply-threads", &o.apply_threads,
           "threads that apply a push of a large tensor (512Ki floats or "
           "more) together, each a run of its blocks; 0: one per core");
  p.AddString("ready-file", &o.ready_file,
              "once listening (and, on shard 0, serving the dashboard), "
              "write this file whole (by rename): JSON with shard_id, "
              "listen, advertise, dashboard (null without one) and pid");
  p.AddUint64("max-frame-bytes", &o.max_frame_bytes,
              "largest frame accepted; longer ones close the connection");
  p.AddInt("connect-timeout-ms", &o.connect_timeout_ms,
           "how long a shard keeps trying to reach the coordinator");
  p.AddBool("verbose", &o.verbose, "log debug lines");
  p.AddBool("direct-memory", &o.direct_memory,
            "a worker on this host that offers it (tether-worker "
            "--direct-memory) has its f32 gradients read from its memory "
            "and its pulled weights written into it (process_vm_readv and "
            "process_vm_writev, once the shard has checked that the process "
            "holds the other end of the connection) instead of sent over "
            "TCP; false: everything over TCP");
  p.AddInt("handshake-timeout-ms", &o.handshake_timeout_ms,
           "a connection that has not sent its Hello this long is closed");
  p.AddInt("idle-timeout-ms", &o.idle_timeout_ms,
           "a connection that sends nothing this long is closed (workers "
           "send heartbeats); 0: never");
  p.AddInt("max-connections", &o.max_connections,
           "connections this shard serves at once; more are refused");
  p.AddUint64("max-keys", &o.max_keys,
              "sparse keys in one pull or push; more are refused");
  p.AddInt("max-waiting", &o.max_waiting,
           "pulls one connection may have held (waiting for the slowest "
           "worker) at once; more are refused");
  p.AddString("auth-key-file", &o.auth_key_file,
              "file holding the run's shared secret (at least 16 bytes); "
              "every shard, worker and tool of the run must use the same "
              "one; without it the shard listens on loopback only");
  p.AddBool("insecure", &o.insecure,
            "allow --listen on a non-loopback address without "
            "--auth-key-file (anyone who reaches it can join the run), and "
            "--http on one without --http-token-file (anyone who reaches "
            "it can read the run)");
  p.AddString("http-token-file", &o.dashboard.token_file,
              "file holding the dashboard's token, which POST endpoints "
              "(checkpoint now) require as 'Authorization: Bearer TOKEN'; "
              "created with a fresh token when missing; without it they "
              "are refused");
  p.AddString("http", &o.dashboard.http.listen,
              "HOST:PORT of the live dashboard (shard 0; port 0: any free "
              "port; off: no dashboard); a non-loopback address needs "
              "--http-token-file or --insecure");
  p.AddInt("http-max-clients", &o.dashboard.http.max_clients,
           "dashboard connections at once; more are answered 503");
  p.AddInt("http-max-clients-per-address",
           &o.dashboard.http.max_clients_per_address,
           "dashboard connections at once from one client address; more "
           "from it are answered 503 while other addresses are served");
  p.AddInt("http-timeout-ms", &o.dashboard.http.timeout_ms,
           "time to read one dashboard request or write one answer; a "
           "WebSocket client silent this long is dropped");
  p.AddUint64("http-header-limit", &o.dashboard.http.header_limit,
              "bytes of a dashboard request's headers (more: 431)");
  p.AddUint64("http-body-limit", &o.dashboard.http.body_limit,
              "bytes of a dashboard request's body (more: 413)");
  p.AddInt("ws-queue", &o.dashboard.http.ws_queue,
           "updates waiting for a WebSocket client before it is dropped");
  p.AddInt("dashboard-interval-ms", &o.dashboard.interval_ms,
           "between dashboard updates");
  p.AddString("health", &o.health,
              "HOST:PORT of an HTTP port answering only GET /healthz (the "
              "process is up) and /readyz (the shard serves the run), for "
              "Kubernetes probes; off: none (shard 0's dashboard answers "
              "both too)");
  BindTlsFlags(p, &o.tls);
  p.AddBool("check", &o.check,
            "check the flags (and TETHER_* variables), print what this "
            "shard would be and exit 0, starting nothing (2: a bad flag)");
}

// A FlagParser for tether-server: its flags, from argv or TETHER_<FLAG>.
FlagParser Parser(ServerOptions& o) {
  FlagParser p("tether-server", kSummary);
  p.UseEnvironment("TETHER_");
  Bind(p, o);
  return p;
}

Status Check(const ServerOptions& o, const FlagParser& p) {
  if (o.run.num_shards < 1)
    return InvalidArgument("--shards: must be at least 1");
  if (o.shard_id < 0 || o.shard_id >= o.run.num_shards) {
    return InvalidArgument("--shard-id: " + std::to_string(o.shard_id) +
                           " is not in 0.." +
                           std::to_string(o.run.num_shards - 1));
  }
  if (auto hp = ParseHostPort(o.listen, "--listen", true); !hp.ok()) {
    return hp.status();
  }
  if (!o.advertise.empty()) {
    if (auto hp = ParseHostPort(o.advertise, "--advertise"); !hp.ok()) {
      return hp.status();
    }
  }
  if (o.shard_id == 0 && !o.coordinator.empty()) {
    return InvalidArgument(
        "--coordinator: shard 0 is the coordinator and takes no --coordinator");
  }
  if (o.shard_id > 0) {
    if (o.coordinator.empty()) {
      return InvalidArgument("--coordinator: required for shard " +
                             std::to_string(o.shard_id));
    }
    if (auto hp = ParseHostPort(o.coordinator, "--coordinator"); !hp.ok()) {
      return hp.status();
    }
    for (const SettingField& f : kSettingFields) {
      if (!f.Has(kAnyShard) && p.WasSet(std::string(f.flag))) {
        return InvalidArgument("--" + std::string(f.flag) +
                               ": run-wide setting; give it to shard 0 only");
      }
    }
  }
  if (o.run.num_workers < 0) return InvalidArgument("--workers: must be >= 0");
  if (o.run.max_workers < 0 ||
      (o.run.max_workers > 0 && o.run.max_workers < o.run.num_workers)) {
    return InvalidArgument(
        "--max-workers: " + std::to_string(o.run.max_workers) +
        " must be 0 (no limit) or at least --workers (" +
        std::to_string(o.run.num_workers) + ")");
  }
  if (o.run.max_workers > kMaxRanks) {
    return InvalidArgument("--max-workers: at most " +
                           std::to_string(kMaxRanks));
  }
  if (o.run.max_staleness < -1) {
    return InvalidArgument("--max-staleness: must be >= -1");
  }
  if (o.run.reject_staleness < -1) {
    return InvalidArgument("--reject-staleness: must be >= -1");
  }
  if (o.run.block_size < 1)
    return InvalidArgument("--block-size: must be >= 1");
  if (o.run.worker_timeout_ms < 0) {
    return InvalidArgument("--worker-timeout-ms: must be >= 0");
  }
  if (o.run.heartbeat_ms < 10) {
    return InvalidArgument("--heartbeat-ms: must be >= 10");
  }
  if (o.run.worker_timeout_ms > 0 &&
      o.run.worker_timeout_ms < 2 * o.run.heartbeat_ms) {
    return InvalidArgument(
        "--worker-timeout-ms: must be at least twice --heartbeat-ms (" +
        std::to_string(o.run.heartbeat_ms) + ")");
  }
  if (o.run.backup_workers < 0 ||
      (o.run.num_workers > 0 && o.run.backup_workers >= o.run.num_workers)) {
    return InvalidArgument("--backup-workers: must be in 0..workers-1");
  }
  if (!(o.run.optimizer.lr > 0)) return InvalidArgument("--lr: must be > 0");
  if (o.run.checkpoint_every < 0) {
    return InvalidArgument("--checkpoint-every: must be >= 0");
  }
  if (o.run.keep_checkpoints < 1) {
    return InvalidArgument("--keep-checkpoints: must be >= 1");
  }
  if (!o.resume.empty() && o.resume != "latest") {
    char* end = nullptr;
    long long round = std::strtoll(o.resume.c_str(), &end, 10);
    if (*end != '\0' || round < 0) {
      return InvalidArgument(
          "--resume: expected latest or a round number, "
          "got '" +
          o.resume + "'");
    }
  }
  if (o.shard_id == 0 && !o.reshard_from.empty() && o.resume.empty()) {
    return InvalidArgument(
        "--reshard-from: only with --resume (the round it reads is the one "
        "resumed)");
  }
  if (o.run.record && o.data_dir.empty()) {
    return InvalidArgument(
        "--data-dir: required with --record (the recording goes there)");
  }
  if (!o.replay.empty() && !o.data_dir.empty()) {
    std::error_code ec;
    if (std::filesystem::equivalent(o.replay, o.data_dir, ec)) {
      return InvalidArgument(
          "--replay " + o.replay +
          ": give another --data-dir: a replay must not write over the "
          "recorded run's checkpoints");
    }
  }
  if (!o.reshard_from.empty() && o.data_dir.empty()) {
    return InvalidArgument(
        "--data-dir: required with --reshard-from (the new rounds go there)");
  }
  if ((o.run.checkpoint_every > 0 || !o.resume.empty()) && o.data_dir.empty() &&
      o.shard_id == 0) {
    return InvalidArgument(
        "--data-dir: required with --checkpoint-every or --resume");
  }
  if (o.threads < 1 || o.threads > 256) {
    return InvalidArgument("--threads: must be in 1..256");
  }
  if (o.spin_us < 0 || o.spin_us > 10000) {
    return InvalidArgument("--spin-us: must be in 0..10000");
  }
  if (o.apply_threads < 0 || o.apply_threads > 256) {
    return InvalidArgument(
        "--apply-threads: must be in 0..256 (0: one per core)");
  }
  if (o.max_frame_bytes < 1024 || o.max_frame_bytes > (uint64_t{1} << 31)) {
    return InvalidArgument("--max-frame-bytes: must be in 1024..2^31");
  }
  if (o.dashboard.http.listen != "off") {
    if (auto hp = ParseHostPort(o.dashboard.http.listen, "--http", true);
        !hp.ok()) {
      return InvalidArgument(hp.status().message() + " (or off)");
    }
  }
  if (o.dashboard.http.max_clients < 1) {
    return InvalidArgument("--http-max-clients: must be >= 1");
  }
  if (o.dashboard.http.max_clients_per_address < 1) {
    return InvalidArgument("--http-max-clients-per-address: must be >= 1");
  }
  if (o.dashboard.http.timeout_ms < 100) {
    return InvalidArgument("--http-timeout-ms: must be >= 100");
  }
  if (o.dashboard.http.header_limit < 256 ||
      o.dashboard.http.header_limit > (1u << 20)) {
    return InvalidArgument("--http-header-limit: must be in 256..1048576");
  }
  if (o.dashboard.http.ws_queue < 1) {
    return InvalidArgument("--ws-queue: must be >= 1");
  }
  if (o.dashboard.interval_ms < 10 || o.dashboard.interval_ms > 60000) {
    return InvalidArgument("--dashboard-interval-ms: must be in 10..60000");
  }
  if (o.handshake_timeout_ms < 100) {
    return InvalidArgument("--handshake-timeout-ms: must be >= 100");
  }
  if (o.idle_timeout_ms < 0 ||
      (o.idle_timeout_ms > 0 && o.idle_timeout_ms < 2 * o.run.heartbeat_ms)) {
    return InvalidArgument(
        "--idle-timeout-ms: must be 0 or at least twice --heartbeat-ms");
  }
  if (o.max_connections < 1) {
    return InvalidArgument("--max-connections: must be >= 1");
  }
  if (o.max_keys < 1) return InvalidArgument("--max-keys: must be >= 1");
  if (o.max_waiting < 1) return InvalidArgument("--max-waiting: must be >= 1");
  if (o.connect_timeout_ms < 0) {
    return InvalidArgument("--connect-timeout-ms: must be >= 0");
  }
  if (o.health != "off") {
    if (auto hp = ParseHostPort(o.health, "--health", true); !hp.ok()) {
      return InvalidArgument(hp.status().message() + " (or off)");
    }
  }
  return CheckTlsOptions(o.tls);
}

// Listening beyond loopback is a choice the operator states: a shard's
// --listen needs --auth-key-file and shard 0's --http needs
// --http-token-file, or --insecure. Why an address that is not loopback is
// refused (OK when `loopback`, or allowed).
Status ListenExposure(const ServerOptions& o, bool loopback) {
  if (loopback || !o.auth_key_file.empty() || o.insecure) return Status::Ok();
  return InvalidArgument(
      "--listen " + o.listen +
      " is not a loopback address: give --auth-key-file (the run's shared "
      "key), or --insecure to let anyone who reaches it join the run");
}

Status DashboardExposure(const DashboardOptions& d, bool loopback) {
  if (loopback || !d.token_file.empty() || d.insecure) return Status::Ok();
  return InvalidArgument(
      "--http " + d.http.listen +
      " is not a loopback address: give --http-token-file (the "
      "dashboard's token), or --insecure to let anyone who reaches it "
      "read the run");
}

// Whether `host` names a loopback address; nullopt for a name that does
// not resolve (Listen says so at start).
std::optional<bool> IsLoopback(const std::string& host) {
  auto address = ResolveAddress(host);
  if (!address) return std::nullopt;
  return address->is_loopback();
}

// The exposure rules on the addresses the flags name.
Status CheckExposure(const ServerOptions& o) {
  auto listen = ParseHostPort(o.listen, "--listen", true);
  if (auto loopback = IsLoopback(listen->host)) {
    TETHER_RETURN_IF_ERROR(ListenExposure(o, *loopback));
  }
  if (o.shard_id == 0 && o.http_enabled) {
    auto http = ParseHostPort(o.dashboard.http.listen, "--http", true);
    if (auto loopback = IsLoopback(http->host)) {
      TETHER_RETURN_IF_ERROR(DashboardExposure(o.dashboard, *loopback));
    }
  }
  return Status::Ok();
}

}  // namespace

std::string ServerUsage() {
  ServerOptions o;
  return Parser(o).Usage();
}

std::string DescribeServerOptions(const ServerOptions& o) {
  std::string line = "shard " + std::to_string(o.shard_id) + " of " +
                     std::to_string(o.run.num_shards) + ", listening on " +
                     o.listen;
  if (!o.advertise.empty()) line += ", advertised as " + o.advertise;
  if (o.shard_id == 0) {
    line += ", the coordinator of " + std::to_string(o.run.num_workers) +
            " worker(s)";
    line += ", dashboard " +
            (o.http_enabled ? o.dashboard.http.listen : std::string("off"));
  } else {
    line += ", coordinator " + o.coordinator;
  }
  if (o.health != "off") line += ", health " + o.health;
  if (!o.data_dir.empty()) line += ", checkpoints in " + o.data_dir;
  if (!o.resume.empty()) line += ", resuming " + o.resume;
  if (o.run.record) line += ", recording its order";
  if (!o.replay.empty()) line += ", replaying " + o.replay;
  if (!o.reshard_from.empty()) {
    line += " (resharding from " + std::to_string(o.reshard_from.size()) +
            " data dir(s) if need be)";
  }
  line += o.tls.enabled() ? ", TLS" : ", plain TCP";
  if (!o.auth_key_file.empty()) line += ", key " + o.auth_key_file;
  return line;
}

Result<ServerOptions> ParseServerOptions(int argc, const char* const* argv,
                                         bool* help) {
  ServerOptions o;
  FlagParser p = Parser(o);
  TETHER_RETURN_IF_ERROR(p.Parse(argc, argv));
  *help = p.help_requested();
  if (*help) return o;
  if (!p.positional().empty()) {
    return InvalidArgument("unexpected argument '" + p.positional().front() +
                           "' (flags start with --)");
  }
  TETHER_RETURN_IF_ERROR(Check(o, p));
  for (const SettingField& f : kSettingFields) {
    const std::string flag(f.flag);
    if (!flag.empty() && p.WasSet(flag)) o.given.insert(flag);
  }
  o.http_enabled = o.dashboard.http.listen != "off";
  o.dashboard.insecure = o.insecure;
  o.dashboard.http.tls = o.tls;
  TETHER_RETURN_IF_ERROR(CheckExposure(o));
  return o;
}

}  // namespace tether
