#include "worker/fc_backend.h"

#include <charconv>

namespace tether {

std::string Device::ToString() const {
  return kind == Kind::kCpu ? "cpu" : "cuda:" + std::to_string(index);
}

Result<Device> ParseDevice(const std::string& text, const std::string& flag) {
  Device device;
  if (text == "cpu") return device;
  device.kind = Device::Kind::kCuda;
  if (text == "cuda") return device;
  constexpr std::string_view kCuda = "cuda:";
  if (text.starts_with(kCuda) && text.size() > kCuda.size()) {
    const char* first = text.data() + kCuda.size();
    const char* last = text.data() + text.size();
    auto [end, ec] = std::from_chars(first, last, device.index);
    if (ec == std::errc() && end == last && device.index >= 0) return device;
  }
  return InvalidArgument(flag + ": expected cpu, cuda or cuda:N, got '" + text +
                         "'");
}

Status CheckFcLayers(const std::vector<FcLayer>& layers, int max_batch) {
  if (layers.empty()) return InvalidArgument("no layers");
  if (max_batch < 1) {
    return InvalidArgument("max_batch must be >= 1, got " +
                           std::to_string(max_batch));
  }
  for (size_t l = 0; l < layers.size(); ++l) {
    const FcLayer& d = layers[l];
    if (d.in < 1 || d.out < 1) {
      return InvalidArgument("layer " + d.name + " is [" +
                             std::to_string(d.out) + ", " +
                             std::to_string(d.in) + "]; both must be >= 1");
    }
    if (l > 0 && d.in != layers[l - 1].out) {
      return InvalidArgument("layer " + d.name + " takes " +
                             std::to_string(d.in) + " inputs but layer " +
                             layers[l - 1].name + " gives " +
                             std::to_string(layers[l - 1].out));
    }
  }
  return Status::Ok();
}

Result<std::unique_ptr<FcBackend>> MakeFcBackend(const Device& device,
                                                 std::vector<FcLayer> layers,
                                                 int max_batch, int threads) {
  if (device.kind == Device::Kind::kCuda) {
    return MakeCudaBackend(std::move(layers), max_batch, device.index);
  }
  return MakeOneDnnBackend(std::move(layers), max_batch, threads);
}

}  // namespace tether
