// MakeCudaBackend: loads the CUDA backend module (libtether_cuda.so, built
// from worker/cuda_backend.cu where CMake finds the CUDA toolkit) on first
// use, so that a worker on the CPU, and every tool and test, never loads the
// CUDA runtime or cuBLAS. The module is looked for next to the running
// executable, then one directory up (tests/), then on the loader's path; it
// must come from the same build (tether_cuda_module_version).
#include <dlfcn.h>

#include <filesystem>
#include <mutex>
#include <string>
#include <vector>

#include "worker/fc_backend.h"

namespace tether {
namespace {

using Factory = void (*)(const FcLayer*, size_t, int, int,
                         Result<std::unique_ptr<FcBackend>>*);
using VersionFn = const char* (*)();
constexpr char kModule[] = "libtether_cuda.so";

// The release and interface revision this program was built with; the
// module reports its own (tether_cuda_module_version).
std::string ExpectedVersion() {
  return std::string(TETHER_VERSION) + "/fc" +
         std::to_string(kFcBackendRevision);
}

// The factory of a loaded module `where` names, if it comes from this build.
Result<Factory> FactoryOf(void* handle, const std::string& where) {
  auto* version =
      reinterpret_cast<VersionFn>(dlsym(handle, "tether_cuda_module_version"));
  const std::string theirs = version ? version() : "(none)";
  if (theirs != ExpectedVersion()) {
    return Status(Code::kUnavailable,
                  where + " is from another build (version " + theirs +
                      ", this program " + ExpectedVersion() +
                      "): rebuild both");
  }
  auto* make =
      reinterpret_cast<Factory>(dlsym(handle, "tether_make_cuda_backend"));
  if (make == nullptr) {
    return Status(Code::kUnavailable,
                  where + " has no tether_make_cuda_backend");
  }
  return make;
}

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
    for (const std::string& path : candidates) {
      if (!std::filesystem::exists(path, ec)) continue;
      // Found: from here on, any failure says what is wrong with it.
      void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
      if (handle == nullptr) {
        factory =
            Status(Code::kUnavailable,
                   "found " + path + " but could not load it: " + dlerror() +
                       " (the CUDA runtime and cuBLAS it was built "
                       "with must be installed)");
        return;
      }
      factory = FactoryOf(handle, path);
      return;
    }
    // Not next to the program: the loader's path, for an installed one.
    if (void* handle = dlopen(kModule, RTLD_NOW | RTLD_LOCAL)) {
      factory = FactoryOf(
          handle, std::string("the ") + kModule + " on the loader's path");
      return;
    }
    factory =
        Status(Code::kUnavailable,
               std::string("this build has no CUDA backend (no ") + kModule +
                   " next to the program; CMake builds it where it "
                   "finds the CUDA toolkit and a GPU, or with "
                   "-DTETHER_CUDA=ON)");
  });
  return factory;
}

}  // namespace

Result<std::unique_ptr<FcBackend>> MakeCudaBackend(std::vector<FcLayer> layers,
                                                   int max_batch, int index) {
  // What needs no GPU is checked before CUDA is loaded.
  const std::string dev = "--device cuda:" + std::to_string(index);
  if (index < 0) return InvalidArgument(dev + ": negative device index");
  if (Status s = CheckFcLayers(layers, max_batch); !s.ok()) {
    return InvalidArgument(dev + ": " + s.message());
  }
  if (layers.back().relu) {
    return InvalidArgument(dev + ": the last layer (" + layers.back().name +
                           ") has ReLU; the CUDA backend takes the loss on "
                           "the last layer's outputs before any activation");
  }
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
