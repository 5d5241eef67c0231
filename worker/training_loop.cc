#include "worker/training_loop.h"

#include <algorithm>
#include <chrono>
#include <limits>
#include <string>
#include <thread>

#include "schema/shuffle.h"

namespace tether {
namespace {

Status CheckOptions(const LoopOptions& o) {
  if (o.batch < 1) return InvalidArgument("LoopOptions.batch: must be >= 1");
  if (o.epochs < 1) return InvalidArgument("LoopOptions.epochs: must be >= 1");
  if (o.chunk_rows < 0) {
    return InvalidArgument("LoopOptions.chunk_rows: must be >= 0");
  }
  // Rows are named by uint32_t indices.
  if (o.rows > std::numeric_limits<uint32_t>::max()) {
    return InvalidArgument("LoopOptions.rows: " + std::to_string(o.rows) +
                           " is more than 2^32 - 1");
  }
  return Status::Ok();
}

// Runs `rows` batch by batch; `skip` counts down the batches a resumed run
// already covered.
Status RunBatches(Client& client, const LoopOptions& o,
                  std::span<const uint32_t> rows, int epoch, int64_t* skip,
                  const BatchStep& step, const AfterClock& after_clock) {
  std::function<Status()> after;
  if (after_clock) after = [&] { return after_clock(epoch); };
  const size_t batch = static_cast<size_t>(o.batch);
  for (size_t first = 0; first < rows.size(); first += batch) {
    if (*skip > 0) {
      --*skip;
      continue;
    }
    const auto part = rows.subspan(first, std::min(batch, rows.size() - first));
    TETHER_RETURN_IF_ERROR(RunBatch(
        client, [&] { return step(part, epoch); }, after));
  }
  return Status::Ok();
}

// A fixed share of every epoch, one clock per batch, so a worker that
// joins at clock c (a resumed run) skips the c batches its schedule
// already covered.
Status TrainShare(Client& client, const LoopOptions& o, const BatchStep& step,
                  const AfterClock& after_clock) {
  int64_t skip = client.clock();
  for (int epoch = 0; epoch < o.epochs; ++epoch) {
    const std::vector<uint32_t> order = WorkerShare(
        o.rows, client.rank(), client.num_workers(), client.seed(), epoch);
    TETHER_RETURN_IF_ERROR(
        RunBatches(client, o, order, epoch, &skip, step, after_clock));
  }
  return Status::Ok();
}

// Chunks from shard 0 until every chunk of every epoch is done.
Status TrainChunks(Client& client, const LoopOptions& o, const BatchStep& step,
                   const AfterClock& after_clock) {
  int order_epoch = -1;
  std::vector<uint32_t> order;
  int64_t no_skip = 0;  // shard 0 hands out only chunks not done yet
  while (true) {
    if (client.stop_requested()) return Stopped(client);
    TETHER_ASSIGN_OR_RETURN(
        auto chunk, client.NextChunk(
                        o.rows, static_cast<uint32_t>(o.chunk_rows), o.epochs));
    if (chunk.count == 0) {
      if (chunk.finished) return Status::Ok();
      // Others still hold chunks and one may come back to the pool. Keep
      // the clock moving meanwhile, so this worker holds no one back.
      TETHER_RETURN_IF_ERROR(client.Clock());
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
      continue;
    }
    if (chunk.epoch != order_epoch) {
      // The whole epoch's order: one worker's share of a one-worker run.
      order = WorkerShare(o.rows, 0, 1, client.seed(), chunk.epoch);
      order_epoch = chunk.epoch;
    }
    if (chunk.first + chunk.count > order.size()) {
      return ProtocolError("shard 0 sent a chunk past the " +
                           std::to_string(order.size()) + " rows");
    }
    const std::span<const uint32_t> rows(order.data() + chunk.first,
                                         chunk.count);
    TETHER_RETURN_IF_ERROR(
        RunBatches(client, o, rows, chunk.epoch, &no_skip, step, after_clock));
  }
}

}  // namespace

std::vector<uint32_t> WorkerShare(size_t rows, int rank, int workers,
                                  uint64_t seed, int epoch) {
  std::vector<uint32_t> share;
  if (workers < 1 || rank < 0 || rank >= workers) return share;
  share.reserve(rows / workers + 1);
  for (size_t i = rank; i < rows; i += workers) {
    share.push_back(static_cast<uint32_t>(i));
  }
  Shuffle(share, seed, rank, epoch);
  return share;
}

Status RunBatch(Client& client, const std::function<Status()>& step,
                const std::function<Status()>& after_clock) {
  TETHER_RETURN_IF_ERROR(SurvivingLostShards(client, [&]() -> Status {
    TETHER_RETURN_IF_ERROR(step());
    return client.Clock();
  }));
  if (!after_clock) return Status::Ok();
  // The clock is done: a lost shard now repeats only what follows it.
  return SurvivingLostShards(client, after_clock);
}

Status RunTrainingLoop(Client& client, const LoopOptions& options,
                       const BatchStep& step, const AfterClock& after_clock) {
  TETHER_RETURN_IF_ERROR(CheckOptions(options));
  if (!step) return InvalidArgument("RunTrainingLoop: no step given");
  return EndOfTraining(client,
                       options.chunk_rows > 0
                           ? TrainChunks(client, options, step, after_clock)
                           : TrainShare(client, options, step, after_clock));
}

}  // namespace tether
