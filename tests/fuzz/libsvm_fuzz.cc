// libFuzzer target: a LIBSVM file for sparse-lr, read to the end in
// batches, as tether-worker streams it.
#include <unistd.h>

#include <cstdint>
#include <fstream>
#include <string>
#include <vector>

#include "worker/dataset.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path =
      "/dev/shm/tether-fuzz-" + std::to_string(getpid()) + ".svm";
  std::ofstream(path, std::ios::binary)
      .write(reinterpret_cast<const char*>(data), size);
  auto reader = tether::LibsvmReader::Open(path);
  if (reader.ok()) {
    std::vector<tether::SparseExample> batch;
    for (int i = 0; i < 1000; ++i) {
      auto n = (*reader)->Next(64, &batch);
      if (!n.ok() || *n == 0) break;
    }
  }
  unlink(path.c_str());
  return 0;
}
