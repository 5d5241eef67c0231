// What both built-in trainers do around one step: time it, make a
// straggler of it (--slowdown), stop on a diverged loss, and go on past a
// push the shards refused.
#pragma once

#include <chrono>
#include <cstdint>

#include "schema/status.h"
#include "worker/client.h"

namespace tether {

// Seconds on the steady clock since `since`.
double SecondsSince(std::chrono::steady_clock::time_point since);

// Sleeps so that a step that computed for `compute_s` takes `slowdown`
// times as long: a straggler in proportion to its real work. Returns at
// once for slowdown <= 1.
void SlowDown(double slowdown, double compute_s);

// Ok for a finite training loss. A NaN or Inf loss means the model
// diverged: nothing it would push can help, so the trainer stops
// (kNonFinite, naming the clock and `epoch`) before pushing.
Status CheckLoss(float loss, const Client& client, int epoch);

// A push a shard refused as too stale (kStalePush, --reject-staleness) or
// as holding NaN or Inf (kNonFinite) costs that gradient only: returns Ok,
// counts it in `*rejected` and logs every hundredth. Any other status is
// returned as it is.
Status ToleratingRefused(Status pushed, const Client& client,
                         uint64_t* rejected);

}  // namespace tether
