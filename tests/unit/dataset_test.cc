#include "worker/dataset.h"

#include <gtest/gtest.h>
#include <stdlib.h>
#include <zlib.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <set>
#include <string>
#include <vector>

#include "worker/training_loop.h"

namespace tether {
namespace {

#define EXPECT_CONTAINS(haystack, needle) \
  EXPECT_PRED_FORMAT2(::testing::IsSubstring, needle, haystack)

// A fresh directory under $TMPDIR (or /tmp), removed with its contents.
class TempDir {
 public:
  TempDir() {
    const char* base = std::getenv("TMPDIR");
    std::string pattern =
        std::string(base != nullptr ? base : "/tmp") + "/dataset_test.XXXXXX";
    if (mkdtemp(pattern.data()) != nullptr) path_ = pattern;
  }
  ~TempDir() {
    std::error_code ec;
    if (!path_.empty()) std::filesystem::remove_all(path_, ec);
  }
  std::string File(const std::string& name) const { return path_ + "/" + name; }
  bool ok() const { return !path_.empty(); }

 private:
  std::string path_;
};

void WriteFile(const std::string& path, const std::vector<uint8_t>& bytes) {
  FILE* f = std::fopen(path.c_str(), "wb");
  ASSERT_NE(f, nullptr) << path;
  ASSERT_EQ(std::fwrite(bytes.data(), 1, bytes.size(), f), bytes.size());
  ASSERT_EQ(std::fclose(f), 0);
}

void WriteGzip(const std::string& path, const std::vector<uint8_t>& bytes) {
  gzFile f = gzopen(path.c_str(), "wb");
  ASSERT_NE(f, nullptr) << path;
  ASSERT_EQ(gzwrite(f, bytes.data(), static_cast<unsigned>(bytes.size())),
            static_cast<int>(bytes.size()));
  ASSERT_EQ(gzclose(f), Z_OK);
}

void WriteText(const std::string& path, const std::string& text) {
  WriteFile(path, std::vector<uint8_t>(text.begin(), text.end()));
}

void PutBigEndian32(std::vector<uint8_t>* out, uint32_t v) {
  out->push_back(static_cast<uint8_t>(v >> 24));
  out->push_back(static_cast<uint8_t>(v >> 16));
  out->push_back(static_cast<uint8_t>(v >> 8));
  out->push_back(static_cast<uint8_t>(v));
}

// 3 images of 2x2 pixels and their labels.
const std::vector<uint8_t> kPixels = {0, 255, 51, 102, 1,  2,
                                      3, 4,   10, 20,  30, 40};
const std::vector<uint8_t> kLabels = {7, 0, 3};

std::vector<uint8_t> Images(uint32_t magic, uint32_t count,
                            const std::vector<uint8_t>& pixels) {
  std::vector<uint8_t> out;
  PutBigEndian32(&out, magic);
  PutBigEndian32(&out, count);
  PutBigEndian32(&out, 2);
  PutBigEndian32(&out, 2);
  out.insert(out.end(), pixels.begin(), pixels.end());
  return out;
}

std::vector<uint8_t> Labels(uint32_t count,
                            const std::vector<uint8_t>& labels) {
  std::vector<uint8_t> out;
  PutBigEndian32(&out, 0x00000801);
  PutBigEndian32(&out, count);
  out.insert(out.end(), labels.begin(), labels.end());
  return out;
}

void ExpectSmallDataset(const DenseDataset& ds) {
  EXPECT_EQ(ds.rows, 3u);
  EXPECT_EQ(ds.features, 4u);
  EXPECT_EQ(ds.classes, 8);
  ASSERT_EQ(ds.x.size(), kPixels.size());
  for (size_t i = 0; i < kPixels.size(); ++i) {
    EXPECT_EQ(ds.x[i], kPixels[i] / 255.0f) << i;
  }
  EXPECT_EQ(ds.y, std::vector<int32_t>({7, 0, 3}));
}

TEST(Dataset, LoadsPlainIdxValuesAndLabelsExactly) {
  TempDir dir;
  ASSERT_TRUE(dir.ok());
  WriteFile(dir.File("img"), Images(0x00000803, 3, kPixels));
  WriteFile(dir.File("lbl"), Labels(3, kLabels));
  auto ds = LoadIdx(dir.File("img"), dir.File("lbl"));
  ASSERT_TRUE(ds.ok()) << ds.status().ToString();
  ExpectSmallDataset(*ds);
  EXPECT_EQ(ds->x[1], 1.0f);
  EXPECT_EQ(ds->x[0], 0.0f);
}

TEST(Dataset, LoadsGzipIdxValuesAndLabelsExactly) {
  TempDir dir;
  ASSERT_TRUE(dir.ok());
  WriteGzip(dir.File("img.gz"), Images(0x00000803, 3, kPixels));
  WriteGzip(dir.File("lbl.gz"), Labels(3, kLabels));
  auto ds = LoadIdx(dir.File("img.gz"), dir.File("lbl.gz"));
  ASSERT_TRUE(ds.ok()) << ds.status().ToString();
  ExpectSmallDataset(*ds);
}

TEST(Dataset, WrongMagicNamesFile) {
  TempDir dir;
  ASSERT_TRUE(dir.ok());
  // A labels file where the images file should be.
  WriteFile(dir.File("img"), Labels(3, kLabels));
  WriteFile(dir.File("lbl"), Labels(3, kLabels));
  auto ds = LoadIdx(dir.File("img"), dir.File("lbl"));
  ASSERT_FALSE(ds.ok());
  EXPECT_EQ(ds.status().code(), Code::kInvalidArgument);
  EXPECT_CONTAINS(ds.status().message(), dir.File("img"));
  EXPECT_CONTAINS(ds.status().message(), "magic");
}

TEST(Dataset, TruncatedImagesNamesFile) {
  TempDir dir;
  ASSERT_TRUE(dir.ok());
  std::vector<uint8_t> short_pixels(kPixels.begin(), kPixels.end() - 1);
  WriteGzip(dir.File("img.gz"), Images(0x00000803, 3, short_pixels));
  WriteFile(dir.File("lbl"), Labels(3, kLabels));
  auto ds = LoadIdx(dir.File("img.gz"), dir.File("lbl"));
  ASSERT_FALSE(ds.ok());
  EXPECT_EQ(ds.status().code(), Code::kInvalidArgument);
  EXPECT_CONTAINS(ds.status().message(), dir.File("img.gz"));
  EXPECT_CONTAINS(ds.status().message(), "truncated");
}

TEST(Dataset, TruncatedHeaderNamesFile) {
  TempDir dir;
  ASSERT_TRUE(dir.ok());
  WriteFile(dir.File("img"), {0, 0, 8, 3, 0, 0});
  WriteFile(dir.File("lbl"), Labels(3, kLabels));
  auto ds = LoadIdx(dir.File("img"), dir.File("lbl"));
  ASSERT_FALSE(ds.ok());
  EXPECT_EQ(ds.status().code(), Code::kInvalidArgument);
  EXPECT_CONTAINS(ds.status().message(), dir.File("img"));
  EXPECT_CONTAINS(ds.status().message(), "truncated");
}

TEST(Dataset, CountMismatchRejected) {
  TempDir dir;
  ASSERT_TRUE(dir.ok());
  WriteFile(dir.File("img"), Images(0x00000803, 3, kPixels));
  WriteFile(dir.File("lbl"), Labels(2, {7, 0}));
  auto ds = LoadIdx(dir.File("img"), dir.File("lbl"));
  ASSERT_FALSE(ds.ok());
  EXPECT_EQ(ds.status().code(), Code::kInvalidArgument);
  EXPECT_CONTAINS(ds.status().message(), dir.File("img"));
  EXPECT_CONTAINS(ds.status().message(), dir.File("lbl"));
}

TEST(Dataset, MissingFileIsNotFound) {
  TempDir dir;
  ASSERT_TRUE(dir.ok());
  WriteFile(dir.File("img"), Images(0x00000803, 3, kPixels));
  auto ds = LoadIdx(dir.File("img"), dir.File("nope"));
  ASSERT_FALSE(ds.ok());
  EXPECT_EQ(ds.status().code(), Code::kNotFound);
  EXPECT_CONTAINS(ds.status().message(), dir.File("nope"));
}

TEST(Dataset, MissingFashionMnistNamesPackage) {
  auto ds = LoadFashionMnist(true, "/nonexistent");
  ASSERT_FALSE(ds.ok());
  EXPECT_EQ(ds.status().code(), Code::kNotFound);
  EXPECT_CONTAINS(ds.status().message(), "/nonexistent/train-images");
  EXPECT_CONTAINS(ds.status().message(), "dataset-fashion-mnist");
}

// The Debian package is a build dependency (tools/setup), so its absence
// is a failure, not a skip.
TEST(Dataset, FashionMnistLoads) {
  ASSERT_TRUE(std::filesystem::exists(kFashionMnistDir))
      << kFashionMnistDir << " missing; run tools/setup";
  auto train = LoadFashionMnist(true);
  ASSERT_TRUE(train.ok()) << train.status().ToString();
  EXPECT_EQ(train->rows, 60000u);
  EXPECT_EQ(train->features, 784u);
  EXPECT_EQ(train->classes, 10);
  ASSERT_EQ(train->x.size(), 60000u * 784u);
  ASSERT_EQ(train->y.size(), 60000u);
  for (int32_t y : train->y) ASSERT_TRUE(y >= 0 && y < 10) << y;
  float lo = 1, hi = 0;
  for (float v : train->x) {
    lo = std::min(lo, v);
    hi = std::max(hi, v);
  }
  EXPECT_EQ(lo, 0.0f);
  EXPECT_EQ(hi, 1.0f);

  auto test = LoadFashionMnist(false);
  ASSERT_TRUE(test.ok()) << test.status().ToString();
  EXPECT_EQ(test->rows, 10000u);
  EXPECT_EQ(test->features, 784u);
  EXPECT_EQ(test->classes, 10);
}

TEST(WorkerShare, DisjointAndComplete) {
  const size_t rows = 1003;
  const int workers = 4;
  std::vector<int> seen(rows, 0);
  for (int rank = 0; rank < workers; ++rank) {
    for (uint32_t i : WorkerShare(rows, rank, workers, 42, 3)) {
      ASSERT_LT(i, rows);
      EXPECT_EQ(static_cast<int>(i % workers), rank) << i;
      ++seen[i];
    }
  }
  for (size_t i = 0; i < rows; ++i) EXPECT_EQ(seen[i], 1) << "row " << i;
}

TEST(WorkerShare, DeterministicAndEpochDependent) {
  auto a = WorkerShare(1000, 1, 3, 7, 0);
  EXPECT_EQ(a, WorkerShare(1000, 1, 3, 7, 0));
  EXPECT_NE(a, WorkerShare(1000, 1, 3, 7, 1));
  EXPECT_NE(a, WorkerShare(1000, 1, 3, 8, 0));
  // Shuffled, not in row order.
  auto sorted = a;
  std::sort(sorted.begin(), sorted.end());
  EXPECT_NE(a, sorted);
  // Pinned so that a change of generator or shuffle, which would change
  // every run's order, is noticed. mt19937_64 is fully specified by the
  // standard, so these hold with any standard library.
  EXPECT_EQ(WorkerShare(10, 0, 1, 1, 0),
            std::vector<uint32_t>({4, 0, 7, 5, 2, 8, 3, 1, 6, 9}));
  EXPECT_EQ(WorkerShare(12, 1, 3, 99, 2), std::vector<uint32_t>({1, 7, 4, 10}));
}

TEST(WorkerShare, BadRankGivesNothing) {
  EXPECT_TRUE(WorkerShare(10, 3, 3, 1, 0).empty());
  EXPECT_TRUE(WorkerShare(10, 0, 0, 1, 0).empty());
  EXPECT_TRUE(WorkerShare(10, -1, 2, 1, 0).empty());
}

// Reads every example of `reader` in batches of `batch`.
std::vector<SparseExample> ReadAll(LibsvmReader& reader, size_t batch = 2) {
  std::vector<SparseExample> all, part;
  for (;;) {
    auto n = reader.Next(batch, &part);
    EXPECT_TRUE(n.ok()) << n.status().ToString();
    if (!n.ok() || *n == 0) break;
    EXPECT_EQ(part.size(), *n);
    all.insert(all.end(), part.begin(), part.end());
  }
  return all;
}

TEST(Libsvm, ParsesLabelsKeysValues) {
  TempDir dir;
  ASSERT_TRUE(dir.ok());
  WriteText(dir.File("a.svm"),
            "+1 1:0.5 7:2\n"
            "-1 0:1e-3\t18446744073709551615:-4\r\n"
            "# a comment\n"
            "\n"
            "1 3:1 # trailing comment\n"
            "0\n"
            "  -1 2:.25");  // no final newline
  auto reader = LibsvmReader::Open(dir.File("a.svm"));
  ASSERT_TRUE(reader.ok()) << reader.status().ToString();
  auto all = ReadAll(**reader);
  ASSERT_EQ(all.size(), 5u);
  EXPECT_EQ(all[0].label, 1.0f);
  EXPECT_EQ(all[0].keys, std::vector<uint64_t>({1, 7}));
  EXPECT_EQ(all[0].values, std::vector<float>({0.5f, 2.0f}));
  EXPECT_EQ(all[1].label, 0.0f);
  EXPECT_EQ(all[1].keys, std::vector<uint64_t>({0, 18446744073709551615u}));
  EXPECT_EQ(all[1].values, std::vector<float>({1e-3f, -4.0f}));
  EXPECT_EQ(all[2].label, 1.0f);
  EXPECT_EQ(all[2].keys, std::vector<uint64_t>({3}));
  EXPECT_EQ(all[3].label, 0.0f);
  EXPECT_TRUE(all[3].keys.empty());
  EXPECT_EQ(all[4].label, 0.0f);
  EXPECT_EQ(all[4].keys, std::vector<uint64_t>({2}));
  EXPECT_EQ(all[4].values, std::vector<float>({0.25f}));
}

// Opens `text` as a LIBSVM file named data.svm and returns the first error.
Status FirstError(const TempDir& dir, const std::string& text) {
  WriteText(dir.File("data.svm"), text);
  auto reader = LibsvmReader::Open(dir.File("data.svm"));
  if (!reader.ok()) return reader.status();
  std::vector<SparseExample> part;
  for (;;) {
    auto n = (*reader)->Next(10, &part);
    if (!n.ok()) return n.status();
    if (*n == 0) return Status::Ok();
  }
}

TEST(Libsvm, MalformedLineNamesFileAndLine) {
  TempDir dir;
  ASSERT_TRUE(dir.ok());
  const std::string at3 = dir.File("data.svm") + ":3: ";
  Status s = FirstError(dir, "1 1:1\n# comment\n-1 abc\n");
  EXPECT_EQ(s.code(), Code::kInvalidArgument);
  EXPECT_EQ(s.message(), at3 + "expected key:value, got 'abc'");

  s = FirstError(dir, "1 1:1\n\n2 1:1\n");
  EXPECT_EQ(s.code(), Code::kInvalidArgument);
  EXPECT_CONTAINS(s.message(), at3 + "bad label '2'");

  s = FirstError(dir, "1 1:1\n1 2:2\n1 x:1\n");
  EXPECT_CONTAINS(s.message(), at3 + "bad key 'x'");

  s = FirstError(dir, "1 1:1\n1 2:2\n1 -3:1\n");
  EXPECT_CONTAINS(s.message(), at3 + "bad key '-3'");

  s = FirstError(dir, "1 1:1\n1 2:2\n1 3:\n");
  EXPECT_CONTAINS(s.message(), at3 + "bad value ''");

  s = FirstError(dir, "1 1:1\n1 2:2\n1 3:1.5q\n");
  EXPECT_CONTAINS(s.message(), at3 + "bad value '1.5q'");
}

TEST(Libsvm, SharesAreDisjoint) {
  TempDir dir;
  ASSERT_TRUE(dir.ok());
  // Line i has the single key i; comments and blank lines still count.
  std::string text;
  std::set<uint64_t> expected;
  for (uint64_t i = 0; i < 50; ++i) {
    if (i % 7 == 3) {
      text += "# comment\n";
    } else if (i % 11 == 5) {
      text += "\n";
    } else {
      text += "1 " + std::to_string(i) + ":1\n";
      expected.insert(i);
    }
  }
  WriteText(dir.File("s.svm"), text);
  const int shares = 3;
  std::set<uint64_t> seen;
  for (int share = 0; share < shares; ++share) {
    auto reader = LibsvmReader::Open(dir.File("s.svm"), share, shares);
    ASSERT_TRUE(reader.ok()) << reader.status().ToString();
    for (const SparseExample& ex : ReadAll(**reader, 4)) {
      ASSERT_EQ(ex.keys.size(), 1u);
      EXPECT_EQ(static_cast<int>(ex.keys[0] % shares), share) << ex.keys[0];
      EXPECT_TRUE(seen.insert(ex.keys[0]).second) << "twice: " << ex.keys[0];
    }
  }
  EXPECT_EQ(seen, expected);
}

TEST(Libsvm, BadShareRejected) {
  auto reader = LibsvmReader::Open("/nonexistent.svm", 2, 2);
  ASSERT_FALSE(reader.ok());
  EXPECT_EQ(reader.status().code(), Code::kInvalidArgument);
}

TEST(Libsvm, MissingFileIsNotFound) {
  auto reader = LibsvmReader::Open("/nonexistent.svm");
  ASSERT_FALSE(reader.ok());
  EXPECT_EQ(reader.status().code(), Code::kNotFound);
  EXPECT_CONTAINS(reader.status().message(), "/nonexistent.svm");
}

TEST(Libsvm, GzipStreams) {
  TempDir dir;
  ASSERT_TRUE(dir.ok());
  std::string text;
  for (int i = 0; i < 1000; ++i) {
    text += (i % 2 ? "+1 " : "-1 ") + std::to_string(i) + ":" +
            std::to_string(i) + ".5\n";
  }
  WriteGzip(dir.File("g.svm.gz"),
            std::vector<uint8_t>(text.begin(), text.end()));
  auto reader = LibsvmReader::Open(dir.File("g.svm.gz"));
  ASSERT_TRUE(reader.ok()) << reader.status().ToString();
  auto all = ReadAll(**reader, 64);
  ASSERT_EQ(all.size(), 1000u);
  for (int i = 0; i < 1000; ++i) {
    EXPECT_EQ(all[i].label, i % 2 ? 1.0f : 0.0f);
    ASSERT_EQ(all[i].keys.size(), 1u);
    EXPECT_EQ(all[i].keys[0], static_cast<uint64_t>(i));
    EXPECT_EQ(all[i].values[0], i + 0.5f);
  }
}

TEST(Libsvm, TruncatedGzipIsAnError) {
  TempDir dir;
  ASSERT_TRUE(dir.ok());
  std::string text;
  for (int i = 0; i < 5000; ++i) text += "1 " + std::to_string(i) + ":1\n";
  WriteGzip(dir.File("t.gz"), std::vector<uint8_t>(text.begin(), text.end()));
  std::filesystem::resize_file(
      dir.File("t.gz"), std::filesystem::file_size(dir.File("t.gz")) / 2);
  auto reader = LibsvmReader::Open(dir.File("t.gz"));
  ASSERT_TRUE(reader.ok()) << reader.status().ToString();
  std::vector<SparseExample> part;
  Status error;
  for (;;) {
    auto n = (*reader)->Next(100, &part);
    if (!n.ok()) {
      error = n.status();
      break;
    }
    ASSERT_NE(*n, 0u) << "truncated stream read as a clean end of file";
  }
  EXPECT_EQ(error.code(), Code::kInvalidArgument) << error.ToString();
  EXPECT_CONTAINS(error.message(), dir.File("t.gz") + ":");
  EXPECT_CONTAINS(error.message(), "truncated gzip stream");
}

TEST(Libsvm, RewindStartsOver) {
  TempDir dir;
  ASSERT_TRUE(dir.ok());
  WriteGzip(dir.File("r.gz"), {'1', ' ', '1', ':', '1', '\n', '0', ' ', '2',
                               ':', '1', '\n', '1', ' ', '3', ':', '1', '\n'});
  auto reader = LibsvmReader::Open(dir.File("r.gz"), 1, 2);
  ASSERT_TRUE(reader.ok()) << reader.status().ToString();
  std::vector<SparseExample> part;
  auto n = (*reader)->Next(10, &part);
  ASSERT_TRUE(n.ok());
  ASSERT_EQ(*n, 1u);
  EXPECT_EQ(part[0].keys, std::vector<uint64_t>({2}));
  n = (*reader)->Next(10, &part);
  ASSERT_TRUE(n.ok());
  EXPECT_EQ(*n, 0u);
  EXPECT_TRUE(part.empty());
  ASSERT_TRUE((*reader)->Rewind().ok());
  n = (*reader)->Next(10, &part);
  ASSERT_TRUE(n.ok());
  ASSERT_EQ(*n, 1u);
  EXPECT_EQ(part[0].keys, std::vector<uint64_t>({2}));
}

TEST(Libsvm, LongLineOver64KiB) {
  TempDir dir;
  ASSERT_TRUE(dir.ok());
  // ~20k features, ~150 KiB on one line, between two short lines.
  std::string text = "1 1:1\n-1";
  const int kFeatures = 20000;
  for (int i = 0; i < kFeatures; ++i) {
    text += " " + std::to_string(1000000 + i) + ":0.125";
  }
  text += "\n1 2:1\n";
  ASSERT_GT(text.size(), 64u * 1024u);
  for (bool gzip : {false, true}) {
    const std::string path = dir.File(gzip ? "long.gz" : "long.svm");
    if (gzip) {
      WriteGzip(path, std::vector<uint8_t>(text.begin(), text.end()));
    } else {
      WriteText(path, text);
    }
    auto reader = LibsvmReader::Open(path);
    ASSERT_TRUE(reader.ok()) << reader.status().ToString();
    auto all = ReadAll(**reader, 1);
    ASSERT_EQ(all.size(), 3u) << path;
    EXPECT_EQ(all[0].keys, std::vector<uint64_t>({1}));
    ASSERT_EQ(all[1].keys.size(), static_cast<size_t>(kFeatures));
    EXPECT_EQ(all[1].label, 0.0f);
    EXPECT_EQ(all[1].keys.front(), 1000000u);
    EXPECT_EQ(all[1].keys.back(), 1000000u + kFeatures - 1);
    EXPECT_EQ(all[1].values.back(), 0.125f);
    EXPECT_EQ(all[2].keys, std::vector<uint64_t>({2}));
  }
}

}  // namespace
}  // namespace tether
