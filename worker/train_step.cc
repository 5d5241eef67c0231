#include "worker/train_step.h"

#include <cmath>
#include <string>
#include <thread>

#include "schema/log.h"

namespace tether {

double SecondsSince(std::chrono::steady_clock::time_point since) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - since)
      .count();
}

void SlowDown(double slowdown, double compute_s) {
  if (slowdown > 1.0) {
    std::this_thread::sleep_for(
        std::chrono::duration<double>(compute_s * (slowdown - 1.0)));
  }
}

Status CheckLoss(float loss, const Client& client, int epoch) {
  if (std::isfinite(loss)) return Status::Ok();
  return Status(Code::kNonFinite,
                std::string("the training loss is ") +
                    (std::isnan(loss) ? "NaN" : "Inf") + " at clock " +
                    std::to_string(client.clock()) + " (epoch " +
                    std::to_string(epoch) +
                    "): the model diverged, so this worker stops. Lower "
                    "--lr, or look for extreme values in the data");
}

// The shard's words name the tensor; a diverged model stops at its loss
// (CheckLoss), not here.
Status ToleratingRefused(Status pushed, const Client& client,
                         uint64_t* rejected) {
  if (pushed.code() != Code::kStalePush && pushed.code() != Code::kNonFinite) {
    return pushed;
  }
  if ((*rejected)++ % 100 == 0) {
    TETHER_LOG(kWarning) << "push at clock " << client.clock()
                         << " refused: " << pushed.message() << " (dropped; "
                         << *rejected << " so far)";
  }
  return Status::Ok();
}

}  // namespace tether
