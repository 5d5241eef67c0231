// The run manifest, with real processes: what a run records about itself
// (settings, every worker's settings and data files with their SHA-256,
// tether version and commit, hosts, commands), and a new run started from
// it with tether-up --manifest ending bit-identical (s = 0).
#include <gtest/gtest.h>

#include <boost/json.hpp>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "tests/support/cluster.h"

namespace tether::testing {
namespace {

namespace json = boost::json;

// 60000 rows / 2 workers / batch 200 = 150 clocks: the last round is the
// end of the run.
const std::vector<std::string> kRun = {
    "--shards", "2", "--workers", "2", "--staleness", "0", "--epochs", "1",
    "--batch", "200", "--slow", "1", "--slowdown", "2", "--seed", "97",
    "--optimizer", "momentum", "--lr", "0.05", "--checkpoint-every", "75",
    "--target-accuracy", "0",
    // Fixed shares: chunks go to whoever
    // asks first, which timing decides.
    "--chunk-rows", "0"};

int TetherUp(const std::string& dir, const std::vector<std::string>& flags) {
  std::vector<std::string> argv = {TETHER_UP_BIN, "--http", "127.0.0.1:0",
                                   "--log-dir", dir};
  argv.insert(argv.end(), flags.begin(), flags.end());
  std::string output;
  auto code = RunToExit(argv, &output, 240000);
  EXPECT_TRUE(code.ok()) << code.status().ToString();
  EXPECT_EQ(code.ok() ? *code : -1, 0) << output;
  return code.ok() ? *code : -1;
}

json::value ReadJson(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  boost::system::error_code ec;
  json::value v = json::parse(text.str(), ec);
  EXPECT_FALSE(ec) << path << ": " << text.str();
  return v;
}

std::string Export(const std::string& dir, const std::string& out) {
  std::string output;
  auto code =
      RunToExit({TETHER_CKPT_BIN, "export", "--data-dir", dir, "--round", "150",
                 "--format", "safetensors", "--out", out},
                &output, 60000);
  EXPECT_TRUE(code.ok() && *code == 0) << output;
  std::ifstream in(out, std::ios::binary);
  std::stringstream bytes;
  bytes << in.rdbuf();
  return bytes.str();
}

TEST(Manifest, RunRecordsItselfAndARunFromItsManifestIsBitIdentical) {
  TempDir dir;
  const std::string first = dir.path() + "/first";
  ASSERT_EQ(TetherUp(first, kRun), 0);

  // Written by shard 0 at the start, and kept in every round.
  const json::value m = ReadJson(first + "/shard0/manifest.json");
  ASSERT_TRUE(m.is_object());
  const json::object& o = m.as_object();
  EXPECT_EQ(o.at("run").at("seed").as_int64(), 97);
  EXPECT_EQ(o.at("run").at("optimizer").at("kind").as_string(), "momentum");
  const std::string commit(o.at("tether").at("commit").as_string());
  EXPECT_TRUE(commit == "unknown" || commit.size() >= 40) << commit;
  ASSERT_EQ(o.at("shards").as_array().size(), 2u);
  for (const json::value& s : o.at("shards").as_array()) {
    EXPECT_EQ(s.at("program").as_string(), "tether-server");
    EXPECT_FALSE(s.at("host").as_string().empty());
    EXPECT_NE(s.at("command").as_string().find("tether-server"),
              std::string::npos);
  }
  const json::array& workers = o.at("workers").as_array();
  ASSERT_EQ(workers.size(), 2u);
  for (int r = 0; r < 2; ++r) {
    const json::object& w = workers[r].as_object();
    EXPECT_EQ(w.at("rank").as_int64(), r);
    EXPECT_EQ(w.at("program").as_string(), "tether-worker");
    EXPECT_FALSE(w.at("host").as_string().empty());
    EXPECT_EQ(w.at("settings").at("batch").as_int64(), 200);
    EXPECT_EQ(w.at("settings").at("model").as_string(), "mlp");
    EXPECT_EQ(w.at("settings").at("slowdown").to_number<double>(),
              r == 1 ? 2.0 : 1.0);
    const json::array& files = w.at("data_files").as_array();
    ASSERT_GE(files.size(), 2u);
    EXPECT_NE(files[0].at("path").as_string().find("train-images"),
              std::string::npos);
    EXPECT_EQ(files[0].at("sha256").as_string().size(), 64u);
  }

  // tether-ckpt shows it, and exports it from the round.
  std::string shown;
  auto code = RunToExit({TETHER_CKPT_BIN, "show", first, "--manifest-out",
                         dir.path() + "/exported.json"},
                        &shown, 60000);
  ASSERT_TRUE(code.ok() && *code == 0) << shown;
  EXPECT_NE(shown.find("manifest:"), std::string::npos) << shown;
  EXPECT_NE(
      shown.find(
          "sha256 " +
          std::string(
              workers[0].at("data_files").at(0).at("sha256").as_string())),
      std::string::npos)
      << shown;

  // A new run from the exported manifest: the same settings, the same
  // workers, slowdown included, and the same weights at the end.
  const std::string second = dir.path() + "/second";
  ASSERT_EQ(TetherUp(second, {"--manifest", dir.path() + "/exported.json",
                              "--target-accuracy", "0"}),
            0);
  const std::string a = Export(first, dir.path() + "/first.safetensors");
  const std::string b = Export(second, dir.path() + "/second.safetensors");
  ASSERT_GT(a.size(), 100000u);
  EXPECT_TRUE(a == b) << "the run from the manifest ended elsewhere";
  const json::value again = ReadJson(second + "/shard0/manifest.json");
  EXPECT_EQ(again.at("workers").at(1).at("settings").at("slowdown"),
            json::value(2.0));
}

TEST(Manifest, ChangedDataFileOrBadManifestIsRefusedBeforeStarting) {
  TempDir dir;
  std::string output;
  // Not a manifest.
  {
    std::ofstream(dir.path() + "/bad.json") << "{\"run\": 3}";
    auto code =
        RunToExit({TETHER_UP_BIN, "--manifest", dir.path() + "/bad.json",
                   "--log-dir", dir.path() + "/bad"},
                  &output, 30000);
    ASSERT_TRUE(code.ok());
    EXPECT_EQ(*code, 2) << output;
    EXPECT_NE(output.find("--manifest " + dir.path() + "/bad.json"),
              std::string::npos)
        << output;
  }
  // A worker whose data file changed since the run.
  const std::string data = dir.path() + "/images";
  std::filesystem::copy_file(
      "/usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz", data);
  json::object manifest{
      {"run", json::parse(R"({"num_shards": 1, "num_workers": 1, "seed": 1,
         "block_size": 65536, "optimizer": {"kind": "sgd", "lr": 0.1,
         "momentum": 0.9, "beta1": 0.9, "beta2": 0.999, "epsilon": 1e-8},
         "max_staleness": -1, "reject_staleness": -1, "checkpoint_every": 0,
         "resume_round": -1})")},
      {"workers",
       json::array{json::object{
           {"argv",
            json::array{"tether-worker", "--data", data + ",/dev/null"}},
           {"data_files",
            json::array{json::object{{"path", data},
                                     {"sha256", std::string(64, '0')}}}}}}}};
  std::ofstream(dir.path() + "/m.json") << json::serialize(manifest);
  auto code = RunToExit({TETHER_UP_BIN, "--manifest", dir.path() + "/m.json",
                         "--log-dir", dir.path() + "/m"},
                        &output, 30000);
  ASSERT_TRUE(code.ok());
  EXPECT_EQ(*code, 1) << output;
  EXPECT_NE(output.find("worker 0's data file " + data +
                        " has changed since the run"),
            std::string::npos)
      << output;
}

}  // namespace
}  // namespace tether::testing
