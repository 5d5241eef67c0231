// tether-gen-sparse: writes synthetic sparse binary-classification data in
// LIBSVM format, labelled by a known true weight vector, so that a sparse
// logistic-regression run can be checked against the truth.
//
//   tether-gen-sparse --out PATH --rows N --features F --nnz K --seed S
//                     [--exponent 1.1] [--weights-out PATH] [--quiet]
//
// True weights: w_j ~ N(0, 1) for j in [0, F), a pure function of (seed, j).
// Each row has K distinct keys drawn with Zipf-like frequencies
// (P(key j) proportional to (j + 1)^-exponent, so small keys are hot), all
// with value 1, sorted ascending; its label is +1 when sigmoid(w.x) exceeds
// a uniform draw, else -1. Output is a pure function of the flags.
//
// Exit status: 0 on success, 2 for bad flags, 1 for I/O errors.
#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <numbers>
#include <random>
#include <string>
#include <vector>

#include "schema/flags.h"
#include "schema/status.h"

namespace tether {
namespace {

struct GenOptions {
  std::string out;  // required
  uint64_t rows = 100000;
  uint64_t features = 1000000;
  int nnz = 20;
  uint64_t seed = 1;
  double exponent = 1.1;
  std::string weights_out;  // empty: no weights file
  bool quiet = false;
};

// With --weights-out, every key is written when there are at most this
// many; otherwise only the keys that appear in the data.
constexpr uint64_t kAllWeightsUpTo = 65536;
// The bitmap of keys seen for --weights-out costs features / 8 bytes.
constexpr uint64_t kMaxWeightsFeatures = uint64_t{1} << 32;
constexpr uint64_t kProgressEvery = 100000;

constexpr const char* kSummary =
    "Writes synthetic sparse binary-classification data (LIBSVM format)\n"
    "labelled by true weights w_j ~ N(0,1); keys follow a power law.";

// SplitMix64's finaliser: a good 64-bit hash of nearby integers.
uint64_t Mix64(uint64_t z) {
  z += 0x9e3779b97f4a7c15ULL;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

// Uniform in (0, 1]: never 0, so its logarithm is finite.
double UnitFromBits(uint64_t bits) { return ((bits >> 11) + 1) * 0x1.0p-53; }

// The standard library's distributions are implementation-defined; these
// helpers keep the output identical with any library.
double Uniform01(std::mt19937_64& gen) { return UnitFromBits(gen()); }

uint64_t UniformBelow(std::mt19937_64& gen, uint64_t bound) {
  const uint64_t threshold = (0 - bound) % bound;  // 2^64 mod bound
  uint64_t r = gen();
  while (r < threshold) r = gen();
  return r % bound;
}

// w_key ~ N(0, 1) by Box-Muller on two hashes of (seed, key): no O(F)
// table, and any key's weight can be recomputed on its own.
double TrueWeight(uint64_t seed, uint64_t key) {
  const uint64_t h1 = Mix64(Mix64(seed) ^ key);
  const uint64_t h2 = Mix64(h1);
  const double radius = std::sqrt(-2.0 * std::log(UnitFromBits(h1)));
  return radius * std::cos(2.0 * std::numbers::pi * UnitFromBits(h2));
}

// Draws k in [1, n] with P(k) proportional to k^-s in O(1) expected time and
// O(1) memory: rejection-inversion (Hormann and Derflinger, 1996), as in
// Apache Commons RNG's RejectionInversionZipfSampler.
class ZipfSampler {
 public:
  ZipfSampler(uint64_t n, double s)
      : n_(n),
        s_(s),
        h_integral_x1_(HIntegral(1.5) - 1.0),
        h_integral_n_(HIntegral(static_cast<double>(n) + 0.5)),
        squeeze_(2.0 - HIntegralInverse(HIntegral(2.5) - H(2.0))) {}

  uint64_t Sample(std::mt19937_64& gen) const {
    for (;;) {
      const double u =
          h_integral_n_ + Uniform01(gen) * (h_integral_x1_ - h_integral_n_);
      const double x = HIntegralInverse(u);
      double k = std::floor(x + 0.5);
      if (k < 1) k = 1;
      if (k > static_cast<double>(n_)) k = static_cast<double>(n_);
      if (k - x <= squeeze_ || u >= HIntegral(k + 0.5) - H(k)) {
        return static_cast<uint64_t>(k);
      }
    }
  }

 private:
  // log1p(x)/x and expm1(x)/x, with series near 0 where they are 0/0.
  static double Helper1(double x) {
    if (std::abs(x) > 1e-8) return std::log1p(x) / x;
    return 1 - x * (0.5 - x * (1.0 / 3.0 - 0.25 * x));
  }
  static double Helper2(double x) {
    if (std::abs(x) > 1e-8) return std::expm1(x) / x;
    return 1 + x * 0.5 * (1 + x * (1.0 / 3.0) * (1 + 0.25 * x));
  }
  double H(double x) const { return std::exp(-s_ * std::log(x)); }
  // (x^(1-s) - 1) / (1 - s), also for s = 1.
  double HIntegral(double x) const {
    const double log_x = std::log(x);
    return Helper2((1.0 - s_) * log_x) * log_x;
  }
  double HIntegralInverse(double x) const {
    double t = x * (1.0 - s_);
    if (t < -1.0) t = -1.0;
    return std::exp(Helper1(t) * x);
  }

  uint64_t n_;
  double s_;
  double h_integral_x1_;
  double h_integral_n_;
  double squeeze_;
};

// Inserts `key` into the sorted `keys` unless present; returns whether it
// was new. Rows are short, so a sorted vector beats a hash set.
bool InsertSorted(std::vector<uint64_t>* keys, uint64_t key) {
  auto it = std::lower_bound(keys->begin(), keys->end(), key);
  if (it != keys->end() && *it == key) return false;
  keys->insert(it, key);
  return true;
}

// Fills `keys` with `nnz` distinct keys in [0, features), sorted.
void DrawKeys(const ZipfSampler& zipf, uint64_t features, uint64_t nnz,
              std::mt19937_64& gen, std::vector<uint64_t>* keys) {
  keys->clear();
  if (nnz == features) {
    for (uint64_t k = 0; k < features; ++k) keys->push_back(k);
    return;
  }
  // When nnz is a large part of the key space, the rare keys a row needs
  // take the power law very long to reach; finish such rows uniformly.
  uint64_t attempts = 32 * nnz + 64;
  while (keys->size() < nnz && attempts-- > 0) {
    InsertSorted(keys, zipf.Sample(gen) - 1);
  }
  while (keys->size() < nnz) InsertSorted(keys, UniformBelow(gen, features));
}

void AppendUint(std::string* out, uint64_t v) {
  char buf[24];
  auto [end, ec] = std::to_chars(buf, buf + sizeof(buf), v);
  out->append(buf, end);
}

// A FILE* that is closed once; Close reports a failed write or flush.
class OutFile {
 public:
  ~OutFile() {
    if (f_ != nullptr) std::fclose(f_);
  }
  Status Open(const std::string& path) {
    path_ = path;
    f_ = std::fopen(path.c_str(), "w");
    if (f_ == nullptr) {
      return Status(Code::kIoError, path + ": cannot open for writing: " +
                                        std::strerror(errno));
    }
    std::setvbuf(f_, nullptr, _IOFBF, 1 << 20);
    return Status::Ok();
  }
  Status Write(const std::string& data) {
    if (std::fwrite(data.data(), 1, data.size(), f_) != data.size()) {
      return Status(Code::kIoError,
                    path_ + ": write failed: " + std::strerror(errno));
    }
    return Status::Ok();
  }
  Status Close() {
    FILE* f = f_;
    f_ = nullptr;
    if (std::fclose(f) != 0) {
      return Status(Code::kIoError,
                    path_ + ": write failed: " + std::strerror(errno));
    }
    return Status::Ok();
  }

 private:
  std::string path_;
  FILE* f_ = nullptr;
};

Status ValidateOptions(const GenOptions& o) {
  if (o.out.empty()) return InvalidArgument("--out: required");
  if (o.rows == 0) return InvalidArgument("--rows: must be at least 1");
  if (o.features == 0) {
    return InvalidArgument("--features: must be at least 1");
  }
  if (o.nnz < 1 || static_cast<uint64_t>(o.nnz) > o.features) {
    return InvalidArgument("--nnz: must be between 1 and --features (" +
                           std::to_string(o.features) + "), got " +
                           std::to_string(o.nnz));
  }
  if (!(o.exponent > 0) || o.exponent > 10) {
    return InvalidArgument("--exponent: must be in (0, 10], got " +
                           std::to_string(o.exponent));
  }
  if (!o.weights_out.empty() && o.features > kMaxWeightsFeatures) {
    return InvalidArgument("--weights-out: needs --features <= " +
                           std::to_string(kMaxWeightsFeatures));
  }
  return Status::Ok();
}

// Writes "key weight" lines for the keys marked in `seen` (all of them when
// `seen` is empty).
Status WriteWeights(const GenOptions& o, const std::vector<bool>& seen,
                    OutFile& file) {
  std::string chunk;
  char buf[32];
  for (uint64_t k = 0; k < o.features; ++k) {
    if (!seen.empty() && !seen[k]) continue;
    AppendUint(&chunk, k);
    std::snprintf(buf, sizeof(buf), " %.9g\n", TrueWeight(o.seed, k));
    chunk += buf;
    if (chunk.size() >= (1 << 20)) {
      TETHER_RETURN_IF_ERROR(file.Write(chunk));
      chunk.clear();
    }
  }
  TETHER_RETURN_IF_ERROR(file.Write(chunk));
  return file.Close();
}

// Writes the rows to `out`, marking the keys used in `seen` when it is not
// empty. Sets `*progress_shown` once a progress line is on stderr.
Status WriteRows(const GenOptions& o, OutFile& out, std::vector<bool>& seen,
                 uint64_t* positives, bool* progress_shown) {
  const bool progress = !o.quiet && o.rows >= kProgressEvery;
  const ZipfSampler zipf(o.features, o.exponent);
  // Decorrelated from TrueWeight's hashes of the same seed.
  std::mt19937_64 gen(Mix64(o.seed ^ 0x5eed0f5a7a5e7ULL));
  std::vector<uint64_t> keys;
  std::string chunk;
  for (uint64_t row = 0; row < o.rows; ++row) {
    DrawKeys(zipf, o.features, static_cast<uint64_t>(o.nnz), gen, &keys);
    double margin = 0;
    for (uint64_t k : keys) margin += TrueWeight(o.seed, k);
    const bool positive = 1.0 / (1.0 + std::exp(-margin)) > Uniform01(gen);
    *positives += positive;
    chunk += positive ? "+1" : "-1";
    for (uint64_t k : keys) {
      chunk += ' ';
      AppendUint(&chunk, k);
      chunk += ":1";
      if (!seen.empty()) seen[k] = true;
    }
    chunk += '\n';
    if (chunk.size() >= (1 << 20)) {
      TETHER_RETURN_IF_ERROR(out.Write(chunk));
      chunk.clear();
    }
    if (progress && (row + 1) % kProgressEvery == 0) {
      std::fprintf(stderr, "\rgen-sparse: %llu/%llu rows",
                   static_cast<unsigned long long>(row) + 1,
                   static_cast<unsigned long long>(o.rows));
      *progress_shown = true;
    }
  }
  return out.Write(chunk);
}

Status Generate(const GenOptions& o) {
  OutFile out;
  TETHER_RETURN_IF_ERROR(out.Open(o.out));
  // Opened first so that a bad path fails before minutes of generating.
  OutFile weights;
  if (!o.weights_out.empty()) {
    TETHER_RETURN_IF_ERROR(weights.Open(o.weights_out));
  }
  const bool track_seen =
      !o.weights_out.empty() && o.features > kAllWeightsUpTo;
  std::vector<bool> seen(track_seen ? o.features : 0, false);
  uint64_t positives = 0;
  bool progress_shown = false;
  Status s = WriteRows(o, out, seen, &positives, &progress_shown);
  if (progress_shown) std::fprintf(stderr, "\n");  // end the progress line
  TETHER_RETURN_IF_ERROR(s);
  TETHER_RETURN_IF_ERROR(out.Close());
  if (!o.weights_out.empty()) {
    TETHER_RETURN_IF_ERROR(WriteWeights(o, seen, weights));
  }
  if (!o.quiet) {
    std::fprintf(stderr,
                 "gen-sparse: wrote %llu rows (%.1f%% positive) to %s\n",
                 static_cast<unsigned long long>(o.rows),
                 100.0 * positives / o.rows, o.out.c_str());
  }
  return Status::Ok();
}

int Main(int argc, char** argv) {
  GenOptions o;
  FlagParser p("tether-gen-sparse", kSummary);
  p.AddString("out", &o.out, "LIBSVM file to write (required)");
  p.AddUint64("rows", &o.rows, "examples to write");
  p.AddUint64("features", &o.features, "key space: keys are in [0, F)");
  p.AddInt("nnz", &o.nnz, "distinct keys per row");
  p.AddUint64("seed", &o.seed, "seed of the true weights and the rows");
  p.AddDouble("exponent", &o.exponent, "power-law exponent of key frequency");
  p.AddString("weights-out", &o.weights_out,
              "also write the true weights as 'key weight' lines (the keys "
              "that appear, or all when F <= 65536)");
  p.AddBool("quiet", &o.quiet, "no progress or summary on stderr");
  if (auto exit_code = p.ParseForMain(argc, argv)) return *exit_code;
  Status s = ValidateOptions(o);
  if (!s.ok()) {
    std::cerr << "tether-gen-sparse: " << s.message() << "\n";
    return 2;
  }
  s = Generate(o);
  if (!s.ok()) {
    std::cerr << "tether-gen-sparse: " << s.message() << "\n";
    return 1;
  }
  return 0;
}

}  // namespace
}  // namespace tether

int main(int argc, char** argv) { return tether::Main(argc, argv); }
