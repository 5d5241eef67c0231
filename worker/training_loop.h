// The robustness every training loop needs, shared by tether-worker's
// trainer, `tether-client train` and programs written against the SDK:
// - a lost shard connection (a restarted shard, a cut network, or this
//   worker stopped with SIGSTOP past the run's --worker-timeout-ms, after
//   which the client drops the silent connection and dials it again): the
//   step in flight fails with kUnavailable and is repeated once every shard
//   is connected again;
// - a stopped run (POST /api/stop): training ends like finished epochs;
// - a resumed run (workers join at the checkpoint's clock): the batches the
//   restored weights already reflect are skipped.
//
// RunTrainingLoop is the whole loop over a training set of `rows` rows:
//
//   LoopOptions o;
//   o.rows = 60000;
//   o.batch = 64;
//   o.epochs = 2;
//   Status s = RunTrainingLoop(*client, o,
//       [&](std::span<const uint32_t> rows, int epoch) -> Status {
//         TETHER_RETURN_IF_ERROR(client->Pull("w", w));
//         ... gradient of the batch `rows` into g ...
//         return client->Push("w", g);
//       });
//
// Everything here runs on the calling thread; one loop per Client.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

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
// /api/stop), checked before each try unless `finish` (the step is part of
// work that should be finished, e.g. a data chunk in hand).
template <typename Step>
Status SurvivingLostShards(Client& client, Step step, bool finish = false) {
  while (true) {
    if (client.stop_requested() && !finish) return Stopped(client);
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

// The rows worker `rank` of `workers` trains on in `epoch`: a disjoint
// share (row i belongs to rank i % workers), in an order that is a pure
// function of (seed, rank, epoch), the same on every machine. With one
// worker (rank 0 of 1) it is the epoch's order of all rows, which chunks
// (Client::NextChunk) are cut from. Empty for a rank outside [0, workers).
std::vector<uint32_t> WorkerShare(size_t rows, int rank, int workers,
                                  uint64_t seed, int epoch);

// One batch: pull what it needs, compute, push. `rows` are indices into
// the training set (valid during the call only); `epoch` counts from 0.
using BatchStep =
    std::function<Status(std::span<const uint32_t> rows, int epoch)>;
// Runs after a batch's Clock() succeeded, e.g. to Report progress or to
// evaluate; client.clock() already counts the batch.
using AfterClock = std::function<Status(int epoch)>;

// Runs right after a batch's Clock is sent, before it is acknowledged
// (client.clock() already counts it): e.g. to start the next batch's pulls
// so that they travel with the clock. A pull sent now is read at the new
// clock; the shards hold it until the bound allows that clock.
using ClockSent = std::function<void()>;

// Runs one batch as RunTrainingLoop does, for loops of their own (data
// streamed from a file): step(), then client.Clock() (calling clock_sent,
// when given, once it is sent), both repeated together after a lost shard
// (SurvivingLostShards); then after_clock (may be empty), repeated alone
// after a lost shard. Returns the first error, or kCancelled once the run
// was stopped (pass it to EndOfTraining). With `finish`, a stopped run
// does not end it (see SurvivingLostShards). With `pipelined_clock` the
// clock is sent with Client::ClockPipelined (see LoopOptions).
Status RunBatch(Client& client, const std::function<Status()>& step,
                const std::function<Status()>& after_clock = nullptr,
                bool finish = false, const ClockSent& clock_sent = nullptr,
                bool pipelined_clock = false);

struct LoopOptions {
  uint64_t rows = 0;  // training-set rows, indices 0..rows-1 (< 2^32)
  int batch = 64;     // rows per step (the last batch of a share may be
                      // smaller); >= 1
  int epochs = 1;     // >= 1
  // 0: each worker trains on a fixed share of every epoch, one Clock() per
  // batch: the epoch's rows split among the workers in the run when it
  // starts (Client::Share); a worker that joins mid-epoch starts with the
  // next one, and one that leaves mid-epoch leaves the rest of its share
  // untrained in that epoch. > 0: shard 0 hands out chunks of this many
  // rows (Client::NextChunk), so a faster worker trains on more, and every
  // row is trained once per epoch whoever joins or leaves (a worker that
  // is stopped or leaves finishes the chunk in hand first). A worker with
  // nothing to train meanwhile keeps clocking (every 100 ms) so that it
  // holds no one back.
  int chunk_rows = 0;
  // Called after a batch's clock is sent (see ClockSent) when the next
  // batch follows at once (not after the last batch of a share or chunk);
  // may be empty.
  ClockSent clock_sent;
  // For a bound s != 0: a batch's clock is sent without waiting for its
  // acknowledgements (Client::ClockPipelined), so the next batch computes
  // while it travels; they are waited for before the clock after it. A
  // clock lost with its shard is not sent again (the shard has this
  // worker's clock from its Hello once it is back), and what that batch
  // pushed to the lost shard may be lost with it (a shard restarted from a
  // checkpoint loses more).
  bool pipelined_clock = false;
};

// Pipelined (LoopOptions::pipelined_clock), the outcome of a request of a
// batch already clocked (its clock, its pushes): kUnavailable means it went
// to a shard lost since, and it is lost with it, since that batch is not
// repeated: logs `what` as lost and returns Ok. Any other status as it is.
Status LostWithItsShard(const Status& s, const std::string& what);

// Trains `client`'s share of every epoch: calls step(rows, epoch) for each
// batch, then client.Clock(), then after_clock(epoch) (when given), each
// through RunBatch, so a lost shard costs only the batch in flight.
//
// A resumed or restarted worker: with a fixed share, it skips the batches
// of its share its clock already covers (its clock minus the one it began
// the epoch at, as shard 0 recorded it); with chunks, shard 0 hands out
// only chunks not done yet.
//
// Returns OK after the last epoch, and OK too when the run was stopped
// (POST /api/stop; logged, and client.stop_requested() says so); otherwise
// the first error from step, after_clock or the client (kInvalidArgument
// for bad options, kProtocol for a chunk outside the training set).
Status RunTrainingLoop(Client& client, const LoopOptions& options,
                       const BatchStep& step,
                       const AfterClock& after_clock = nullptr);

}  // namespace tether
