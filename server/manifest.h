// The run manifest: everything that determines a run, in one JSON object
// that shard 0 keeps up to date as processes join. It holds the run-wide
// settings, the tether build shard 0 runs, and each shard's and worker's
// own part (its Hello's manifest: settings, data files with their SHA-256,
// host, version, commit, argv) with its command line:
//   {"format": 1, "tether": {"version", "commit"}, "run": {settings},
//    "shards": [{"shard_id", "command", ...its part} or null, ...],
//    "workers": [{"rank", "command", ...its part} or null, ...]}
// It is written to shard 0's DATA_DIR/manifest.json when it changes, kept
// in every checkpoint round, shown on the dashboard (web/API.md) and by
// `tether-ckpt show`, and `tether-up --manifest FILE` starts a run from it.
//
// Thread-safe.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "schema/mutex.h"
#include "server/run_settings.h"

namespace tether {

// The manifest's "format".
inline constexpr int kManifestFormat = 1;

// A tether-server's own part: {"program": "tether-server", "version",
// "commit", "host", "argv": [...]}.
std::string ShardManifest(const std::vector<std::string>& argv);

class RunManifest {
 public:
  explicit RunManifest(RunSettings settings);

  // A process's part (JSON object text; "" or not an object: only the
  // command is kept) and its shell-quoted command line.
  void SetShard(int shard_id, const std::string& part,
                const std::string& command) TETHER_EXCLUDES(mu_);
  void SetWorker(int rank, const std::string& part, const std::string& command)
      TETHER_EXCLUDES(mu_);
  // Called with the whole manifest now and whenever it changes, one call
  // at a time.
  void OnChange(std::function<void(const std::string&)> changed)
      TETHER_EXCLUDES(mu_, publish_mu_);

  // The whole manifest, as JSON text.
  std::string Json() const TETHER_EXCLUDES(mu_);

 private:
  struct Entry {
    std::string part;
    std::string command;
    bool known = false;
  };
  // Into shards_ (`shard`) or workers_.
  void Set(bool shard, int index, const std::string& part,
           const std::string& command) TETHER_EXCLUDES(mu_);
  // Hands the manifest as it is now to the OnChange callback; one at a
  // time, so a later state is never overtaken by an earlier one.
  void Publish() TETHER_EXCLUDES(mu_, publish_mu_);
  std::string JsonLocked() const TETHER_REQUIRES(mu_);

  const RunSettings settings_;
  Mutex publish_mu_;  // taken before mu_
  mutable Mutex mu_;
  std::vector<Entry> shards_ TETHER_GUARDED_BY(mu_);
  std::vector<Entry> workers_ TETHER_GUARDED_BY(mu_);
  std::function<void(const std::string&)> changed_ TETHER_GUARDED_BY(mu_);
};

}  // namespace tether
