// tether-worker: trains a model against a tether cluster. See --help.
#include <iostream>
#include <optional>

#include "schema/flags.h"
#include "schema/launcher.h"
#include "schema/log.h"
#include "schema/tls.h"
#include "worker/signals.h"
#include "worker/trainer.h"

int main(int argc, char** argv) {
  tether::DieWithLauncher();  // started by tether-up or a test
  tether::TrainerOptions o;
  tether::FlagParser p(
      "tether-worker",
      "Trains a model on its share of the data against a tether cluster:\n"
      "pull (within the staleness bound), compute with oneDNN, push, clock.");
  p.AddString("coordinator", &o.coordinator, "HOST:PORT of shard 0");
  p.AddString("auth-key-file", &o.auth_key_file,
              "file holding the run's shared key, when the shards have one");
  p.AddInt("rank", &o.rank, "rank to claim; -1: the coordinator picks");
  p.AddInt("staleness", &o.staleness, "SSP bound: 0 BSP, -1 fully async");
  p.AddString("model", &o.model, "softmax, mlp or sparse-lr");
  p.AddString("hidden", &o.hidden, "MLP hidden layer widths");
  p.AddString("data", &o.data,
              "fashion-mnist, IMAGES,LABELS (IDX files), or a LIBSVM file "
              "for sparse-lr");
  p.AddString("test-data", &o.test_data,
              "test set, like --data (default: Fashion-MNIST's test split "
              "with --data fashion-mnist)");
  p.AddInt("batch", &o.batch, "batch size");
  p.AddInt("epochs", &o.epochs, "passes over this worker's share");
  p.AddInt("threads", &o.threads, "compute threads");
  p.AddString("device", &o.device,
              "where dense models compute: cpu, cuda (GPU 0) or cuda:N");
  p.AddDouble("slowdown", &o.slowdown,
              "run F times slower (sleeping in proportion to compute)");
  p.AddInt("eval-every", &o.eval_every,
           "rank 0 evaluates on the test set every K clocks; 0: only at "
           "the end");
  p.AddBool("eval-in-background", &o.eval_in_background,
            "rank 0 evaluates a copy of the weights on a thread of its own "
            "while training goes on (reported at the first clock after it "
            "ends), so no worker waits for it; off: training waits for each "
            "evaluation");
  p.AddInt("report-every", &o.report_every,
           "report progress to the coordinator every K clocks");
  p.AddInt("chunk-rows", &o.chunk_rows,
           "ask shard 0 for chunks of N rows of each epoch instead of a fixed "
           "share (a faster worker trains on more); 0: fixed share");
  p.AddBool("overlap-steps", &o.overlap_steps,
            "with --staleness other than 0: prefetch a step's weights while "
            "the step before runs backward, and compute while its pushes "
            "and clock travel (its weights then lack this worker's own last "
            "push: faster steps, a little less accuracy per epoch); off: "
            "every step reads its own writes");
  p.AddBool("prefetch-with-push", &o.prefetch_with_push,
            "with --staleness other than 0 and without --overlap-steps: ask "
            "for each layer's next weights right behind its gradients, so "
            "they come down the link while the layers below still go up "
            "(each step still reads its own writes; for slow links); off: "
            "pull them after the clock");
  p.AddBool("evaluate-only", &o.evaluate_only,
            "pull the weights as an observer, print test accuracy, exit");
  p.AddBool("compute-only", &o.compute_only,
            "no cluster: time the model's forward and backward passes over "
            "--epochs of --data alone, print the samples/s, exit");
  p.AddBool("compare-device", &o.compare_device,
            "pull the weights as an observer; compare --device against the "
            "CPU on the first --batch training rows (loss, gradients) and "
            "on the test set; exit 1 when they differ");
  p.AddBool("quiet", &o.quiet, "no progress line, only the final one");
  p.AddInt("connect-timeout-ms", &o.connect_timeout_ms,
           "how long to keep dialling a shard that refuses, or whose host "
           "name does not resolve yet (a pod not yet scheduled)");
  p.AddString("wire-dtype", &o.wire_dtype,
              "f32, bf16 or int8: push gradients and pull weights as "
              "bfloat16 (half the bytes) or as int8 with a scale per 256 "
              "values (about a quarter; gradients rounded stochastically); "
              "the shards keep f32 weights and optimizer state");
  p.AddBool("direct-memory", &o.direct_memory,
            "a shard on this host reads f32 gradients from this process's "
            "memory and writes pulled weights into it (process_vm_readv, "
            "process_vm_writev) instead of sending them over TCP, once it "
            "has checked that this process is the peer; shards elsewhere use "
            "TCP. false: always TCP");
  tether::BindTlsFlags(p, &o.tls);
  p.AddBool("check", &o.check,
            "check the flags (and TETHER_* variables), print what this "
            "worker would do and exit 0, starting nothing (2: a bad flag)");
  p.UseEnvironment("TETHER_");
  if (auto exit_code = p.ParseForMain(argc, argv)) return *exit_code;
  if (o.check) {
    if (tether::Status s = tether::CheckTrainerOptions(o); !s.ok()) {
      std::cerr << "tether-worker: " << s.message() << "\n";
      return 2;
    }
    std::cout << "tether-worker: flags ok: "
              << tether::DescribeTrainerOptions(o) << "\n";
    return 0;
  }
  // Before any thread starts: SIGTERM and SIGINT make the worker leave
  // the run after its current step.
  tether::StopTrainingOnSignals();
  o.command = tether::ShellCommand(argc, argv);
  o.argv.assign(argv, argv + argc);
  tether::InitLogging("worker", tether::LogLevel::kWarning);
  tether::Status s = tether::RunTrainer(o);
  if (!s.ok()) {
    std::cerr << "tether-worker: " << s.message() << "\n";
    return s.code() == tether::Code::kInvalidArgument ? 2 : 1;
  }
  return 0;
}
