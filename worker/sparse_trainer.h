// Training sparse logistic regression (sparse-lr) over a LIBSVM file,
// streamed: each step pulls only the rows its batch touches.
#pragma once

#include "schema/status.h"
#include "worker/client.h"
#include "worker/trainer.h"

namespace tether {

// Defines the model's table and bias, trains on this rank's share of
// options.data for options.epochs epochs (reporting progress, and
// evaluating on options.test_data when due and given), then evaluates the
// final weights and sends the final report. A resumed run skips the
// batches before the client's clock. Returns why training stopped early:
// the data file, the cluster, a diverged loss. `options` and `client` must
// outlive the call.
Status RunSparseTrainer(const TrainerOptions& options, Client& client);

}  // namespace tether
