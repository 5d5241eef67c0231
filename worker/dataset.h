// Training data for tether-worker: dense labelled images from IDX files
// (Fashion-MNIST from Debian's dataset-fashion-mnist), and sparse examples
// streamed from LIBSVM text files, which may be larger than memory.
//
// Errors name the file (and for LIBSVM the line) and what is wrong.
// Loaded datasets are plain values; LibsvmReader is not thread-safe.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "schema/status.h"

namespace tether {

// Where Debian's dataset-fashion-mnist package installs its files.
inline constexpr const char* kFashionMnistDir =
    "/usr/share/datasets/fashion-mnist";

// Rows of `features` floats in [0, 1] with an integer label each.
struct DenseDataset {
  size_t rows = 0;
  size_t features = 0;
  int classes = 0;         // 1 + the largest label
  std::vector<float> x;    // rows * features, row after row
  std::vector<int32_t> y;  // rows
};

// Copies rows `rows` (indices into `d`) into x (rows.size() * features
// floats) and their labels into y (rows.size()), in that order: a batch.
void GatherRows(const DenseDataset& d, std::span<const uint32_t> rows, float* x,
                int32_t* y);

// Loads an IDX images file (magic 0x00000803, u8 pixels, scaled to [0, 1])
// and an IDX labels file (magic 0x00000801, u8 labels). Either may be
// gzip-compressed (detected by its first two bytes). kNotFound for a
// missing file; kInvalidArgument for a wrong magic number, a truncated
// file, or image and label counts that differ; each names the file.
Result<DenseDataset> LoadIdx(const std::string& images_path,
                             const std::string& labels_path);

// Fashion-MNIST's training (60,000) or test (10,000) split from `dir`.
// When the files are missing the error says to install the Debian package
// dataset-fashion-mnist.
Result<DenseDataset> LoadFashionMnist(
    bool train, const std::string& dir = kFashionMnistDir);

// One LIBSVM example: "<label> <key>:<value> <key>:<value> ...".
struct SparseExample {
  float label = 0;  // 0 or 1 after reading: -1 and 0 map to 0, +1 to 1
  std::vector<uint64_t> keys;
  std::vector<float> values;
};

// Streams a LIBSVM text file (optionally gzip-compressed) without holding
// it in memory. Only lines whose 0-based line number % shares == share are
// returned, so workers read disjoint shares of one file.
class LibsvmReader {
 public:
  static Result<std::unique_ptr<LibsvmReader>> Open(const std::string& path,
                                                    int share = 0,
                                                    int shares = 1);
  ~LibsvmReader();

  // Replaces `out` with up to `max` examples of this share; returns how
  // many (0 at the end of the file). kInvalidArgument names the file and
  // line of a malformed line (bad label, missing ':', bad key or value).
  Result<size_t> Next(size_t max, std::vector<SparseExample>* out);
  // Starts again from the first line (a new epoch).
  Status Rewind();
  const std::string& path() const { return path_; }

 private:
  struct Impl;
  LibsvmReader(std::string path, int share, int shares,
               std::unique_ptr<Impl> impl);
  std::string path_;
  int share_;
  int shares_;
  std::unique_ptr<Impl> impl_;
};

}  // namespace tether
