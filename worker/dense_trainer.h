// Training a dense model (softmax, mlp) on an in-memory data set: each
// step pulls every parameter, computes one batch, pushes every gradient
// and clocks (RunTrainingLoop), honouring the staleness bound.
#pragma once

#include "schema/status.h"
#include "worker/client.h"
#include "worker/dataset.h"
#include "worker/model.h"
#include "worker/trainer.h"

namespace tether {

// Defines `model`'s tensors, trains on `train` for options.epochs epochs
// (reporting progress, and evaluating on `test` when due; `test` may be
// null), then evaluates the final weights and sends the final report.
// Returns why training stopped early: the cluster, a diverged loss, the
// model. Every argument must outlive the call.
Status RunDenseTrainer(const TrainerOptions& options, Client& client,
                       DenseModel& model, const DenseDataset& train,
                       const DenseDataset* test);

// Pulls every parameter of `model` into its weights, all requests at once;
// returns the first error.
Status PullAll(Client& client, DenseModel& model);

}  // namespace tether
