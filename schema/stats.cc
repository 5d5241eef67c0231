#include "schema/stats_frame.h"

namespace tether {
namespace {

ShardStats::Worker ReadWorker(const wire::WorkerStat& w) {
  ShardStats::Worker worker;
  worker.rank = w.rank();
  worker.clock = w.clock();
  worker.staleness = w.staleness();
  worker.connected = w.connected();
  worker.live = w.live();
  worker.epoch = w.epoch();
  worker.samples = w.samples();
  worker.loss = w.loss();
  worker.samples_per_s = w.samples_per_s();
  worker.test_accuracy = w.test_accuracy();
  worker.test_loss = w.test_loss();
  if (w.device()) worker.device = w.device()->str();
  if (w.host()) worker.host = w.host()->str();
  worker.wait_fraction = w.wait_fraction();
  worker.done = w.done();
  worker.nonfinite_pushes = w.nonfinite_pushes();
  worker.left = w.left();
  return worker;
}

}  // namespace

OutFrame MakeStatsFrame(uint64_t request_id, const ShardStats& stats) {
  flatbuffers::FlatBufferBuilder fbb(1024 + 128 * stats.workers.size());
  std::vector<flatbuffers::Offset<wire::WorkerStat>> workers;
  workers.reserve(stats.workers.size());
  for (const ShardStats::Worker& worker : stats.workers) {
    auto device = fbb.CreateString(worker.device);
    auto host = fbb.CreateString(worker.host);
    wire::WorkerStatBuilder w(fbb);
    w.add_rank(worker.rank);
    w.add_clock(worker.clock);
    w.add_staleness(worker.staleness);
    w.add_connected(worker.connected);
    w.add_live(worker.live);
    w.add_epoch(worker.epoch);
    w.add_samples(worker.samples);
    w.add_loss(worker.loss);
    w.add_samples_per_s(worker.samples_per_s);
    w.add_test_accuracy(worker.test_accuracy);
    w.add_test_loss(worker.test_loss);
    w.add_device(device);
    w.add_host(host);
    w.add_wait_fraction(worker.wait_fraction);
    w.add_done(worker.done);
    w.add_nonfinite_pushes(worker.nonfinite_pushes);
    w.add_left(worker.left);
    workers.push_back(w.Finish());
  }
  auto workers_offset = fbb.CreateVector(workers);
  auto histogram = fbb.CreateVector(stats.staleness_histogram);
  std::vector<flatbuffers::Offset<wire::DataEpoch>> epochs;
  for (const ShardStats::DataEpoch& e : stats.data_epochs) {
    epochs.push_back(wire::CreateDataEpoch(fbb, e.epoch, e.chunks_total,
                                           e.chunks_done, e.rows_done,
                                           e.duplicates));
  }
  auto epochs_offset = fbb.CreateVector(epochs);
  wire::StatsBuilder b(fbb);
  b.add_request_id(request_id);
  b.add_shard_id(stats.shard_id);
  b.add_tensors(stats.tensors);
  b.add_dense_blocks(stats.dense_blocks);
  b.add_sparse_rows(stats.sparse_rows);
  b.add_bytes(stats.bytes);
  b.add_pushes(stats.pushes);
  b.add_pulls(stats.pulls);
  b.add_rejected_pushes(stats.rejected_pushes);
  b.add_waiting_pulls(stats.waiting_pulls);
  b.add_bytes_in(stats.bytes_in);
  b.add_bytes_out(stats.bytes_out);
  b.add_min_clock(stats.min_clock);
  b.add_workers(workers_offset);
  b.add_staleness_histogram(histogram);
  b.add_staleness_sum(stats.staleness_sum);
  b.add_reports(stats.reports);
  b.add_evictions(stats.evictions);
  b.add_late_pushes(stats.late_pushes);
  b.add_data_epochs(epochs_offset);
  b.add_chunks_reassigned(stats.chunks_reassigned);
  return FinishFrame(fbb, b.Finish());
}

ShardStats ReadStats(const wire::Stats& r) {
  ShardStats out;
  out.shard_id = r.shard_id();
  out.tensors = r.tensors();
  out.dense_blocks = r.dense_blocks();
  out.sparse_rows = r.sparse_rows();
  out.bytes = r.bytes();
  out.pushes = r.pushes();
  out.pulls = r.pulls();
  out.rejected_pushes = r.rejected_pushes();
  out.waiting_pulls = r.waiting_pulls();
  out.bytes_in = r.bytes_in();
  out.bytes_out = r.bytes_out();
  out.min_clock = r.min_clock();
  if (r.workers()) {
    for (const wire::WorkerStat* w : *r.workers()) {
      out.workers.push_back(ReadWorker(*w));
    }
  }
  if (r.staleness_histogram()) {
    out.staleness_histogram.assign(r.staleness_histogram()->begin(),
                                   r.staleness_histogram()->end());
  }
  out.staleness_sum = r.staleness_sum();
  out.reports = r.reports();
  out.evictions = r.evictions();
  out.late_pushes = r.late_pushes();
  if (r.data_epochs()) {
    for (const wire::DataEpoch* e : *r.data_epochs()) {
      out.data_epochs.push_back({e->epoch(), e->chunks_total(),
                                 e->chunks_done(), e->rows_done(),
                                 e->duplicates()});
    }
  }
  out.chunks_reassigned = r.chunks_reassigned();
  return out;
}

}  // namespace tether
