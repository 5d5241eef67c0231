// fm-worker: a model tether does not ship, trained with tether's C++ SDK.
//
// A multi-class factorization machine on Fashion-MNIST: for each class c,
//
//   z_c = b_c + w_c . x + sum_{i<j} <v_ci, v_cj> x_i x_j
//
// where v_ci is a vector of F factors per pixel i, so the model scores
// pairs of pixels without a weight for every pair. The pairwise sum costs
// O(F * pixels) (Rendle's identity): for each factor f, with s = sum_i v_i
// x_i, it is (s^2 - sum_i v_i^2 x_i^2) / 2. Softmax cross-entropy on z.
//
// The parameters live on the tether shards as three tensors; each step
// pulls them, computes the gradient of one batch, and pushes it; the
// shards' optimizer applies it. RunTrainingLoop decides which rows this
// worker trains on, clocks, survives a lost shard and ends on a stop.
//
//   fm-worker --coordinator 127.0.0.1:7070 [--staleness S] [--epochs E]
//             [--batch B] [--rank R] [--auth-key-file F] [--factors F]
//             [--data-dir D]
#include <zlib.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "schema/log.h"
#include "schema/status.h"
#include "worker/client.h"
#include "worker/training_loop.h"

namespace {

using tether::Status;

constexpr int kClasses = 10;
constexpr int kPixels = 28 * 28;

// --- Fashion-MNIST, read from Debian's dataset-fashion-mnist ------------

struct Dataset {
  size_t rows = 0;
  std::vector<float> x;  // rows * kPixels, in [0, 1]
  std::vector<uint8_t> y;
};

// The whole (gzip-compressed or plain) file.
tether::Result<std::vector<uint8_t>> ReadGz(const std::string& path) {
  gzFile f = gzopen(path.c_str(), "rb");
  if (f == nullptr) {
    return Status(tether::Code::kNotFound,
                  path +
                      ": cannot open (install the Debian package "
                      "dataset-fashion-mnist, or pass --data-dir)");
  }
  std::vector<uint8_t> data;
  uint8_t buf[1 << 16];
  int n = 0;
  while ((n = gzread(f, buf, sizeof buf)) > 0) {
    data.insert(data.end(), buf, buf + n);
  }
  const bool failed = n < 0;
  gzclose(f);
  if (failed) return Status(tether::Code::kIoError, path + ": read error");
  return data;
}

uint32_t BigEndian32(const uint8_t* p) {
  return uint32_t{p[0]} << 24 | uint32_t{p[1]} << 16 | uint32_t{p[2]} << 8 |
         uint32_t{p[3]};
}

// IDX files: a big-endian magic (0x803 images, 0x801 labels), the counts,
// then u8 values.
tether::Result<Dataset> LoadSplit(const std::string& dir,
                                  const std::string& prefix) {
  const std::string images_path = dir + "/" + prefix + "-images-idx3-ubyte.gz";
  const std::string labels_path = dir + "/" + prefix + "-labels-idx1-ubyte.gz";
  TETHER_ASSIGN_OR_RETURN(auto images, ReadGz(images_path));
  TETHER_ASSIGN_OR_RETURN(auto labels, ReadGz(labels_path));
  if (images.size() < 16 || BigEndian32(images.data()) != 0x803 ||
      BigEndian32(images.data() + 8) != 28 ||
      BigEndian32(images.data() + 12) != 28) {
    return tether::InvalidArgument(images_path + ": not 28x28 IDX images");
  }
  if (labels.size() < 8 || BigEndian32(labels.data()) != 0x801) {
    return tether::InvalidArgument(labels_path + ": not IDX labels");
  }
  Dataset d;
  d.rows = BigEndian32(images.data() + 4);
  if (BigEndian32(labels.data() + 4) != d.rows ||
      images.size() < 16 + d.rows * kPixels || labels.size() < 8 + d.rows) {
    return tether::InvalidArgument(images_path + ", " + labels_path +
                                   ": truncated, or counts differ");
  }
  d.x.resize(d.rows * kPixels);
  for (size_t i = 0; i < d.x.size(); ++i) d.x[i] = images[16 + i] / 255.0f;
  d.y.assign(labels.begin() + 8, labels.begin() + 8 + d.rows);
  for (uint8_t label : d.y) {
    if (label >= kClasses) {
      return tether::InvalidArgument(labels_path + ": a label above 9");
    }
  }
  return d;
}

// --- The model -------------------------------------------------------------

class FactorizationMachine {
 public:
  explicit FactorizationMachine(int factors)
      : factors_(factors),
        w_(size_t{kClasses} * kPixels),
        b_(kClasses),
        v_(size_t(kClasses) * factors * kPixels),
        gw_(w_.size()),
        gb_(b_.size()),
        gv_(v_.size()) {}

  // The same on every worker (DefineTensor is idempotent). The factors
  // start random: with v = 0 their gradient would stay 0.
  Status Define(tether::Client& client) const {
    const auto classes = static_cast<uint64_t>(kClasses);
    TETHER_RETURN_IF_ERROR(client.DefineTensor("fm/w", {classes, kPixels}));
    TETHER_RETURN_IF_ERROR(client.DefineTensor("fm/b", {classes}));
    return client.DefineTensor("fm/v", {classes * factors_, kPixels},
                               tether::Init{tether::InitKind::kNormal, 0.05f});
  }

  Status Pull(tether::Client& client) {
    TETHER_RETURN_IF_ERROR(client.Pull("fm/w", w_));
    TETHER_RETURN_IF_ERROR(client.Pull("fm/b", b_));
    return client.Pull("fm/v", v_);
  }

  Status Push(tether::Client& client) const {
    TETHER_RETURN_IF_ERROR(client.Push("fm/w", gw_));
    TETHER_RETURN_IF_ERROR(client.Push("fm/b", gb_));
    return client.Push("fm/v", gv_);
  }

  // The mean loss of the batch `rows`; its gradient in gw_, gb_, gv_.
  float Gradient(const Dataset& d, std::span<const uint32_t> rows) {
    std::fill(gw_.begin(), gw_.end(), 0.0f);
    std::fill(gb_.begin(), gb_.end(), 0.0f);
    std::fill(gv_.begin(), gv_.end(), 0.0f);
    const float scale = 1.0f / static_cast<float>(rows.size());
    double loss = 0;
    std::vector<float> s(size_t(kClasses) * factors_);
    float z[kClasses];
    for (uint32_t row : rows) {
      const float* x = &d.x[size_t{row} * kPixels];
      Forward(x, z, s.data());
      const int label = d.y[row];
      loss -= std::log(std::max(z[label], 1e-12f));
      z[label] -= 1.0f;  // softmax minus one-hot: dloss/dz
      for (int c = 0; c < kClasses; ++c) {
        const float dz = z[c] * scale;
        gb_[c] += dz;
        float* gw = &gw_[size_t(c) * kPixels];
        for (int i = 0; i < kPixels; ++i) gw[i] += dz * x[i];
        for (int f = 0; f < factors_; ++f) {
          const size_t k = size_t(c) * factors_ + f;
          const float* v = &v_[k * kPixels];
          float* gv = &gv_[k * kPixels];
          const float sk = s[k];
          // d/dv_i of (s^2 - sum v_i^2 x_i^2) / 2 = x_i s - v_i x_i^2.
          for (int i = 0; i < kPixels; ++i) {
            gv[i] += dz * x[i] * (sk - v[i] * x[i]);
          }
        }
      }
    }
    return static_cast<float>(loss * scale);
  }

  // The fraction of `d` classified right, with the weights last pulled.
  double Accuracy(const Dataset& d) const {
    std::vector<float> s(size_t(kClasses) * factors_);
    float z[kClasses];
    size_t correct = 0;
    for (size_t row = 0; row < d.rows; ++row) {
      Forward(&d.x[row * kPixels], z, s.data());
      correct += std::max_element(z, z + kClasses) - z == d.y[row];
    }
    return d.rows > 0 ? double(correct) / double(d.rows) : 0.0;
  }

 private:
  // Softmax probabilities into p; each factor's s = v . x into s.
  void Forward(const float* x, float* p, float* s) const {
    float top = -INFINITY;
    for (int c = 0; c < kClasses; ++c) {
      const float* w = &w_[size_t(c) * kPixels];
      float zc = b_[c];
      for (int i = 0; i < kPixels; ++i) zc += w[i] * x[i];
      for (int f = 0; f < factors_; ++f) {
        const size_t k = size_t(c) * factors_ + f;
        const float* v = &v_[k * kPixels];
        float sum = 0, squares = 0;
        for (int i = 0; i < kPixels; ++i) {
          const float vx = v[i] * x[i];
          sum += vx;
          squares += vx * vx;
        }
        s[k] = sum;
        zc += 0.5f * (sum * sum - squares);
      }
      p[c] = zc;
      top = std::max(top, zc);
    }
    float total = 0;
    for (int c = 0; c < kClasses; ++c) total += p[c] = std::exp(p[c] - top);
    for (int c = 0; c < kClasses; ++c) p[c] /= total;
  }

  const int factors_;
  std::vector<float> w_, b_, v_;     // pulled
  std::vector<float> gw_, gb_, gv_;  // pushed
};

// --- Flags and the worker ---------------------------------------------------

struct Options {
  std::string coordinator;
  std::string auth_key_file;
  std::string data_dir = "/usr/share/datasets/fashion-mnist";
  int staleness = 0;
  int epochs = 1;
  int batch = 64;
  int rank = -1;
  int factors = 8;
};

constexpr const char* kUsage =
    "usage: fm-worker --coordinator HOST:PORT [--staleness S (0)] "
    "[--epochs E (1)]\n"
    "                 [--batch B (64)] [--rank R (-1: any)] "
    "[--auth-key-file FILE]\n"
    "                 [--factors F (8)] [--data-dir DIR]\n";

// --flag value or --flag=value.
tether::Result<Options> ParseFlags(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    std::string flag = argv[i], value;
    if (flag == "--help" || flag == "-h") {
      std::fputs(kUsage, stdout);
      std::exit(0);
    }
    if (auto eq = flag.find('='); eq != std::string::npos) {
      value = flag.substr(eq + 1);
      flag.resize(eq);
    } else if (i + 1 < argc) {
      value = argv[++i];
    } else {
      return tether::InvalidArgument(flag + ": needs a value");
    }
    auto number = [&](int* out, int min) -> Status {
      char* end = nullptr;
      const long n = std::strtol(value.c_str(), &end, 10);
      if (value.empty() || *end != '\0' || n < min || n > 1 << 20) {
        std::string m = flag;
        m += ": expected an integer >= " + std::to_string(min);
        m += ", got '" + value + "'";
        return tether::InvalidArgument(std::move(m));
      }
      *out = static_cast<int>(n);
      return Status::Ok();
    };
    Status s;
    if (flag == "--coordinator") {
      o.coordinator = value;
    } else if (flag == "--auth-key-file") {
      o.auth_key_file = value;
    } else if (flag == "--data-dir") {
      o.data_dir = value;
    } else if (flag == "--staleness") {
      s = number(&o.staleness, -1);
    } else if (flag == "--epochs") {
      s = number(&o.epochs, 1);
    } else if (flag == "--batch") {
      s = number(&o.batch, 1);
    } else if (flag == "--rank") {
      s = number(&o.rank, -1);
    } else if (flag == "--factors") {
      s = number(&o.factors, 1);
    } else {
      s = tether::InvalidArgument("unknown flag " + flag + "\n" + kUsage);
    }
    if (!s.ok()) return s;
  }
  if (o.coordinator.empty()) {
    return tether::InvalidArgument(std::string("--coordinator is required\n") +
                                   kUsage);
  }
  return o;
}

double SecondsSince(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t)
      .count();
}

Status Run(const Options& o) {
  TETHER_ASSIGN_OR_RETURN(auto train, LoadSplit(o.data_dir, "train"));
  TETHER_ASSIGN_OR_RETURN(auto test, LoadSplit(o.data_dir, "t10k"));

  tether::ClientOptions co;
  co.coordinator = o.coordinator;
  co.auth_key_file = o.auth_key_file;
  co.staleness = o.staleness;
  co.rank = o.rank;
  co.name = "fm-worker";
  TETHER_ASSIGN_OR_RETURN(
      auto connected, tether::Client::Connect(co));  // waits for every worker
  tether::Client& client = *connected;

  FactorizationMachine model(o.factors);
  TETHER_RETURN_IF_ERROR(model.Define(client));

  const auto start = std::chrono::steady_clock::now();
  tether::Progress progress;
  int batch_rows = 0;
  float loss = 0;
  tether::LoopOptions loop;
  loop.rows = train.rows;
  loop.batch = o.batch;
  loop.epochs = o.epochs;
  TETHER_RETURN_IF_ERROR(tether::RunTrainingLoop(
      client, loop,
      [&](std::span<const uint32_t> rows, int /*epoch*/) -> Status {
        TETHER_RETURN_IF_ERROR(model.Pull(client));
        loss = model.Gradient(train, rows);
        if (!std::isfinite(loss)) {
          return Status(tether::Code::kNonFinite, "the loss diverged");
        }
        batch_rows = static_cast<int>(rows.size());
        return model.Push(client);
      },
      [&](int epoch) -> Status {
        // After the clock; repeated (not the step) if a shard was lost.
        progress.samples += std::exchange(batch_rows, 0);
        if (client.clock() % 20 != 0) return Status::Ok();
        progress.epoch = epoch;
        progress.loss = loss;
        progress.samples_per_s =
            static_cast<float>(progress.samples / SecondsSince(start));
        return client.Report(progress);
      }));

  // Every worker has pushed its last gradient (the final pull waits for
  // them within the staleness bound): evaluate the trained model.
  TETHER_RETURN_IF_ERROR(model.Pull(client));
  const double accuracy = model.Accuracy(test);
  progress.epoch = o.epochs - 1;
  progress.test_accuracy = static_cast<float>(accuracy);
  progress.done = true;
  TETHER_RETURN_IF_ERROR(client.Report(progress));
  std::printf(
      "worker %d: %llu samples in %.1f s, last loss %.4f, test accuracy "
      "%.2f%% on %zu rows%s\n",
      client.rank(), static_cast<unsigned long long>(progress.samples),
      SecondsSince(start), loss, 100.0 * accuracy, test.rows,
      client.stop_requested() ? " (the run was stopped)" : "");
  return Status::Ok();
}

}  // namespace

int main(int argc, char** argv) {
  auto options = ParseFlags(argc, argv);
  if (!options.ok()) {
    std::fprintf(stderr, "fm-worker: %s\n", options.status().message().c_str());
    return 2;
  }
  tether::InitLogging("fm-worker");
  Status s = Run(*options);
  if (!s.ok()) {
    std::fprintf(stderr, "fm-worker: %s\n", s.ToString().c_str());
    return 1;
  }
  return 0;
}
