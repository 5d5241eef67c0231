// tether-bench-apply: a shard's optimizer applying pushes of a large tensor
// in memory (no network), on --threads threads (an ApplyPool, as
// tether-server --apply-threads) against one thread, alternating.
//
//   tether-bench-apply --floats 16777216 --optimizer adam --threads 0
//
// Each round applies the whole tensor as the shard gets it: frames of 16
// blocks of 65536 floats (the client's 4 MiB cut). Goodput counts gradient
// bytes applied (4 * floats per round). Prints
//   "apply_store GB/s X threads T | GB/s Y threads 1 | ratio R".
// Then, with --optimizer adam, the optimizer's loop alone (one thread) on
// state where a tenth of the first moments are subnormal, as those of
// weights whose input stays zero for a while become, against the same
// state with none (training makes them; the shard takes them as zero):
//   "apply_subnormal GB/s X a tenth subnormal | GB/s Y none | ratio R".
#include <algorithm>
#include <cstdio>
#include <iostream>
#include <vector>

#include "schema/flags.h"
#include "server/param_store.h"
#include "tools/bench/percentiles.h"

namespace {

using tether::ParamStore;
using tether::bench::MedianSeconds;

// Seconds per round of pushes applied, as MedianSeconds.
double Time(tether::OptimizerOptions optimizer, uint64_t floats, int threads,
            int rounds) {
  constexpr uint32_t kBlock = 65536, kPerFrame = 16;
  ParamStore store(1, kBlock, optimizer);
  auto id = store.DefineTensor("bench", {floats}, {});
  if (!id.ok()) {
    std::cerr << "tether-bench-apply: " << id.status().message() << "\n";
    std::exit(1);
  }
  tether::ApplyPool pool(threads);
  std::vector<float> grad(floats, 1e-3f);
  const uint32_t blocks = (floats + kBlock - 1) / kBlock;
  std::vector<ParamStore::BlockGrad> frame;
  return MedianSeconds(rounds, [&] {
    for (uint32_t first = 0; first < blocks; first += kPerFrame) {
      frame.clear();
      for (uint32_t b = first; b < std::min(blocks, first + kPerFrame); ++b) {
        const uint64_t at = uint64_t{b} * kBlock;
        frame.push_back({b, std::span<const float>(grad).subspan(
                                at, std::min<uint64_t>(kBlock, floats - at))});
      }
      if (auto s = store.ApplyBlocks(*id, frame, 1.0f, &pool); !s.ok()) {
        std::cerr << "tether-bench-apply: " << s.message() << "\n";
        std::exit(1);
      }
    }
  });
}

// Seconds per Adam update of `floats` weights (the median of `rounds`),
// the first moment of every tenth weight `m0`, the others 1e-4.
double TimeUpdate(const tether::Optimizer& adam, uint64_t floats, float m0,
                  int rounds) {
  std::vector<float> w(floats, 0.5f), g(floats, 1e-3f), slots(2 * floats);
  for (uint64_t i = 0; i < floats; ++i) {
    slots[i] = i % 10 == 0 ? m0 : 1e-4f;
    slots[floats + i] = 1e-6f;
  }
  std::vector<float> w_out(floats), slots_out(2 * floats);
  // Out of place: every round starts from the same state.
  return MedianSeconds(
      rounds, [&] { (void)adam.Update(w, slots, g, w_out, slots_out, 10); });
}

}  // namespace

int main(int argc, char** argv) {
  uint64_t floats = uint64_t{16} << 20;
  int threads = 0;
  int rounds = 10;
  std::string optimizer = "adam";
  tether::FlagParser p("tether-bench-apply",
                       "a shard's optimizer on several threads vs one");
  p.AddUint64("floats", &floats, "tensor size in floats");
  p.AddInt("threads", &threads, "apply threads (0: one per core)");
  p.AddInt("rounds", &rounds, "timed rounds per configuration");
  p.AddString("optimizer", &optimizer, "sgd, momentum, adagrad or adam");
  if (auto exit_code = p.ParseForMain(argc, argv)) return *exit_code;
  auto kind = tether::ParseOptimizerKind(optimizer);
  if (!kind.ok() || floats == 0 || rounds < 1) {
    std::cerr << "tether-bench-apply: "
              << (kind.ok() ? "--floats and --rounds must be positive"
                            : "--optimizer: " + kind.status().message())
              << "\n";
    return 1;
  }
  tether::OptimizerOptions o;
  o.kind = *kind;
  o.lr = 1e-3f;
  const int resolved = tether::ApplyPool(threads).threads();
  // Alternating, so that a noisy neighbour weighs on both alike.
  std::vector<double> many, one;
  for (int i = 0; i < 3; ++i) {
    many.push_back(Time(o, floats, threads, rounds));
    one.push_back(Time(o, floats, 1, rounds));
  }
  const double t_many = tether::bench::Summarize(many).median;
  const double t_one = tether::bench::Summarize(one).median;
  const double bytes = 4.0 * floats;
  std::printf(
      "apply_store GB/s %.2f threads %d | GB/s %.2f threads 1 | ratio %.2f\n",
      bytes / t_many / 1e9, resolved, bytes / t_one / 1e9, t_one / t_many);
  if (o.kind != tether::OptimizerKind::kAdam) return 0;
  const tether::Optimizer adam(o);
  std::vector<double> subnormal, normal;
  for (int i = 0; i < 3; ++i) {
    subnormal.push_back(TimeUpdate(adam, floats, 1e-39f, rounds));
    normal.push_back(TimeUpdate(adam, floats, 1e-4f, rounds));
  }
  const double t_sub = tether::bench::Summarize(subnormal).median;
  const double t_normal = tether::bench::Summarize(normal).median;
  std::printf(
      "apply_subnormal GB/s %.2f a tenth subnormal | GB/s %.2f none | ratio "
      "%.2f\n",
      bytes / t_sub / 1e9, bytes / t_normal / 1e9, t_normal / t_sub);
  return 0;
}
