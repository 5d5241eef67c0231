// tether-bench-checkpoint: how fast a shard writes and loads a checkpoint
// round, against a plain sequential write of the same bytes to the same
// disk in the same run, and how long the copy under the shard's lock (the
// pause training sees) takes.
//
//   tether-bench-checkpoint --dir /var/tmp/x --params 100000000
//
// Prints one line per figure: figure, baseline, ratio.
#include "server/checkpoint.h"

#include <fcntl.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <vector>

#include "schema/flags.h"
#include "server/param_store.h"

namespace tether {
namespace {

using Clock = std::chrono::steady_clock;
double Since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

// Writes `bytes` in 8 MiB writes to a new file under `dir`, then fsyncs.
Result<double> SequentialWrite(const std::string& dir, uint64_t bytes) {
  std::string path = dir + "/sequential.bin";
  int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd < 0) return Status(Code::kIoError, "cannot create " + path);
  std::vector<char> buffer(size_t{8} << 20, 7);
  auto start = Clock::now();
  for (uint64_t done = 0; done < bytes;) {
    size_t n = std::min<uint64_t>(buffer.size(), bytes - done);
    ssize_t w = write(fd, buffer.data(), n);
    if (w <= 0) {
      close(fd);
      return Status(Code::kIoError, "write to " + path + " failed");
    }
    done += w;
  }
  fsync(fd);
  close(fd);
  double secs = Since(start);
  std::filesystem::remove(path);
  return bytes / secs;
}

int Main(int argc, char** argv) {
  std::string dir = "/var/tmp/tether-bench-checkpoint";
  uint64_t params = 100'000'000;
  FlagParser p("tether-bench-checkpoint",
               "checkpoint write/resume rate vs a sequential write");
  p.AddString("dir", &dir, "directory on the disk to measure (emptied)");
  p.AddUint64("params", &params, "parameters (Adam: 3 floats each)");
  if (auto exit_code = p.ParseForMain(argc, argv)) return *exit_code;
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
  std::filesystem::create_directories(dir, ec);
  if (ec) {
    std::cerr << "tether-bench-checkpoint: --dir: " << ec.message() << "\n";
    return 1;
  }
  OptimizerOptions adam;
  adam.kind = OptimizerKind::kAdam;
  ParamStore store(1, 65536, adam);
  auto id = store.DefineTensor("w", {params}, {InitSpec::Kind::kUniform, 0.1f});
  if (!id.ok()) {
    std::cerr << id.status().message() << "\n";
    return 1;
  }
  std::vector<float> grad(65536, 0.01f);
  for (uint64_t b = 0; b * 65536 < params; ++b) {
    size_t n = std::min<uint64_t>(65536, params - b * 65536);
    (void)store.ApplyBlock(*id, b, std::span(grad.data(), n));
    if (b % 160 == 0) {
      std::fprintf(stderr, "\rfilling: %.0f%%", 100.0 * b * 65536 / params);
    }
  }
  std::fprintf(stderr, "\rfilling: done   \n");

  auto pause_start = Clock::now();
  ShardSnapshot snapshot;
  snapshot.round = 1;
  snapshot.settings.optimizer = adam;
  snapshot.settings.block_size = 65536;
  store.Snapshot(&snapshot.tensors, &snapshot.tables);
  double pause = Since(pause_start);

  auto ckpt = CheckpointStore::Open(dir + "/db");
  if (!ckpt.ok()) {
    std::cerr << ckpt.status().message() << "\n";
    return 1;
  }
  auto write_start = Clock::now();
  auto written = (*ckpt)->WriteShard(snapshot);
  double write_secs = Since(write_start);
  if (!written.ok()) {
    std::cerr << written.status().message() << "\n";
    return 1;
  }
  auto sequential = SequentialWrite(dir, *written);
  if (!sequential.ok()) {
    std::cerr << sequential.status().message() << "\n";
    return 1;
  }
  auto read_start = Clock::now();
  auto loaded = (*ckpt)->ReadShard(1);
  ParamStore restored(1, 65536, adam);
  Status s = loaded.ok() ? restored.Restore(loaded->tensors, loaded->tables)
                         : loaded.status();
  double read_secs = Since(read_start);
  if (!s.ok()) {
    std::cerr << s.message() << "\n";
    return 1;
  }
  const double rate = *written / write_secs;
  std::printf(
      "checkpoint write, %llu params with Adam (%.2f GB): %.2f GB/s | "
      "sequential write of the same bytes: %.2f GB/s | ratio %.2f\n",
      static_cast<unsigned long long>(params), *written / 1e9, rate / 1e9,
      *sequential / 1e9, rate / *sequential);
  std::printf(
      "resume (read + restore): %.2f s = %.2f GB/s | sequential write: "
      "%.2f GB/s | ratio %.2f\n",
      read_secs, *written / read_secs / 1e9, *sequential / 1e9,
      (*written / read_secs) / *sequential);
  std::printf(
      "training pause (snapshot under the shard lock, copy-on-write): %.3f s = "
      "%.2f GB/s | "
      "write: %.2f s | ratio %.3f\n",
      pause, *written / pause / 1e9, write_secs, pause / write_secs);
  std::filesystem::remove_all(dir, ec);
  return 0;
}

}  // namespace
}  // namespace tether

int main(int argc, char** argv) { return tether::Main(argc, argv); }
