// tether-worker's signals. SIGTERM or SIGINT ask the training to end after
// its current step, as a stopped run does, so the worker leaves the run
// (Client::Leave: shard 0 stops counting it at once) and exits 0. A second
// one, or one that comes while no client is connected, ends the process at
// once, killed by that signal (a shell's status 128 + the signal).
#pragma once

#include "worker/client.h"

namespace tether {

// Blocks SIGTERM and SIGINT in this thread and every thread it starts from
// now on, and starts the thread that waits for them. Call first in main(),
// before any other thread exists.
void StopTrainingOnSignals();

// While one lives, a signal asks `client` to stop (Client::RequestStop).
class StopOnSignal {
 public:
  explicit StopOnSignal(Client& client);
  ~StopOnSignal();
  StopOnSignal(const StopOnSignal&) = delete;
  StopOnSignal& operator=(const StopOnSignal&) = delete;
};

}  // namespace tether
