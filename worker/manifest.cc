#include "worker/manifest.h"

#include <boost/json.hpp>

#include "schema/build_info.h"
#include "schema/provenance.h"
#include "worker/dataset.h"

namespace tether {

namespace json = boost::json;

std::vector<std::string> DataFiles(const std::string& spec, bool train) {
  if (spec.empty()) return {};
  if (spec == "fashion-mnist") {
    const std::string prefix =
        std::string(kFashionMnistDir) + (train ? "/train" : "/t10k");
    return {prefix + "-images-idx3-ubyte.gz", prefix + "-labels-idx1-ubyte.gz"};
  }
  const size_t comma = spec.find(',');
  if (comma == std::string::npos) return {spec};
  return {spec.substr(0, comma), spec.substr(comma + 1)};
}

std::string WorkerManifest(const TrainerOptions& o,
                           const std::vector<std::string>& argv) {
  json::array files;
  auto add = [&files](const std::vector<std::string>& paths) {
    for (const std::string& path : paths) {
      Result<FileDigest> digest = Sha256File(path);
      if (digest.ok()) {
        files.push_back(json::object{{"path", path},
                                     {"sha256", digest->sha256},
                                     {"bytes", digest->bytes}});
      } else {
        files.push_back(
            json::object{{"path", path}, {"error", digest.status().message()}});
      }
    }
  };
  add(DataFiles(o.data, /*train=*/true));
  std::string test = o.test_data;
  if (test.empty() && o.data == "fashion-mnist") test = o.data;
  if (test != o.data || o.data == "fashion-mnist") {
    add(DataFiles(test, /*train=*/false));
  }
  json::array args;
  for (const std::string& a : argv) args.push_back(json::value(a));
  json::object settings{{"model", o.model},
                        {"hidden", o.model == "mlp" ? o.hidden : ""},
                        {"batch", o.batch},
                        {"epochs", o.epochs},
                        {"threads", o.threads},
                        {"device", o.device},
                        {"slowdown", o.slowdown},
                        {"chunk_rows", o.chunk_rows},
                        {"staleness", o.staleness},
                        {"overlap_steps", o.overlap_steps},
                        {"eval_every", o.eval_every},
                        {"data", o.data},
                        {"test_data", test},
                        {"wire_dtype", o.wire_dtype},
                        {"direct_memory", o.direct_memory}};
  return json::serialize(json::object{{"program", "tether-worker"},
                                      {"version", TetherVersion()},
                                      {"commit", TetherCommit()},
                                      {"host", HostName()},
                                      {"argv", std::move(args)},
                                      {"settings", std::move(settings)},
                                      {"data_files", std::move(files)}});
}

}  // namespace tether
