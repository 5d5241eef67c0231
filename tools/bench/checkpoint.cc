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
#include <malloc.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <vector>

#include "schema/flags.h"
#include "server/param_store.h"
#include "tools/bench/percentiles.h"

namespace tether {
namespace {

using Clock = std::chrono::steady_clock;
double Since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

// Asks the kernel to drop every file under `dir` from the page cache
// (POSIX_FADV_DONTNEED on clean, synced pages: no root needed), so that the
// next read comes from the disk.
void DropFromCache(const std::string& dir) {
  std::error_code ec;
  for (const auto& e : std::filesystem::recursive_directory_iterator(dir, ec)) {
    if (!e.is_regular_file()) continue;
    int fd = open(e.path().c_str(), O_RDONLY);
    if (fd < 0) continue;
    fdatasync(fd);
    (void)posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    close(fd);
  }
}

// Reads `path` in 8 MiB reads; bytes per second.
Result<double> SequentialRead(const std::string& path) {
  int fd = open(path.c_str(), O_RDONLY);
  if (fd < 0) return Status(Code::kIoError, "cannot open " + path);
  std::vector<char> buffer(size_t{8} << 20);
  uint64_t done = 0;
  auto start = Clock::now();
  while (true) {
    ssize_t r = read(fd, buffer.data(), buffer.size());
    if (r < 0) {
      close(fd);
      return Status(Code::kIoError, "read of " + path + " failed");
    }
    if (r == 0) break;
    done += r;
  }
  close(fd);
  return done / Since(start);
}

// Writes `bytes` in 8 MiB writes to DIR/sequential.bin, then fsyncs.
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
  return bytes / Since(start);
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
  // The baseline is taken before and after the round (the disk's pace
  // drifts), and averaged.
  auto sequential_before = SequentialWrite(dir, 1200 * params / 100);
  if (!sequential_before.ok()) {
    std::cerr << sequential_before.status().message() << "\n";
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
  *sequential = (*sequential + *sequential_before) / 2;
  // Resume = open the store, read the round, restore it into a store of
  // its own, as a restarted shard does: cold (the store closed and every
  // file dropped from the page cache, so the read comes from the disk) and
  // warm (the files in the page cache). Memory freed by the pass before
  // goes back to the system first, since a new process has none to reuse.
  // Baseline: a sequential read of the same bytes, cold and warm alike.
  // Medians of 3 passes each (the first warm pass after a cold one pays the
  // kernel's page-cache bookkeeping, 2-4x slower than the next).
  const std::string file = dir + "/sequential.bin";
  auto resume = [&](bool cold) -> Result<double> {
    ckpt->reset();  // a store's open files keep their mapped pages cached
    if (cold) DropFromCache(dir);
    malloc_trim(0);
    auto start = Clock::now();
    ckpt = CheckpointStore::Open(dir + "/db");
    if (!ckpt.ok()) return ckpt.status();
    auto loaded = (*ckpt)->ReadShard(1);
    if (!loaded.ok()) return loaded.status();
    ParamStore restored(1, 65536, adam);
    TETHER_RETURN_IF_ERROR(restored.Restore(loaded->tensors, loaded->tables));
    return *written / Since(start);
  };
  auto read = [&](bool cold) {
    if (cold) DropFromCache(dir);
    return SequentialRead(file);
  };
  // The median rate of 3 passes of `pass`.
  auto median = [](auto pass) -> Result<double> {
    std::vector<double> rates;
    for (int i = 0; i < 3; ++i) {
      Result<double> rate = pass();
      if (!rate.ok()) return rate.status();
      rates.push_back(*rate);
    }
    return bench::Summarize(rates).median;
  };
  auto cold = median([&] { return resume(/*cold=*/true); });
  auto cold_read = median([&] { return read(/*cold=*/true); });
  auto warm = median([&] { return resume(/*cold=*/false); });
  auto warm_read = median([&] { return read(/*cold=*/false); });
  for (const Status& s :
       {warm.status(), warm_read.status(), cold.status(), cold_read.status()}) {
    if (!s.ok()) {
      std::cerr << s.message() << "\n";
      return 1;
    }
  }
  const double rate = *written / write_secs;
  std::printf(
      "checkpoint write, %llu params with Adam (%.2f GB): %.2f GB/s | "
      "sequential write of as many bytes (before and after, mean): %.2f GB/s | "
      "ratio %.2f\n",
      static_cast<unsigned long long>(params), *written / 1e9, rate / 1e9,
      *sequential / 1e9, rate / *sequential);
  std::printf(
      "resume, warm page cache (open + read + restore, median of 3): %.2f "
      "GB/s | "
      "sequential "
      "read, warm: %.2f GB/s | ratio %.2f\n",
      *warm / 1e9, *warm_read / 1e9, *warm / *warm_read);
  std::printf(
      "resume, cold (files dropped from the page cache; open + read + "
      "restore, median of 3): %.2f GB/s | "
      "sequential read, cold: %.2f GB/s | ratio %.2f\n",
      *cold / 1e9, *cold_read / 1e9, *cold / *cold_read);
  std::printf(
      "training pause (snapshot under the shard lock, copy-on-write): %.3f s = "
      "%.2f GB/s | "
      "write: %.2f s | ratio %.3f\n",
      pause, *written / pause / 1e9, write_secs, pause / write_secs);
  ckpt->reset();  // closed before its files go
  std::filesystem::remove_all(dir, ec);
  return 0;
}

}  // namespace
}  // namespace tether

int main(int argc, char** argv) { return tether::Main(argc, argv); }
