#include "server/run_settings.h"

#include <algorithm>

namespace tether {

RunSettings SettingsFromOptions(const ServerOptions& options) {
  RunSettings s;
  s.seed = options.seed;
  s.num_shards = options.shards;
  s.num_workers = options.workers;
  s.max_staleness = options.max_staleness;
  s.reject_staleness = options.reject_staleness;
  s.block_size = static_cast<uint32_t>(options.block_size);
  s.optimizer = options.optimizer;
  return s;
}

flatbuffers::Offset<wire::RunConfig> WriteRunConfig(
    flatbuffers::FlatBufferBuilder& fbb, const RunSettings& s) {
  auto optimizer = fbb.CreateString(OptimizerName(s.optimizer.kind));
  return wire::CreateRunConfig(fbb, s.seed, s.num_shards, s.num_workers,
                               s.max_staleness, s.reject_staleness,
                               s.block_size, optimizer, s.optimizer.lr,
                               s.optimizer.momentum, s.optimizer.beta1,
                               s.optimizer.beta2, s.optimizer.epsilon);
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
  auto kind = ParseOptimizerKind(config->optimizer()->str());
  if (!kind.ok()) return BadFrame(kind.status().message());
  s.optimizer.kind = *kind;
  s.optimizer.lr = config->lr();
  s.optimizer.momentum = config->momentum();
  s.optimizer.beta1 = config->beta1();
  s.optimizer.beta2 = config->beta2();
  s.optimizer.epsilon = config->epsilon();
  if (s.num_shards < 1 || s.num_workers < 0 || s.block_size < 1) {
    return BadFrame("run configuration out of range");
  }
  return s;
}

int EffectiveStaleness(int requested, int max_staleness) {
  if (max_staleness < 0) return requested < 0 ? -1 : requested;
  if (requested < 0) return max_staleness;
  return std::min(requested, max_staleness);
}

}  // namespace tether
