// Training through a lost shard connection: a restarted shard, a cut
// network, or this worker stopped (SIGSTOP) past the run's
// --worker-timeout-ms, after which the client drops the silent connection
// and dials it again. The step in flight fails with kUnavailable; it is
// repeated once every shard is connected again. Shared by tether-worker's
// trainer and `tether-client train`.
#pragma once

#include "schema/log.h"
#include "schema/status.h"
#include "worker/client.h"

namespace tether {

// Runs `step` (a callable returning Status); when a shard was lost
// (kUnavailable), waits for `client` to reconnect and runs it again, so a
// lost shard costs only the step in flight. Returns the step's Status, or
// the error naming a shard that did not come back within 180 s (or was
// given up), or kCancelled with the reason once the run was stopped (POST
// /api/stop), checked before each try.
template <typename Step>
Status SurvivingLostShards(Client& client, Step step) {
  while (true) {
    if (client.stop_requested()) {
      return Status(Code::kCancelled, client.stop_reason());
    }
    const uint64_t lost_before = client.shard_losses();
    Status s = step();
    // Only a lost shard is waited for; other refusals stand.
    if (s.code() != Code::kUnavailable) return s;
    if (client.shard_losses() == lost_before && client.AwaitShards(0).ok()) {
      return s;  // every shard is connected: not a lost one
    }
    TETHER_LOG(kWarning) << s.message() << "; the step is repeated once "
                         << "the shard is back";
    TETHER_RETURN_IF_ERROR(client.AwaitShards(180000));
  }
}

}  // namespace tether
