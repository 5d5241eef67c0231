#include "worker/training_loop.h"

#include <algorithm>
#include <chrono>
#include <limits>
#include <string>
#include <thread>

#include "schema/shuffle.h"
#include "worker/completion.h"

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

// Where a fixed-share worker stands, told before each batch: the rows of
// `rows` before `first` are done.
using Position = std::function<void(uint64_t first)>;

// The outcome of the clock Client::ClockPipelined left in flight. One lost
// with its shard is not sent again: once back, the shard has this worker's
// clock from its Hello (LoopOptions::pipelined_clock).
Status AwaitPipelinedClock(Client& client) {
  return LostWithItsShard(client.AwaitClock(), "a clock");
}

// Runs `rows` batch by batch; `skip` counts down the batches a resumed run
// already covered.
Status RunBatches(Client& client, const LoopOptions& o,
                  std::span<const uint32_t> rows, int epoch, int64_t* skip,
                  const BatchStep& step, const AfterClock& after_clock,
                  bool finish = false, const Position& position = nullptr) {
  std::function<Status()> after;
  if (after_clock) after = [&] { return after_clock(epoch); };
  const size_t batch = static_cast<size_t>(o.batch);
  for (size_t first = 0; first < rows.size(); first += batch) {
    if (*skip > 0) {
      --*skip;
      continue;
    }
    if (position) position(first);
    const auto part = rows.subspan(first, std::min(batch, rows.size() - first));
    // Only when the next batch follows at once: after the last one the
    // loop asks shard 0 for more data first, and a pull held by the bound
    // must not be overtaken by that request (a replay checks each
    // worker's messages in the order the recording answered them).
    const bool more = first + batch < rows.size();
    TETHER_RETURN_IF_ERROR(RunBatch(
        client, [&] { return step(part, epoch); }, after, finish,
        more ? o.clock_sent : nullptr, o.pipelined_clock));
  }
  // The last batch's clock: what follows (asking for data, idling) starts
  // from it.
  return AwaitPipelinedClock(client);
}

// Keeps this worker's clock moving while it has nothing to train (it sits
// an epoch out, or waits for a chunk), so that it holds no one back.
Status Idle(Client& client) {
  TETHER_RETURN_IF_ERROR(client.Clock());
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  return Status::Ok();
}

// The parts of shares that departed members left untrained, of `epoch` or
// earlier, until shard 0 has none left.
Status TrainLeftovers(Client& client, const LoopOptions& o, int epoch,
                      const BatchStep& step, const AfterClock& after_clock) {
  while (true) {
    if (client.stop_requested()) return Stopped(client);
    Client::SharePart part;
    TETHER_RETURN_IF_ERROR(SurvivingLostShards(client, [&]() -> Status {
      TETHER_ASSIGN_OR_RETURN(part, client.TakeLeftover(epoch));
      return Status::Ok();
    }));
    if (part.epoch < 0) return Status::Ok();
    const std::vector<uint32_t> order = WorkerShare(
        o.rows, part.index, part.members, client.seed(), part.epoch);
    if (part.first_row >= order.size()) continue;
    TETHER_LOG(kInfo) << "worker " << client.rank()
                      << " trains what a departed worker left of epoch "
                      << part.epoch << ": " << order.size() - part.first_row
                      << " rows";
    int64_t no_skip = 0;
    TETHER_RETURN_IF_ERROR(RunBatches(
        client, o, std::span(order).subspan(part.first_row), part.epoch,
        &no_skip, step, after_clock, /*finish=*/false, [&](uint64_t first) {
          client.SetSharePosition(
              {part.epoch, part.index, part.members, part.first_row + first});
        }));
    client.SetSharePosition({});
  }
}

// A fixed share of every epoch, one clock per batch: shard 0 says which
// share of each epoch is this worker's (the epoch's members are fixed when
// it starts), and where this worker's clock stood when it began it, so a
// worker that comes back (restarted, or a resumed run) skips the batches
// its clock already covers.
Status TrainShare(Client& client, const LoopOptions& o, const BatchStep& step,
                  const AfterClock& after_clock) {
  const uint64_t batch = static_cast<uint64_t>(o.batch);
  for (int epoch = 0; epoch < o.epochs; ++epoch) {
    Client::DataShare share;
    while (true) {
      if (client.stop_requested()) return Stopped(client);
      TETHER_RETURN_IF_ERROR(SurvivingLostShards(client, [&]() -> Status {
        TETHER_ASSIGN_OR_RETURN(
            share, client.Share(epoch, static_cast<uint32_t>(o.batch)));
        return Status::Ok();
      }));
      if (share.decided) break;
      // Joined during the previous epoch: the next one will count it.
      TETHER_RETURN_IF_ERROR(
          SurvivingLostShards(client, [&] { return Idle(client); }));
    }
    if (share.index < 0) {
      TETHER_LOG(kInfo) << "epoch " << epoch << " started before worker "
                        << client.rank() << " joined: it starts with epoch "
                        << epoch + 1;
    } else {
      const std::vector<uint32_t> order =
          WorkerShare(o.rows, share.index, share.members, client.seed(), epoch);
      const int64_t batches =
          static_cast<int64_t>((order.size() + batch - 1) / batch);
      int64_t skip = std::max<int64_t>(0, client.clock() - share.start_clock);
      if (skip < batches) {
        TETHER_RETURN_IF_ERROR(
            RunBatches(client, o, order, epoch, &skip, step, after_clock,
                       /*finish=*/false, [&](uint64_t first) {
                         client.SetSharePosition(
                             {epoch, share.index, share.members, first});
                       }));
      }
      client.SetSharePosition({});
    }
    // What members that left during this epoch (or before) did not train.
    TETHER_RETURN_IF_ERROR(TrainLeftovers(client, o, epoch, step, after_clock));
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
        auto chunk,
        client.NextChunk(o.rows, static_cast<uint32_t>(o.chunk_rows), o.epochs,
                         static_cast<uint32_t>(o.batch)));
    if (chunk.count == 0) {
      if (chunk.finished) return Status::Ok();
      // Others still hold chunks and one may come back to the pool.
      TETHER_RETURN_IF_ERROR(Idle(client));
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
    // A chunk in hand is finished even when the run is stopped or this
    // worker leaves, so that every row is trained once.
    TETHER_RETURN_IF_ERROR(RunBatches(client, o, rows, chunk.epoch, &no_skip,
                                      step, after_clock, /*finish=*/true));
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
                const std::function<Status()>& after_clock, bool finish,
                const ClockSent& clock_sent, bool pipelined_clock) {
  TETHER_RETURN_IF_ERROR(SurvivingLostShards(
      client,
      [&]() -> Status {
        TETHER_RETURN_IF_ERROR(step());
        if (pipelined_clock) {
          TETHER_RETURN_IF_ERROR(AwaitPipelinedClock(client));
          TETHER_RETURN_IF_ERROR(client.ClockPipelined());
          if (clock_sent) clock_sent();
          return Status::Ok();
        }
        if (!clock_sent) return client.Clock();
        PendingStatus clocked = PendingStatus::Of(
            [&client](auto done) { client.ClockAsync(std::move(done)); });
        clock_sent();
        return clocked.get();
      },
      finish));
  if (!after_clock) return Status::Ok();
  // The clock is done: a lost shard now repeats only what follows it.
  return SurvivingLostShards(client, after_clock, finish);
}

Status LostWithItsShard(const Status& s, const std::string& what) {
  if (s.code() != Code::kUnavailable) return s;
  TETHER_LOG(kWarning) << what << " lost with its shard: " << s.message();
  return Status::Ok();
}

Status RunTrainingLoop(Client& client, const LoopOptions& options,
                       const BatchStep& step, const AfterClock& after_clock) {
  TETHER_RETURN_IF_ERROR(CheckOptions(options));
  if (!step) return InvalidArgument("RunTrainingLoop: no step given");
  Status trained = options.chunk_rows > 0
                       ? TrainChunks(client, options, step, after_clock)
                       : TrainShare(client, options, step, after_clock);
  // The last clock, when it was pipelined and training ended early with
  // an error (RunBatches awaits it after the last batch otherwise).
  Status clocked = AwaitPipelinedClock(client);
  return EndOfTraining(client, trained.ok() ? clocked : trained);
}

}  // namespace tether
