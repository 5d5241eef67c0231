// tether-bench-wire-codec: the wire dtypes' conversions (schema/int8.h,
// schema/bf16.h) over --floats values in memory, against a memcpy of the
// same f32 bytes (the memory's bandwidth) in the same run, alternating.
//
//   tether-bench-wire-codec --floats 4194304 --rounds 20
//
// Every push of an int8 or bf16 client narrows its gradients and every
// pull reply widens weights (and a shard the reverse), so these loops run
// over every value a narrowed step moves. Goodput counts f32 bytes
// (4 * floats). One line a conversion:
//   "wire_codec int8 narrow stochastic GB/s X | memcpy GB/s Y | ratio R".
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <iostream>
#include <string>
#include <vector>

#include "schema/bf16.h"
#include "schema/flags.h"
#include "schema/int8.h"
#include "tools/bench/percentiles.h"

int main(int argc, char** argv) {
  uint64_t floats = uint64_t{4} << 20;
  int rounds = 20;
  tether::FlagParser p("tether-bench-wire-codec",
                       "bf16 and int8 conversions vs memcpy");
  p.AddUint64("floats", &floats, "values converted per round");
  p.AddInt("rounds", &rounds, "timed rounds per measurement");
  if (auto exit_code = p.ParseForMain(argc, argv)) return *exit_code;
  if (floats == 0 || rounds < 1) {
    std::cerr << "tether-bench-wire-codec: --floats and --rounds must be "
                 "positive\n";
    return 1;
  }
  // Gradient-like values: signs mixed, magnitudes over several decades.
  std::vector<float> in(floats), wide(floats), copy(floats);
  for (uint64_t i = 0; i < floats; ++i) {
    in[i] = std::sin(static_cast<float>(i) * 0.91f) *
            std::pow(10.0f, static_cast<float>(i % 5) - 3);
  }
  std::vector<int8_t> q8(floats);
  std::vector<float> scales(tether::Int8Scales(floats));
  std::vector<uint16_t> half(floats);
  tether::ToInt8(in, q8.data(), scales.data());
  tether::ToBf16(in, half.data());

  const std::vector<std::pair<std::string, std::function<void()>>> codecs = {
      {"int8 narrow stochastic",
       [&] { tether::ToInt8Dithered(in, 7, q8.data(), scales.data()); }},
      {"int8 narrow nearest",
       [&] { tether::ToInt8(in, q8.data(), scales.data()); }},
      {"int8 widen", [&] { tether::FromInt8(q8, scales.data(), wide.data()); }},
      {"bf16 narrow", [&] { tether::ToBf16(in, half.data()); }},
      {"bf16 widen", [&] { tether::FromBf16(half, wide.data()); }},
  };
  const auto memcpy_round = [&] {
    std::memcpy(copy.data(), in.data(), floats * sizeof(float));
  };
  const double bytes = 4.0 * static_cast<double>(floats);
  for (const auto& [name, codec] : codecs) {
    // Alternating, so that a noisy neighbour weighs on both alike.
    std::vector<double> mine, baseline;
    for (int i = 0; i < 3; ++i) {
      mine.push_back(tether::bench::MedianSeconds(rounds, codec));
      baseline.push_back(tether::bench::MedianSeconds(rounds, memcpy_round));
    }
    const double t = tether::bench::Summarize(mine).median;
    const double t_copy = tether::bench::Summarize(baseline).median;
    std::printf("wire_codec %s GB/s %.2f | memcpy GB/s %.2f | ratio %.2f\n",
                name.c_str(), bytes / t / 1e9, bytes / t_copy / 1e9,
                t_copy / t);
  }
  return 0;
}
