// A training worker's progress: counts samples, loss and time spent
// waiting, reports them to the coordinator (Client::Report) and prints the
// progress line on the terminal.
//
// Not thread-safe: one trainer calls it from its training thread. It keeps
// references to `options` and `client`, which must outlive it.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

#include "schema/status.h"
#include "worker/client.h"
#include "worker/fc_backend.h"
#include "worker/trainer.h"

namespace tether {

class Reporter {
 public:
  // `device` names where the model computes, for the reports.
  Reporter(const TrainerOptions& options, Client& client, std::string device);

  // Time spent pulling, which is where a worker waits for slower ones.
  void AddWait(double seconds) { wait_s_ += seconds; }
  // The sum of AddWait's seconds since the last report.
  double waited() const { return wait_s_; }
  // A clocked batch of `samples` rows and its training loss.
  void AddStep(int samples, float loss);

  // Whether the client's current clock calls for a report
  // (--report-every), and for an evaluation (--eval-every, rank 0 only).
  bool ReportDue() const;
  bool EvalDue() const;

  // Sends a report (with `eval`'s test figures when given and not empty)
  // and prints the progress line; `final` marks the worker done.
  // `eval_clock` is the clock `eval`'s weights were read at (-1: the
  // client's clock now); the line names it when it is another. Returns
  // the report's status; the line is printed either way.
  Status Report(int epoch, const EvalResult* eval, bool final,
                int64_t eval_clock = -1);

  // The latest test accuracy reported; -1 before any.
  float test_accuracy() const { return test_accuracy_; }

 private:
  using Clock = std::chrono::steady_clock;
  void Print(int epoch, bool final);

  const TrainerOptions& o_;
  Client& client_;
  uint64_t samples_ = 0;
  double loss_sum_ = 0;  // since the last report
  int loss_count_ = 0;
  float last_loss_ = 0;
  float test_accuracy_ = -1;
  int64_t eval_clock_ = -1;  // of test_accuracy_
  float samples_per_s_ = 0;
  double wait_s_ = 0;  // pulling, since the last report
  Clock::time_point start_ = Clock::now();
  Clock::time_point last_report_ = Clock::now();
  uint64_t samples_at_last_report_ = 0;
  const std::string device_;  // where the model computes
};

}  // namespace tether
