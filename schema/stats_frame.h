// ShardStats (schema/stats.h) on the wire: the Stats frame a shard answers
// a Stats request with, and the one shards send the coordinator.
#pragma once

#include <cstdint>

#include "schema/frame.h"
#include "schema/stats.h"

namespace tether {

// The Stats frame answering request `request_id` (0: unsolicited, as shards
// send to the coordinator).
OutFrame MakeStatsFrame(uint64_t request_id, const ShardStats& stats);
ShardStats ReadStats(const wire::Stats& stats);

}  // namespace tether
