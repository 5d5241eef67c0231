#include "server/run_settings.h"

#include <algorithm>
#include <cstdio>
#include <random>
#include <sstream>

namespace tether {

RunSettings SettingsFromOptions(const ServerOptions& options) {
  RunSettings s;
  s.seed = options.seed;
  s.num_shards = options.shards;
  s.num_workers = options.workers;
  s.max_staleness = options.max_staleness;
  s.reject_staleness = options.reject_staleness;
  s.block_size = static_cast<uint32_t>(options.block_size);
  s.checkpoint_every = options.checkpoint_every;
  s.optimizer = options.optimizer;
  s.worker_timeout_ms = options.worker_timeout_ms;
  s.heartbeat_ms = options.heartbeat_ms;
  s.backup_workers = options.backup_workers;
  s.staleness_lr = options.staleness_lr;
  s.keep_checkpoints = options.keep_checkpoints;
  return s;
}

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

std::string SettingsMismatch(const RunSettings& a, const RunSettings& b) {
  auto differs = [](const char* flag, auto x, auto y) {
    std::ostringstream out;
    out << flag << " " << x << " in the round, " << y << " now";
    return out.str();
  };
  if (a.num_shards != b.num_shards) {
    return differs("--shards", a.num_shards, b.num_shards);
  }
  if (a.num_workers != b.num_workers) {
    return differs("--workers", a.num_workers, b.num_workers);
  }
  if (a.seed != b.seed) return differs("--seed", a.seed, b.seed);
  if (a.block_size != b.block_size) {
    return differs("--block-size", a.block_size, b.block_size);
  }
  if (a.optimizer.kind != b.optimizer.kind) {
    return differs("--optimizer", OptimizerName(a.optimizer.kind),
                   OptimizerName(b.optimizer.kind));
  }
  return "";
}

int EffectiveStaleness(int requested, int max_staleness) {
  if (max_staleness < 0) return requested < 0 ? -1 : requested;
  if (requested < 0) return max_staleness;
  return std::min(requested, max_staleness);
}

}  // namespace tether
