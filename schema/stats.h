// One shard's figures at one moment: what a Stats frame carries, what
// Client::Stats() returns, and what the dashboard and /metrics show. Plain
// values, installed with the client library; schema/stats_frame.h puts
// them on the wire.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace tether {

struct ShardStats {
  struct Worker {
    int rank = 0;
    int64_t clock = 0;
    int staleness = 0;  // the bound the shard enforces; -1 none
    bool connected = false;
    bool live = true;  // holds back the minimum clock
    // From the worker's latest Report (shard 0 only).
    int epoch = 0;
    uint64_t samples = 0;
    float loss = -1;
    float samples_per_s = 0;
    float test_accuracy = -1;  // -1: never evaluated
    float test_loss = -1;
    std::string device;
    std::string host;
    float wait_fraction = 0;  // of its time spent pulling (waiting)
    bool done = false;        // finished its epochs
    // Its pushes this shard refused as non-finite: holding NaN or Inf, or
    // an update that would have made a weight or slot non-finite.
    uint64_t nonfinite_pushes = 0;
    // Shard 0: it left the run for good (said so, or its epochs are done);
    // its rank is free for a worker that joins later.
    bool left = false;
  };
  int shard_id = 0;
  uint32_t tensors = 0;
  uint64_t dense_blocks = 0;
  uint64_t sparse_rows = 0;
  uint64_t bytes = 0;  // weights plus optimizer slots
  uint64_t pushes = 0;
  uint64_t pulls = 0;
  uint64_t rejected_pushes = 0;
  uint64_t waiting_pulls = 0;
  uint64_t bytes_in = 0;
  uint64_t bytes_out = 0;
  int64_t min_clock = 0;
  std::vector<Worker> workers;
  // Bucket i counts pushes of staleness i; the last one "i or more".
  std::vector<uint64_t> staleness_histogram;
  uint64_t staleness_sum = 0;  // of every push's staleness
  uint64_t reports = 0;        // WorkerReports received (shard 0)
  uint64_t evictions = 0;      // workers evicted for silence
  uint64_t late_pushes = 0;    // for a clock already closed; dropped
  // Chunked data assignment (shard 0): per epoch, chunks and rows done.
  struct DataEpoch {
    int epoch = 0;
    uint64_t chunks_total = 0, chunks_done = 0, rows_done = 0;
    uint64_t duplicates = 0;  // chunks completed twice; stays 0
  };
  std::vector<DataEpoch> data_epochs;
  uint64_t chunks_reassigned = 0;
};

}  // namespace tether
