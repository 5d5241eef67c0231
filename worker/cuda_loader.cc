// MakeCudaBackend: loads the CUDA backend module (libtether_cuda.so, built
// from worker/cuda_backend.cu where CMake finds the CUDA toolkit) on first
// use, so that a worker on the CPU, and every tool and test, never loads the
// CUDA runtime or cuBLAS. The module is looked for next to the running
// executable, then one directory up (tests/), then on the loader's path.
#include <dlfcn.h>

#include <filesystem>
#include <mutex>

#include "worker/fc_backend.h"

namespace tether {
namespace {

using Factory = void (*)(const FcLayer*, size_t, int, int,
                         Result<std::unique_ptr<FcBackend>>*);
constexpr char kModule[] = "libtether_cuda.so";

// The factory, or why there is none. Loaded once; never unloaded (the
// backends it makes run its code).
Result<Factory> LoadFactory() {
  static std::once_flag once;
  static Result<Factory> factory = Status(Code::kUnavailable, "not loaded");
  std::call_once(once, [] {
    std::error_code ec;
    const auto exe = std::filesystem::read_symlink("/proc/self/exe", ec);
    std::vector<std::string> candidates;
    if (!ec) {
      candidates.push_back((exe.parent_path() / kModule).string());
      candidates.push_back(
          (exe.parent_path().parent_path() / kModule).string());
    }
    candidates.push_back(kModule);
    std::string why;
    for (const std::string& path : candidates) {
      void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
      if (handle == nullptr) {
        if (why.empty()) why = dlerror();
        continue;
      }
      auto* make =
          reinterpret_cast<Factory>(dlsym(handle, "tether_make_cuda_backend"));
      if (make == nullptr) {
        factory = Status(Code::kUnavailable,
                         path + " has no tether_make_cuda_backend");
        return;
      }
      factory = make;
      return;
    }
    factory = Status(Code::kUnavailable,
                     "this build has no CUDA backend (" + why +
                         "; CMake builds it where it finds the CUDA toolkit)");
  });
  return factory;
}

}  // namespace

Result<std::unique_ptr<FcBackend>> MakeCudaBackend(std::vector<FcLayer> layers,
                                                   int max_batch, int index) {
  Result<Factory> make = LoadFactory();
  if (!make.ok()) {
    return Unavailable("--device cuda:" + std::to_string(index) + ": " +
                       make.status().message());
  }
  Result<std::unique_ptr<FcBackend>> backend =
      Status(Code::kInternal, "the CUDA module made no backend");
  (*make)(layers.data(), layers.size(), max_batch, index, &backend);
  return backend;
}

}  // namespace tether
