// libFuzzer target: IDX image and label files as a user might hand them to
// `--data IMAGES,LABELS`. The first byte says where the input splits into
// the two files.
#include <unistd.h>

#include <cstdint>
#include <fstream>
#include <string>

#include "worker/dataset.h"

namespace {

std::string Write(const std::string& name, const uint8_t* data, size_t n) {
  const std::string path =
      "/dev/shm/tether-fuzz-" + std::to_string(getpid()) + "-" + name;
  std::ofstream(path, std::ios::binary)
      .write(reinterpret_cast<const char*>(data), n);
  return path;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const size_t split = std::min<size_t>(size - 1, data[0] * 4);
  const std::string images = Write("images", data + 1, split);
  const std::string labels =
      Write("labels", data + 1 + split, size - 1 - split);
  (void)tether::LoadIdx(images, labels);
  unlink(images.c_str());
  unlink(labels.c_str());
  return 0;
}
