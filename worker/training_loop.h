// The robustness every training loop needs, shared by tether-worker's
// trainer and `tether-client train`:
// - a lost shard connection (a restarted shard, a cut network, or this
//   worker stopped with SIGSTOP past the run's --worker-timeout-ms, after
//   which the client drops the silent connection and dials it again): the
//   step in flight fails with kUnavailable and is repeated once every shard
//   is connected again;
// - a stopped run (POST /api/stop): training ends like finished epochs.
#pragma once

#include "schema/log.h"
#include "schema/status.h"
#include "worker/client.h"

namespace tether {

// The run was stopped (POST /api/stop): training ends after this step.
inline Status Stopped(const Client& client) {
  return Status(Code::kCancelled, client.stop_reason());
}

// Training's outcome: a stopped run (kCancelled) ends training like
// finished epochs -- logged, and OK.
inline Status EndOfTraining(const Client& client, Status trained) {
  if (trained.code() != Code::kCancelled) return trained;
  TETHER_LOG(kWarning) << "stopping at clock " << client.clock() << ": "
                       << trained.message();
  return Status::Ok();
}

// Runs `step` (a callable returning Status); when a shard was lost
// (kUnavailable), waits for `client` to reconnect and runs it again, so a
// lost shard costs only the step in flight. Returns the step's Status, or
// the error naming a shard that did not come back within 180 s (or was
// given up), or kCancelled with the reason once the run was stopped (POST
// /api/stop), checked before each try.
template <typename Step>
Status SurvivingLostShards(Client& client, Step step) {
  while (true) {
    if (client.stop_requested()) return Stopped(client);
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
