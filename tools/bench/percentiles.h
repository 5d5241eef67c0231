// The median and 99th percentile of a benchmark's samples, shared by the
// latency benchmarks (tether-bench-latency, tether-bench-tcp --ping), and
// the median time of a round of work (tether-bench-apply,
// tether-bench-wire-codec).
#pragma once

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <vector>

namespace tether::bench {

struct Percentiles {
  double median = 0;
  double p99 = 0;
};

// Nearest-rank percentiles; zeros for no samples. Sorts `samples`.
inline Percentiles Summarize(std::vector<double>& samples) {
  if (samples.empty()) return {};
  std::sort(samples.begin(), samples.end());
  auto rank = [&](double q) {
    size_t i = static_cast<size_t>(q * static_cast<double>(samples.size()));
    return samples[std::min(i, samples.size() - 1)];
  };
  return {rank(0.5), rank(0.99)};
}

// Seconds `round()` takes, the median of `rounds` after one untimed.
template <typename Round>
double MedianSeconds(int rounds, Round round) {
  std::vector<double> times;
  for (int r = 0; r <= rounds; ++r) {
    auto start = std::chrono::steady_clock::now();
    round();
    if (r > 0) {
      times.push_back(std::chrono::duration<double>(
                          std::chrono::steady_clock::now() - start)
                          .count());
    }
  }
  return Summarize(times).median;
}

}  // namespace tether::bench
