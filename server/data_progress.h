// What a checkpoint round keeps of shard 0's data assignment: the chunks
// completed (chunked handout) and each epoch's share plan (fixed shares),
// so that a resumed run -- on any number of workers -- goes on with the
// epoch where it was instead of starting it over. Stored as JSON in the
// round's record (RoundRecord::data).
//
// Pure functions; thread-safe.
#pragma once

#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "schema/status.h"
#include "server/chunk_pool.h"
#include "server/share_plan.h"

namespace tether {

struct DataProgress {
  std::optional<ChunkPool::Progress> chunks;    // none: no chunk asked for
  std::map<int, SharePlans::Plan> shares;       // by epoch
  std::vector<SharePlans::Leftover> leftovers;  // not yet taken
};

// Compact JSON text: completed chunks as ranges of indices per epoch.
std::string DataProgressToJson(const DataProgress& progress);
// kCorruption naming what does not parse.
Result<DataProgress> DataProgressFromJson(std::string_view text);

}  // namespace tether
