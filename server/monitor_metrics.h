// GET /metrics: the Monitor's state in the Prometheus text exposition
// format, version 0.0.4 (tether_* families: uptime, workers, staleness,
// shards, checkpoints, data chunks, the dashboard's clients).
//
// A pure function of `state` and `now`: not thread-safe on its own; the
// Monitor calls it with its mutex held.
#pragma once

#include <string>

#include "server/monitor_state.h"

namespace tether {

std::string MetricsText(const MonitorState& state, MonitorState::TimePoint now);

}  // namespace tether
