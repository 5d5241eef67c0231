// tether-worker's work: its options, checked; the data loaded and the
// model built; then one of the trainers (worker/dense_trainer.h,
// worker/sparse_trainer.h: pull honouring the staleness bound, compute,
// push, clock, report progress, evaluate every few clocks), or, as an
// observer, --evaluate-only or --compare-device.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "schema/status.h"
#include "schema/tls_options.h"

namespace tether {

struct TrainerOptions {
  std::string coordinator = "127.0.0.1:7070";  // --coordinator
  std::string auth_key_file;       // --auth-key-file: the run's shared key
  int rank = -1;                   // --rank: -1 lets the coordinator pick
  int staleness = 0;               // --staleness: 0 BSP, -1 async
  std::string model = "mlp";       // --model: softmax, mlp or sparse-lr
  std::string hidden = "256,128";  // --hidden: MLP layer widths
  // --data: "fashion-mnist", "IMAGES,LABELS" (IDX files) for dense models,
  // or a LIBSVM file for sparse-lr.
  std::string data = "fashion-mnist";
  // --test-data: like --data; default: Fashion-MNIST's test split for
  // fashion-mnist, none otherwise.
  std::string test_data;
  int batch = 64;              // --batch
  int epochs = 1;              // --epochs
  int threads = 1;             // --threads: compute threads
  std::string device = "cpu";  // --device: cpu, cuda or cuda:N
  double slowdown = 1.0;       // --slowdown: F >= 1 runs F times slower
  int eval_every = 200;        // --eval-every: clocks; 0 never
  // --eval-in-background: rank 0's evaluations (--eval-every) run on a
  // copy of the weights on a thread of their own while training goes on
  // (worker/background_eval.h), each reported at the first clock after it
  // finishes; off, or in a recorded run: training waits for each. Dense
  // models only.
  bool eval_in_background = true;
  int report_every = 10;  // --report-every: clocks
  // --chunk-rows: ask shard 0 for chunks of this many rows instead of
  // training on a fixed share, so a faster worker trains on more; 0: share.
  int chunk_rows = 0;
  // --overlap-steps: with a bound s != 0, a step's weights are prefetched
  // while the step before runs backward, and it computes while that step's
  // pushes and clock travel; its weights then lack this worker's own last
  // push (the bound allows that, but it costs accuracy). Off: each step
  // reads its own writes.
  bool overlap_steps = false;
  // --prefetch-with-push: with a bound s != 0 and not overlapping steps (nor
  // recording), each layer's weights for the next step are asked for right
  // behind its gradients (Client::PushAndPrefetchAsync), so they come down
  // the link while the layers below still go up; they read this worker's
  // own pushes. For slow links: on one host it costs more than it saves.
  // Off: they are pulled after the clock.
  bool prefetch_with_push = false;
  bool evaluate_only = false;  // --evaluate-only: as an observer
  // --compare-device: as an observer, the run's weights through --device
  // and through the CPU backend (one batch's loss and gradients, the test
  // evaluation); fails when they differ beyond float accuracy.
  bool compare_device = false;
  // --compute-only: no cluster: the model's forward and backward passes on
  // --epochs of --data alone (weights as initialized, not updated), then
  // "compute-only samples/s X": the speed a worker would have with no
  // communication (tools/bench/worker_efficiency).
  bool compute_only = false;
  bool quiet = false;  // --quiet: no progress line
  // --connect-timeout-ms: how long to keep dialling a shard that refuses
  // or whose host name does not resolve yet.
  int connect_timeout_ms = 10000;
  // --wire-dtype: f32, bf16 or int8 (gradients pushed and weights pulled
  // as bfloat16, half the bytes, or int8, about a quarter; the shards keep
  // f32: ClientOptions).
  std::string wire_dtype = "f32";
  // --direct-memory: a shard on this host reads f32 gradients from this
  // process's memory and writes pulled weights into it
  // (ClientOptions::direct_memory).
  bool direct_memory = true;
  TlsOptions tls;      // --tls-cert, --tls-key, --tls-ca (schema/tls.h)
  bool check = false;  // --check: check the flags, start nothing
  // Not a flag: this process's command line, told to the coordinator
  // (ClientOptions::command).
  std::string command;
  // Not a flag: this process's arguments, argv[0] first, for its manifest
  // (worker/manifest.h).
  std::vector<std::string> argv;
};

// Checks the options without opening anything (what --check does; the
// first thing RunTrainer does). kInvalidArgument naming the flag.
Status CheckTrainerOptions(const TrainerOptions& options);

// The line --check prints for options that passed.
std::string DescribeTrainerOptions(const TrainerOptions& options);

// Runs training (or evaluation) to the end. The status says why it
// stopped early: a bad option, a data file, an unreachable cluster.
Status RunTrainer(const TrainerOptions& options);

}  // namespace tether
