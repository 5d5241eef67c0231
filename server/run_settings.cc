#include "server/run_settings.h"

#include <algorithm>
#include <cstdio>
#include <random>
#include <type_traits>

#include "schema/flags.h"
#include "server/settings_fields.h"

namespace tether {

std::string NewRunId() {
  std::random_device random;
  std::string id;
  for (int i = 0; i < 4; ++i) {
    char part[9];
    std::snprintf(part, sizeof(part), "%08x", random());
    id += part;
  }
  return id;
}

flatbuffers::Offset<wire::RunConfig> WriteRunConfig(
    flatbuffers::FlatBufferBuilder& fbb, const RunSettings& s) {
  auto optimizer = fbb.CreateString(OptimizerName(s.optimizer.kind));
  auto run_id = fbb.CreateString(s.run_id);
  return wire::CreateRunConfig(
      fbb, s.seed, s.num_shards, s.num_workers, s.max_staleness,
      s.reject_staleness, s.block_size, s.checkpoint_every, s.resume_round,
      optimizer, s.optimizer.lr, s.optimizer.momentum, s.optimizer.beta1,
      s.optimizer.beta2, s.optimizer.epsilon, s.worker_timeout_ms,
      s.backup_workers, s.staleness_lr, s.heartbeat_ms, s.shard_restart, run_id,
      s.keep_checkpoints);
}

Result<RunSettings> ReadRunConfig(const wire::RunConfig* config) {
  if (config == nullptr || config->optimizer() == nullptr) {
    return BadFrame("Welcome carries no run configuration");
  }
  RunSettings s;
  s.seed = config->seed();
  s.num_shards = config->num_shards();
  s.num_workers = config->num_workers();
  s.max_staleness = config->max_staleness();
  s.reject_staleness = config->reject_staleness();
  s.block_size = config->block_size();
  s.checkpoint_every = config->checkpoint_every();
  s.resume_round = config->resume_round();
  auto kind = ParseOptimizerKind(config->optimizer()->str());
  if (!kind.ok()) return BadFrame(kind.status().message());
  s.optimizer.kind = *kind;
  s.optimizer.lr = config->lr();
  s.optimizer.momentum = config->momentum();
  s.optimizer.beta1 = config->beta1();
  s.optimizer.beta2 = config->beta2();
  s.optimizer.epsilon = config->epsilon();
  s.worker_timeout_ms = config->worker_timeout_ms();
  s.heartbeat_ms = config->heartbeat_ms();
  s.backup_workers = config->backup_workers();
  s.staleness_lr = config->staleness_lr();
  s.shard_restart = config->shard_restart();
  s.run_id = config->run_id() ? config->run_id()->str() : "";
  s.keep_checkpoints = config->keep_checkpoints();
  if (s.num_shards < 1 || s.num_workers < 0 || s.block_size < 1 ||
      s.worker_timeout_ms < 0 || s.heartbeat_ms < 1 || s.backup_workers < 0 ||
      s.keep_checkpoints < 1) {
    return BadFrame("run configuration out of range");
  }
  return s;
}

OutFrame MakeWelcomeFrame(const RunSettings& settings, int shard_id, int rank,
                          int staleness, int64_t clock,
                          const std::vector<std::string>& shard_addresses) {
  flatbuffers::FlatBufferBuilder fbb(1024);
  auto config = WriteRunConfig(fbb, settings);
  flatbuffers::Offset<wire::ShardMap> map;
  if (!shard_addresses.empty()) {
    std::vector<flatbuffers::Offset<wire::ShardInfo>> shards;
    shards.reserve(shard_addresses.size());
    for (size_t i = 0; i < shard_addresses.size(); ++i) {
      shards.push_back(wire::CreateShardInfo(
          fbb, static_cast<int>(i), fbb.CreateString(shard_addresses[i])));
    }
    map = wire::CreateShardMap(fbb, fbb.CreateVector(shards));
  }
  wire::WelcomeBuilder b(fbb);
  b.add_rank(rank);
  b.add_clock(clock);
  b.add_staleness(staleness);
  b.add_shard_id(shard_id);
  b.add_config(config);
  if (!map.IsNull()) b.add_shard_map(map);
  return FinishFrame(fbb, b.Finish());
}

namespace {

// A setting as messages say it: SettingText's, but a bool on or off.
template <typename T>
std::string Said(const T& v) {
  if constexpr (std::is_same_v<T, bool>) {
    return v ? "on" : "off";
  } else {
    return SettingText(v);
  }
}

// Merges one setting into a resumed run's: the round's value unless the
// flag was given; a given identity flag that differs is an error.
class ResumeMerge {
 public:
  ResumeMerge(const std::set<std::string>& given,
              std::vector<std::string>* overridden)
      : given_(given), overridden_(overridden) {}

  template <typename T>
  void operator()(const std::string& flag, bool identity, const T& now,
                  T* value) {
    if (!error_.empty() || given_.count(flag) == 0 || now == *value) return;
    const std::string differs = "--" + flag + " " + Said(*value) +
                                " in the round, " + Said(now) + " now";
    if (identity) {
      error_ = differs + ": a resumed run keeps it; leave --" + flag +
               " out to take the round's";
      return;
    }
    if (overridden_ != nullptr) {
      overridden_->push_back("--" + flag + " " + Said(now) + " now (" +
                             Said(*value) + " in the round)");
    }
    *value = now;
  }

  const std::string& error() const { return error_; }

 private:
  const std::set<std::string>& given_;
  std::vector<std::string>* overridden_;
  std::string error_;
};

}  // namespace

std::string SettingsMismatch(const RunSettings& a, const RunSettings& b) {
  std::string out;
  ForEachSettingPair(
      a, b, [&out](const SettingField& field, const auto& x, const auto& y) {
        if (!out.empty() || !field.Has(kIdentity) || x == y) return;
        out = "--" + std::string(field.flag) + " " + Said(x) +
              " in the round, " + Said(y) + " now";
      });
  return out;
}

Result<RunSettings> ResumedSettings(const RunSettings& round,
                                    const RunSettings& flags,
                                    const std::set<std::string>& given,
                                    std::vector<std::string>* overridden) {
  RunSettings s = round;
  s.shard_restart = false;
  ResumeMerge merge(given, overridden);
  ForEachSettingPair(
      flags, s,
      [&merge](const SettingField& field, const auto& now, auto& value) {
        if (field.flag.empty()) return;
        merge(std::string(field.flag), field.Has(kIdentity), now, &value);
      });
  if (!merge.error().empty()) return InvalidArgument(merge.error());
  if (s.backup_workers >= s.num_workers && s.num_workers > 0) {
    return InvalidArgument(
        "--backup-workers: " + std::to_string(s.backup_workers) +
        " is not below the round's " + std::to_string(s.num_workers) +
        " workers");
  }
  return s;
}

int EffectiveStaleness(int requested, int max_staleness) {
  if (max_staleness < 0) return requested < 0 ? -1 : requested;
  if (requested < 0) return max_staleness;
  return std::min(requested, max_staleness);
}

}  // namespace tether
