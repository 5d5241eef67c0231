// tether-server's options: one struct with documented defaults, filled from
// command-line flags by ParseServerOptions.
#pragma once

#include <cstdint>
#include <set>
#include <string>
#include <vector>

#include "schema/flags.h"
#include "schema/status.h"
#include "schema/tls.h"
#include "server/http_options.h"
#include "server/optimizer.h"
#include "server/run_settings.h"

namespace tether {

struct ServerOptions {
  int shard_id = 0;                       // --shard-id: 0 is the coordinator
  std::string listen = "127.0.0.1:7070";  // --listen: port 0 picks a free one
  std::string advertise;                  // --advertise: address workers dial
  std::string coordinator;                // --coordinator: shard 0 (shards > 0)
  std::string data_dir;                   // --data-dir: checkpoints
  // The run-wide settings (run_id empty): --shards, --workers, --seed, the
  // optimizer flags, ... (server/settings_fields.h). Other shards take all
  // but --shards from the coordinator.
  RunSettings run;
  std::string resume;  // --resume: latest or a round number
  // --reshard-from DIR[,DIR...]: the data dirs of every shard that wrote
  // the round to resume, readable here (read-only). Needed when that round
  // was written by another number of shards than --shards: each shard then
  // loads its part of the merged round; so does a shard whose --data-dir
  // holds no slice of it. Ignored (said in the log) when the counts agree
  // and the shard holds its slice. Empty: none.
  std::vector<std::string> reshard_from;
  // --replay DIR: the data dir of this shard in a run made with --record;
  // the shard takes pushes and pulls in that run's order (from the round
  // resumed, with --resume). Empty: none.
  std::string replay;
  int threads = 2;  // --threads: I/O threads
  // --spin-us: how long a connection polls for a quick peer's next
  // request (ConnectionOptions::spin_us).
  int spin_us = 0;
  // --apply-threads: threads that apply a push of a large tensor (at least
  // ParamStore::kParallelApplyFloats floats) together; 0: one per core.
  int apply_threads = 0;
  // --ready-file: once listening (and the dashboard serving), this JSON
  // file is written whole (README, "tether-server flags"); empty: none.
  std::string ready_file;
  uint64_t max_frame_bytes = uint64_t{64} << 20;  // --max-frame-bytes
  int connect_timeout_ms = 10000;                 // --connect-timeout-ms
  int handshake_timeout_ms = 10000;       // --handshake-timeout-ms: for Hello
  int idle_timeout_ms = 60000;            // --idle-timeout-ms: 0 never
  int max_connections = 1024;             // --max-connections
  uint64_t max_keys = uint64_t{1} << 20;  // --max-keys: per request
  int max_waiting = 4096;  // --max-waiting: held pulls per connection
  bool verbose = false;    // --verbose: debug logging
  // --direct-memory: a worker on this host that offers it has its pushes
  // read from its memory and its pulls written into it
  // (server/direct_read.h); false: all over TCP.
  bool direct_memory = true;
  // --auth-key-file: the run's shared key (schema/auth.h). Without one the
  // shard listens on loopback only, unless --insecure.
  std::string auth_key_file;
  bool insecure = false;  // --insecure: no key, any address
  // Shard 0's dashboard: --http (off: none), --http-max-clients,
  // --http-max-clients-per-address, --http-timeout-ms, --http-header-limit,
  // --http-body-limit, --ws-queue, --dashboard-interval-ms; its `insecure`
  // is --insecure too.
  bool http_enabled = true;
  DashboardOptions dashboard;
  // --health: HOST:PORT of an HTTP port that answers only GET /healthz and
  // /readyz (for a cluster engine's probes); "off": none. Shard 0's
  // dashboard answers both too.
  std::string health = "off";
  // --tls-cert, --tls-key, --tls-ca: TLS on every shard connection and
  // HTTPS for the dashboard (schema/tls.h); copied into dashboard.http.tls.
  TlsOptions tls;
  // --check: parse and check the flags, say so, start nothing.
  bool check = false;
  // Not a flag: the command line it was started with (argv[0] first), set
  // by main(), for the dashboard's list of the run's processes; empty when
  // not started from one (tests).
  std::vector<std::string> argv;
  // The run-wide flags given on the command line (names without "--"): a
  // resumed run takes the others from its round.
  std::set<std::string> given;
};

// The usage text (every flag, its meaning and default).
std::string ServerUsage();

// The line --check prints for options that passed: what this process
// would be ("shard 1 of 2, listening on 0.0.0.0:7070, ...").
std::string DescribeServerOptions(const ServerOptions& options);

// Parses argv, and TETHER_<FLAG> environment variables for flags argv does
// not give, into options and checks them (no file is opened). Returns
// kInvalidArgument with a message naming the flag (or variable). Sets
// *help when --help was given.
Result<ServerOptions> ParseServerOptions(int argc, const char* const* argv,
                                         bool* help);

}  // namespace tether
