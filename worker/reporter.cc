#include "worker/reporter.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>

#include "worker/train_step.h"

namespace tether {
namespace {

std::string HostName() {
  char name[256] = {};
  if (gethostname(name, sizeof name - 1) != 0) return "unknown";
  return name;
}

}  // namespace

Reporter::Reporter(const TrainerOptions& options, Client& client,
                   std::string device)
    : o_(options), client_(client), device_(std::move(device)) {}

void Reporter::AddStep(int samples, float loss) {
  samples_ += samples;
  loss_sum_ += loss;
  ++loss_count_;
  last_loss_ = loss;
}

bool Reporter::ReportDue() const {
  return client_.clock() % std::max(1, o_.report_every) == 0;
}

bool Reporter::EvalDue() const {
  return o_.eval_every > 0 && client_.rank() == 0 &&
         client_.clock() % o_.eval_every == 0;
}

Status Reporter::Report(int epoch, const EvalResult* eval, bool final,
                        int64_t eval_clock) {
  double dt = SecondsSince(last_report_);
  if (dt > 0) {
    samples_per_s_ =
        static_cast<float>((samples_ - samples_at_last_report_) / dt);
  }
  Progress p;
  if (dt > 0) p.wait_fraction = static_cast<float>(std::min(1.0, wait_s_ / dt));
  wait_s_ = 0;
  p.done = final;
  last_report_ = Clock::now();
  samples_at_last_report_ = samples_;
  p.epoch = epoch;
  p.samples = samples_;
  p.loss = loss_count_ > 0 ? static_cast<float>(loss_sum_ / loss_count_)
                           : last_loss_;
  p.samples_per_s = samples_per_s_;
  p.host = HostName();
  p.device = device_;
  loss_sum_ = 0;
  loss_count_ = 0;
  if (eval != nullptr && eval->rows > 0) {
    test_accuracy_ = static_cast<float>(eval->correct) / eval->rows;
    eval_clock_ = eval_clock >= 0 ? eval_clock : client_.clock();
    p.test_accuracy = test_accuracy_;
    p.test_loss = static_cast<float>(eval->loss_sum / eval->rows);
  }
  Status s = client_.Report(p);
  Print(epoch, final);
  return s;
}

void Reporter::Print(int epoch, bool final) {
  if (o_.quiet && !final) return;
  char acc[64] = "";
  if (test_accuracy_ >= 0) {
    const int n = std::snprintf(acc, sizeof acc, " test accuracy %.1f%%",
                                100.0 * test_accuracy_);
    if (eval_clock_ != client_.clock()) {  // an earlier clock's
      std::snprintf(acc + n, sizeof acc - n, " (of clock %lld)",
                    static_cast<long long>(eval_clock_));
    }
  }
  char line[256];
  std::snprintf(line, sizeof line,
                "worker %d: epoch %d/%d clock %lld loss %.4f%s %.0f samples/s",
                client_.rank(), epoch + 1, o_.epochs,
                static_cast<long long>(client_.clock()), last_loss_, acc,
                samples_per_s_);
  // On a terminal the line rewrites itself; in a log each report is a line.
  const bool tty = isatty(STDOUT_FILENO);
  if (final) {
    std::printf("%s%s (done in %.2f s)\n", tty ? "\r" : "", line,
                SecondsSince(start_));
  } else {
    std::printf("%s%s%s", tty ? "\r" : "", line, tty ? "   " : "\n");
  }
  std::fflush(stdout);
}

}  // namespace tether
