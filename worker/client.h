// tether's client library: what a worker (or any training loop) links to
// push gradients to and pull parameters from a sharded tether server.
//
//   ClientOptions o;
//   o.coordinator = "127.0.0.1:7070";
//   o.staleness = 3;
//   auto client = Client::Connect(o);          // blocks until training starts
//   if (!client.ok()) { ... client.status().message() ... }
//   (*client)->DefineTensor("w", {784, 10}, {InitKind::kUniform, 0.05f});
//   (*client)->Pull("w", weights);             // waits for the slowest worker
//   (*client)->Push("w", gradient);
//   (*client)->Clock();
//
// Connect() talks to the coordinator (shard 0), which hands out a rank, the
// run settings and the shard map, then opens one connection per shard.
// Every request is cut per shard by the Slicer (and into chunks of at most
// `chunk_bytes`), sent at once, and completes when every part has answered.
//
// Each operation has an asynchronous form taking a callback, which runs on
// one of the client's I/O threads or on a thread blocked in one of this
// client's blocking calls, which does the I/O threads' work while it spins
// (keep it short, take no lock held across a blocking call, and never call
// a blocking form from it), and a blocking form returning the Status. Buffers
// passed to an asynchronous call must stay valid until its callback has run; a
// pushed one also unchanged, since a shard on this host may read it from this
// process's memory until then (ClientOptions::direct_memory). A pulled one
// is written only when the answer has come (a shard on this host writes
// into buffers of the client's own, which are then copied).
//
// Thread-safe: requests may be issued from several threads. A worker's
// Clock() is ordered after every Push issued before it by the same thread,
// on every shard.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "schema/stats.h"
#include "schema/status.h"
#include "schema/tls_options.h"
#include "schema/wire_dtype.h"
#include "worker/slicer.h"

namespace tether {
namespace client_internal {
enum class PushKind : uint8_t;  // request_cutter.h
}  // namespace client_internal

enum class InitKind { kZeros, kUniform, kNormal, kConstant, kProvided };

// How a tensor's or table's values start: kUniform in [-scale, scale),
// kNormal with standard deviation `scale`, kConstant equal to `scale`.
// Values are a pure function of the run seed, the name and the index.
// kProvided: a worker provides them (ProvideTensor, ProvideRows), e.g. from
// a PyTorch module's own initialization; until it has, pulls and pushes of
// that tensor fail with kNotReady.
struct Init {
  InitKind kind = InitKind::kZeros;
  float scale = 0.0f;
};

struct ClientOptions {
  std::string coordinator;  // HOST:PORT of shard 0 (required)
  // Observers (tools, tests) read and write parameters but hold no rank and
  // no clock; their pulls never wait.
  bool observer = false;
  int rank = -1;      // worker rank to claim; -1: the coordinator picks
  int staleness = 0;  // SSP bound: 0 is BSP, -1 fully asynchronous
  std::string name;   // shown in shard logs
  // How this process was started (its command line, shell-quoted: see
  // ShellCommand in schema/flags.h), told to the coordinator so that the
  // dashboard's "Copy command + seeds" starts this worker again; "" says
  // nothing. It is shown to whoever reads the dashboard: never put a secret
  // in it (a key file's path, not its contents).
  std::string command;
  // This worker's part of the run manifest (JSON object; worker/manifest.h
  // for tether-worker's), told to the coordinator, which keeps it in every
  // round and shows it on the dashboard; "" says nothing. Never a secret.
  std::string manifest;
  // The run's shared key (schema/auth.h), when the shards have one.
  std::string auth_key_file;
  // TLS to every shard (schema/tls.h), when the shards speak it.
  TlsOptions tls;
  size_t max_frame_bytes = size_t{64} << 20;
  size_t chunk_bytes = size_t{4} << 20;  // payload per request frame
  // Values on the wire: kF32 exact; kBf16 sends gradients and receives
  // weights as bfloat16 (half the bytes; rounded to nearest even); kInt8
  // as one byte a value and a float scale per 256 (about a quarter of the
  // bytes; gradients rounded stochastically, weights to nearest). The
  // shards keep f32 weights and optimizer state either way, and initial
  // values a worker provides always travel as f32 (schema/wire_dtype.h).
  WireDtype wire_dtype = WireDtype::kF32;
  // A worker on a shard's host offers that shard its process id: once the
  // shard has checked that this process holds the other end of the
  // connection, f32 gradients are not sent but read by the shard from
  // this process's memory (process_vm_readv), and pulled weights are
  // written by the shard into buffers of this process (process_vm_writev)
  // instead of sent, which spares both sides the kernel's TCP path. Where
  // the shard cannot (another host or container, no permission, a shard
  // started with --direct-memory=false) they travel over TCP as usual.
  // false: always TCP.
  bool direct_memory = true;
  int connect_timeout_ms = 10000;  // per shard, retrying refused connects
  int join_timeout_ms = 600000;    // for the coordinator's Welcome
  // Heartbeats to every shard (so an idle connection is not closed) until
  // the Welcome says how
  // often the run wants them; a worker that stops sending them (stopped,
  // cut off) is evicted after the run's --worker-timeout-ms.
  int heartbeat_ms = 1000;
  // A request unanswered this long is logged (and again as long as it
  // waits), saying which shard it waits for: a worker never waits silently.
  int slow_request_ms = 10000;
  // Workers: a lost shard is dialled again with backoff (0.1 s doubling to
  // 5 s) for this long, then given up; 0: never.
  int reconnect_timeout_ms = 120000;
  // Threads that send, receive and copy replies; each connection to a shard
  // keeps to one of them, so connections to different shards proceed in
  // parallel and a reply never waits for a thread to be woken.
  int io_threads = 2;
  // A blocking call spins this long for its answer before it sleeps: a
  // small request is answered in about the time a sleeping thread takes to
  // be woken. While it spins, the I/O threads park and the calling thread
  // reads the answer itself, as a raw TCP client would. 0: sleep at once
  // (spare the core when it is needed by other work).
  int spin_us = 50;
  Slicer slicer = DefaultSlicer();
};

// A worker's progress, reported to the coordinator (shard 0).
struct Progress {
  int epoch = 0;
  uint64_t samples = 0;  // training samples processed so far
  float loss = 0;        // mean training loss since the last report
  float samples_per_s = 0;
  float test_accuracy = -1;  // -1: not evaluated this time
  float test_loss = -1;
  std::string device = "cpu";
  std::string host;
  float wait_fraction = 0;  // of the time since the last report, pulling
  bool done = false;        // the last report: all epochs trained
};

class Client {
 public:
  using Callback = std::function<void(const Status&)>;

  // Connects to the coordinator, waits for the Welcome (workers: until
  // every worker has joined), then connects to every shard. kUnavailable
  // names the address that could not be reached; an Error from a shard
  // (rank taken, version mismatch) comes back with its message.
  static Result<std::unique_ptr<Client>> Connect(ClientOptions options);
  // Closes every connection; requests still pending fail with kUnavailable.
  ~Client();

  int rank() const;       // -1 for observers
  int staleness() const;  // the bound the shards enforce
  int num_shards() const;
  int num_workers() const;
  uint64_t seed() const;  // the run seed
  // The run records (or replays) the order of every worker's requests
  // (--record): a worker keeps to one order, overlapping no steps.
  bool records() const;
  uint32_t block_size() const;
  int64_t clock() const;  // completed Clock() calls
  // The checkpoint round the run resumed from (tether-server --resume), -1
  // when it did not; clock() then starts at that round's clock.
  int64_t resume_round() const;

  // Defines a dense tensor of `shape` on every shard. Idempotent; workers
  // may all define the same tensors. kShapeMismatch if it exists otherwise.
  void DefineTensorAsync(const std::string& name,
                         const std::vector<uint64_t>& shape, Init init,
                         Callback done);
  Status DefineTensor(const std::string& name,
                      const std::vector<uint64_t>& shape, Init init = {});
  // Defines a sparse table of rows of `dim` floats, created on first touch.
  void DefineTableAsync(const std::string& name, uint32_t dim, Init init,
                        Callback done);
  Status DefineTable(const std::string& name, uint32_t dim, Init init = {});

  // Fills `out` (exactly the tensor's size) with its current values. For a
  // worker at clock c with bound s, completes once every live worker has
  // reached clock c - s.
  void PullAsync(const std::string& name, std::span<float> out, Callback done);
  Status Pull(const std::string& name, std::span<float> out);
  // PullAsync of the values this worker computes with at its next clock,
  // sent while it is still at this one (e.g. once forward is done, so that
  // they travel while backward runs). The shards hold it as a pull at the
  // next clock, so the bound is kept exactly: with s >= 1 it is usually
  // answered at once, without this worker's pushes of this clock (which
  // the bound does not require); with s = 0 once every worker has clocked.
  // Pushes after the next Clock() are tagged read at that clock.
  void PrefetchAsync(const std::string& name, std::span<float> out,
                     Callback done);
  // Sends a gradient (exactly the tensor's size) to be applied by the
  // shards' optimizer. It is tagged with the clock of this client's last
  // pull, so shards know its staleness; kStalePush if a shard rejects it.
  void PushAsync(const std::string& name, std::span<const float> grad,
                 Callback done);
  Status Push(const std::string& name, std::span<const float> grad);
  // PushAsync of `grad` and PrefetchAsync of the same tensor into `out`,
  // interleaved: each part of the push (one per shard and chunk_bytes) is
  // followed right away by the prefetch of the same blocks on its shard's
  // connection. A shard answers a
  // connection's requests in order, so a part's prefetch reads its push,
  // and is answered while the push's later parts are still on their way:
  // the next clock's weights come down the link while the gradient goes
  // up, instead of after it. `pushed` and `prefetched` complete as
  // PushAsync's and PrefetchAsync's would (an error that refuses both, a
  // bad size or an unknown name, goes to each).
  void PushAndPrefetchAsync(const std::string& name,
                            std::span<const float> grad, std::span<float> out,
                            Callback pushed, Callback prefetched);

  // The initial values of a tensor defined with InitKind::kProvided (exactly
  // its size): written where the shards hold none yet, ignored where they
  // do -- the first provider wins, and a resumed run keeps its checkpoint.
  // Not a gradient: no clock, no staleness. Other workers wait for them with
  // PullWhenReady.
  void ProvideTensorAsync(const std::string& name,
                          std::span<const float> values, Callback done);
  Status ProvideTensor(const std::string& name, std::span<const float> values);
  // Replaces the tensor's values on the shards with `values` (exactly its
  // size), whatever they were: not a gradient, so no optimizer, clock or
  // staleness, and nothing held for the bound. For state a model updates
  // apart from its gradients, such as BatchNorm's running statistics, so
  // that evaluations, checkpoints and exports hold it; the last writer
  // wins. Dense tensors only.
  void AssignTensorAsync(const std::string& name, std::span<const float> values,
                         Callback done);
  Status AssignTensor(const std::string& name, std::span<const float> values);
  // The same for rows of a table defined with InitKind::kProvided.
  void ProvideRowsAsync(const std::string& table,
                        std::span<const uint64_t> keys,
                        std::span<const float> values, Callback done);
  Status ProvideRows(const std::string& table, std::span<const uint64_t> keys,
                     std::span<const float> values);
  // Pull() that, while the tensor's values are not provided yet
  // (kNotReady), asks again every 50 ms for up to `timeout_ms`; then
  // kNotReady says what is missing.
  Status PullWhenReady(const std::string& name, std::span<float> out,
                       int timeout_ms);

  // Sparse rows: `out` / `grads` hold keys.size() * dim floats, row after
  // row in key order. Keys may repeat.
  void PullRowsAsync(const std::string& table, std::span<const uint64_t> keys,
                     std::span<float> out, Callback done);
  Status PullRows(const std::string& table, std::span<const uint64_t> keys,
                  std::span<float> out);
  void PushRowsAsync(const std::string& table, std::span<const uint64_t> keys,
                     std::span<const float> grads, Callback done);
  Status PushRows(const std::string& table, std::span<const uint64_t> keys,
                  std::span<const float> grads);

  // Ends this worker's current iteration on every shard (after the pushes
  // issued before it). Workers only.
  void ClockAsync(Callback done);
  Status Clock();
  // Clock() that waits for the previous pipelined clock's acknowledgements
  // instead of this one's: the next step computes while this clock travels,
  // and at most one is in flight. Returns the previous one's outcome (then
  // this clock is not sent) or, once sent, OK. With a bound s != 0 (with
  // s = 0 the next step's pull waits for this clock anyway). Clock() and
  // AwaitClock() wait for the one in flight first.
  Status ClockPipelined();
  // The outcome of the clock ClockPipelined() left in flight (OK if none).
  Status AwaitClock();

  // Sends this worker's progress (with its clock) to shard 0, where Stats()
  // and the dashboard show it. Workers only.
  void ReportAsync(const Progress& progress, Callback done);
  Status Report(const Progress& progress);

  // Asks shard 0 for a checkpoint round now; returns the round's number.
  // kUnavailable when the cluster has no --data-dir or a round is still
  // being written.
  Result<int64_t> CheckpointNow();

  // Chunked data assignment: the next chunk of the training set for this
  // worker (the one it had is done). The epoch's order of rows is
  // Shuffle(0..rows-1, seed(), 0, epoch) (schema/shuffle.h); a chunk is
  // `count` positions of it from `first`. count 0: no chunk now; then
  // `finished` says whether every chunk is done or others still hold some
  // (ask again: one of them may die and give its chunk back). Workers only.
  struct DataChunk {
    int epoch = 0;
    uint32_t index = 0;
    uint64_t first = 0;
    uint32_t count = 0;
    bool finished = false;
  };
  // `batch`: the rows this worker trains per clock (0: not said), so that a
  // checkpoint round records how much of a chunk in hand it holds and a
  // resumed run trains only the rest.
  Result<DataChunk> NextChunk(uint64_t rows, uint32_t chunk_rows, int epochs,
                              uint32_t batch = 0);

  // Fixed data shares: this worker's share of `epoch`. The epoch's members
  // are fixed by shard 0 when the epoch is first asked for (server/
  // share_plan.h); member `index` of `members` trains WorkerShare(rows,
  // index, members, seed, epoch). decided false: not fixed yet (this worker
  // joined during the previous epoch): ask again. index -1: not a member,
  // sit the epoch out. `start_clock`: this worker's clock when it began the
  // epoch, so one that comes back skips what its clock covers. Workers only.
  struct DataShare {
    bool decided = false;
    int index = -1;
    int members = 0;
    int64_t start_clock = 0;
  };
  // `batch`: rows this worker trains a clock (so that shard 0 can hand its
  // share on from where it stands, should it not come back).
  Result<DataShare> Share(int epoch, uint32_t batch = 0);

  // Fixed shares under changing membership: a part of a share that a
  // member left untrained (it left the run mid-epoch). Member `index` of
  // `members` in `epoch`: rows from `first_row` on of WorkerShare(rows,
  // index, members, seed, epoch).
  struct SharePart {
    int epoch = -1;  // -1: none
    int index = -1;
    int members = 0;
    uint64_t first_row = 0;
  };
  // Takes the leftover of the lowest epoch <= `epoch` for this worker to
  // train (epoch -1: none left now). Workers only.
  Result<SharePart> TakeLeftover(int epoch);
  // Where this worker is in a fixed share now: what Leave() hands on as
  // a leftover (rows `first_row` on are not trained). Reset with
  // epoch -1 once the share is done. Thread-safe.
  void SetSharePosition(const SharePart& rest);

  // Leaves the run for good, saying `reason` (shown on the dashboard): shard
  // 0 stops counting this worker at once and frees its rank. Call it once
  // training is over, before the Client is destroyed; a worker that just
  // disconnects counts as lost (it may come back). `finished`: the data
  // chunk it holds, if any, is done (else it goes back to the pool); the
  // rest of the fixed share it was in (SetSharePosition) goes to another
  // member. Workers only.
  Status Leave(const std::string& reason, bool finished = true);

  // Every shard's counters, by shard id.
  Result<std::vector<ShardStats>> Stats();

  // After a request failed with kUnavailable: waits until every lost shard
  // is reconnected -- dialled, greeted and its tensors defined again -- (Ok),
  // or one is given up or `timeout_ms` passes (the error names the shard),
  // or the run is stopped (RequestStop, POST /api/stop: kCancelled).
  // Until then, requests that need that shard fail at once with
  // kUnavailable.
  Status AwaitShards(int timeout_ms);
  // How many times a shard connection was lost so far (a request that
  // failed while this changed may be repeated once it is back).
  uint64_t shard_losses() const;

  // Shard 0 said the run was stopped (POST /api/stop): a worker should stop
  // after its current step. The reason is empty until then.
  bool stop_requested() const;
  std::string stop_reason() const;
  // Any thread (a signal handler's thread, e.g. on SIGTERM): asks the
  // training loop to end after its current step, as a stopped run does.
  void RequestStop(const std::string& reason);

  // Largest staleness any shard reported for this client's pushes.
  int64_t max_push_staleness() const { return max_push_staleness_; }

  struct Impl;

 private:
  explicit Client(std::unique_ptr<Impl> impl);
  // Push, Provide and Assign, as `kind` says.
  void PushDense(const std::string& name, std::span<const float> values,
                 client_internal::PushKind kind, Callback done);
  void PushSparse(const std::string& table, std::span<const uint64_t> keys,
                  std::span<const float> values, bool provide, Callback done);
  std::unique_ptr<Impl> impl_;
  std::atomic<int64_t> max_push_staleness_{0};
};

}  // namespace tether
