#include "worker/dataset.h"

#include <sys/mman.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <optional>
#include <random>
#include <string_view>
#include <utility>

namespace tether {
namespace {

// Reserves `floats` in `v` (empty) and asks the kernel to back them with
// huge pages where it can: batches gather rows from all over a training set
// of hundreds of MB, and with 4 KiB pages nearly every row is a TLB miss
// (costly in a virtual machine). Only advice: nothing changes where the
// kernel declines.
void AskForHugePages(std::vector<float>& v, size_t floats) {
  v.reserve(floats);
  constexpr uintptr_t kHuge = uintptr_t{2} << 20;
  const auto first = reinterpret_cast<uintptr_t>(v.data());
  const uintptr_t begin = (first + kHuge - 1) & ~(kHuge - 1);
  const uintptr_t end = (first + floats * sizeof(float)) & ~(kHuge - 1);
  if (end > begin) {
    (void)madvise(reinterpret_cast<void*>(begin), end - begin, MADV_HUGEPAGE);
  }
}

constexpr uint32_t kIdxImagesMagic = 0x00000803;  // u8 data, 3 dimensions
constexpr uint32_t kIdxLabelsMagic = 0x00000801;  // u8 data, 1 dimension

// Reads are chunked so that a corrupt header claiming terabytes fails on
// the short read instead of on one huge allocation.
constexpr size_t kReadChunk = size_t{16} << 20;

// A LIBSVM line longer than this is certainly not an example we can train
// on; refusing it keeps a file without newlines from eating all memory.
constexpr size_t kMaxLineBytes = size_t{256} << 20;

// Owns a gzFile. zlib reads plain files transparently (it checks for the
// gzip magic bytes 0x1f 0x8b itself), so one path serves both kinds.
struct GzCloser {
  void operator()(gzFile f) const { gzclose(f); }
};
using GzPtr = std::unique_ptr<gzFile_s, GzCloser>;

Result<GzPtr> OpenForReading(const std::string& path) {
  errno = 0;
  gzFile f = gzopen(path.c_str(), "rb");
  if (f == nullptr) {
    if (errno == ENOENT) return NotFound(path + ": not found");
    return Status(Code::kIoError,
                  path + ": cannot open: " +
                      (errno != 0 ? std::strerror(errno) : "out of memory"));
  }
  // Larger than zlib's 8 KiB default: fewer read calls on big files.
  gzbuffer(f, 256 * 1024);
  return GzPtr(f);
}

// The zlib or system error behind a failed gzread/gzgets.
std::string GzErrorText(gzFile f) {
  int errnum = Z_OK;
  const char* text = gzerror(f, &errnum);
  if (errnum == Z_ERRNO) return std::strerror(errno);
  return text != nullptr ? text : "unknown zlib error";
}

// Reads up to `n` bytes into `out` (replacing it). Returns the bytes read,
// fewer than `n` only at the end of the file.
Result<size_t> ReadBytes(gzFile f, const std::string& path, size_t n,
                         std::vector<uint8_t>* out) {
  out->clear();
  while (out->size() < n) {
    size_t old = out->size();
    size_t want = std::min(n - old, kReadChunk);
    out->resize(old + want);
    int got = gzread(f, out->data() + old, static_cast<unsigned>(want));
    if (got < 0) {
      return InvalidArgument(path + ": cannot read: " + GzErrorText(f));
    }
    out->resize(old + static_cast<size_t>(got));
    if (static_cast<size_t>(got) < want) break;
  }
  return out->size();
}

uint32_t BigEndian32(const uint8_t* p) {
  return (uint32_t{p[0]} << 24) | (uint32_t{p[1]} << 16) |
         (uint32_t{p[2]} << 8) | uint32_t{p[3]};
}

std::string Hex32(uint32_t v) {
  char buf[16];
  std::snprintf(buf, sizeof(buf), "0x%08x", v);
  return buf;
}

// Reads an IDX header of `dims` dimensions and checks its magic number.
Result<std::vector<uint32_t>> ReadIdxHeader(gzFile f, const std::string& path,
                                            uint32_t magic, int dims,
                                            const char* kind) {
  std::vector<uint8_t> header;
  TETHER_ASSIGN_OR_RETURN(auto got,
                          ReadBytes(f, path, size_t{4} * (1 + dims), &header));
  if (got < 4) {
    return InvalidArgument(path + ": truncated: no IDX magic number");
  }
  uint32_t found = BigEndian32(header.data());
  if (found != magic) {
    return InvalidArgument(path + ": bad IDX magic number " + Hex32(found) +
                           " (expected " + Hex32(magic) + ", an IDX " + kind +
                           " file)");
  }
  if (got < size_t{4} * (1 + dims)) {
    return InvalidArgument(path + ": truncated IDX header");
  }
  std::vector<uint32_t> sizes;
  sizes.reserve(dims);
  for (int d = 0; d < dims; ++d) {
    sizes.push_back(BigEndian32(header.data() + size_t{4} * (1 + d)));
  }
  return sizes;
}

// Returns the images as [count, rows * cols] floats in [0, 1].
Status ReadImages(const std::string& path, DenseDataset* ds) {
  TETHER_ASSIGN_OR_RETURN(auto file, OpenForReading(path));
  gzFile f = file.get();
  TETHER_ASSIGN_OR_RETURN(auto sizes,
                          ReadIdxHeader(f, path, kIdxImagesMagic, 3, "images"));
  const uint64_t count = sizes[0];
  const uint64_t features = uint64_t{sizes[1]} * sizes[2];
  // Both factors are below 2^32 and features below 2^64, so only the
  // product with count can overflow.
  if (features != 0 &&
      count > std::numeric_limits<uint64_t>::max() / 4 / features) {
    return InvalidArgument(path + ": IDX sizes too large");
  }
  const uint64_t bytes = count * features;
  std::vector<uint8_t> pixels;
  TETHER_ASSIGN_OR_RETURN(auto got, ReadBytes(f, path, bytes, &pixels));
  if (got != bytes) {
    return InvalidArgument(
        path + ": truncated: " + std::to_string(count) + " images of " +
        std::to_string(features) + " pixels need " + std::to_string(bytes) +
        " bytes after the header, found " + std::to_string(got));
  }
  ds->rows = count;
  ds->features = features;
  AskForHugePages(ds->x, bytes);
  ds->x.resize(bytes);
  for (size_t i = 0; i < bytes; ++i) ds->x[i] = pixels[i] / 255.0f;
  return Status::Ok();
}

Status ReadLabels(const std::string& path, DenseDataset* ds) {
  TETHER_ASSIGN_OR_RETURN(auto file, OpenForReading(path));
  gzFile f = file.get();
  TETHER_ASSIGN_OR_RETURN(auto sizes,
                          ReadIdxHeader(f, path, kIdxLabelsMagic, 1, "labels"));
  const uint64_t count = sizes[0];
  std::vector<uint8_t> labels;
  TETHER_ASSIGN_OR_RETURN(auto got, ReadBytes(f, path, count, &labels));
  if (got != count) {
    return InvalidArgument(path + ": truncated: " + std::to_string(count) +
                           " labels need " + std::to_string(count) +
                           " bytes after the header, found " +
                           std::to_string(got));
  }
  ds->y.assign(labels.begin(), labels.end());
  int max_label = -1;
  for (uint8_t l : labels) max_label = std::max<int>(max_label, l);
  ds->classes = max_label + 1;
  return Status::Ok();
}

bool IsSpace(char c) { return c == ' ' || c == '\t' || c == '\r'; }

// Splits off the next whitespace-separated token of `rest`.
std::string_view NextToken(std::string_view* rest) {
  size_t begin = 0;
  while (begin < rest->size() && IsSpace((*rest)[begin])) ++begin;
  size_t end = begin;
  while (end < rest->size() && !IsSpace((*rest)[end])) ++end;
  std::string_view token = rest->substr(begin, end - begin);
  rest->remove_prefix(end);
  return token;
}

// "+1"/"1" (and equal numbers such as "1.0") are positive; "-1"/"0" are
// negative; anything else is an error message.
std::optional<float> ParseLabel(std::string_view text) {
  std::string_view digits = text;
  if (!digits.empty() && digits.front() == '+') digits.remove_prefix(1);
  double v = 0;
  auto [ptr, ec] =
      std::from_chars(digits.data(), digits.data() + digits.size(), v);
  if (digits.empty() || ec != std::errc() ||
      ptr != digits.data() + digits.size()) {
    return std::nullopt;
  }
  if (v == 1) return 1.0f;
  if (v == -1 || v == 0) return 0.0f;
  return std::nullopt;
}

// Parses `line` into `ex`; returns an empty string on success or what is
// wrong with the line.
std::string ParseExample(std::string_view line, SparseExample* ex) {
  ex->keys.clear();
  ex->values.clear();
  std::string_view rest = line;
  std::string_view label = NextToken(&rest);
  auto y = ParseLabel(label);
  if (!y) {
    return "bad label '" + std::string(label) + "' (expected +1, 1, -1 or 0)";
  }
  ex->label = *y;
  for (std::string_view tok = NextToken(&rest); !tok.empty();
       tok = NextToken(&rest)) {
    if (tok.front() == '#') break;  // a trailing comment
    size_t colon = tok.find(':');
    if (colon == std::string_view::npos) {
      return "expected key:value, got '" + std::string(tok) + "'";
    }
    const char* key_end = tok.data() + colon;
    uint64_t key = 0;
    auto [kp, kec] = std::from_chars(tok.data(), key_end, key);
    if (colon == 0 || kec != std::errc() || kp != key_end) {
      return "bad key '" + std::string(tok.substr(0, colon)) + "' in '" +
             std::string(tok) + "' (expected an unsigned 64-bit integer)";
    }
    const char* value_begin = key_end + 1;
    const char* value_end = tok.data() + tok.size();
    float value = 0;
    auto [vp, vec] = std::from_chars(value_begin, value_end, value);
    if (value_begin == value_end || vec != std::errc() || vp != value_end ||
        !std::isfinite(value)) {
      return "bad value '" + std::string(value_begin, value_end) + "' in '" +
             std::string(tok) + "' (expected a finite float)";
    }
    ex->keys.push_back(key);
    ex->values.push_back(value);
  }
  return "";
}

}  // namespace

void GatherRows(const DenseDataset& d, std::span<const uint32_t> rows, float* x,
                int32_t* y) {
  const size_t f = d.features;
  for (size_t i = 0; i < rows.size(); ++i) {
    std::copy_n(d.x.data() + size_t{rows[i]} * f, f, x + i * f);
    y[i] = d.y[rows[i]];
  }
}

Result<DenseDataset> LoadIdx(const std::string& images_path,
                             const std::string& labels_path) {
  DenseDataset ds;
  TETHER_RETURN_IF_ERROR(ReadImages(images_path, &ds));
  TETHER_RETURN_IF_ERROR(ReadLabels(labels_path, &ds));
  if (ds.y.size() != ds.rows) {
    return InvalidArgument(images_path + " has " + std::to_string(ds.rows) +
                           " images but " + labels_path + " has " +
                           std::to_string(ds.y.size()) + " labels");
  }
  return ds;
}

Result<DenseDataset> LoadFashionMnist(bool train, const std::string& dir) {
  const std::string prefix = dir + (train ? "/train" : "/t10k");
  auto ds = LoadIdx(prefix + "-images-idx3-ubyte.gz",
                    prefix + "-labels-idx1-ubyte.gz");
  if (!ds.ok() && ds.status().code() == Code::kNotFound) {
    return NotFound(ds.status().message() +
                    "; install the Debian package dataset-fashion-mnist "
                    "(apt-get install dataset-fashion-mnist)");
  }
  return ds;
}

struct LibsvmReader::Impl {
  GzPtr file;
  uint64_t next_line = 0;  // 0-based number of the next line to read
  std::string line;        // grows to the longest line seen

  // Reads the next line (without its '\n') into `line`. Returns false at
  // the end of the file.
  Result<bool> ReadLine(const std::string& path) {
    line.clear();
    if (line.capacity() < 4096) line.reserve(4096);
    size_t len = 0;
    for (;;) {
      line.resize(line.capacity());
      const size_t space = line.size() - len;
      // gzgets stops after a newline or space - 1 bytes, NUL-terminating.
      char* got = gzgets(file.get(), line.data() + len,
                         static_cast<int>(std::min<size_t>(space, 1 << 30)));
      int errnum = Z_OK;
      gzerror(file.get(), &errnum);
      if (errnum == Z_BUF_ERROR) {
        return InvalidArgument(path + ":" + std::to_string(next_line + 1) +
                               ": truncated gzip stream");
      }
      if (errnum != Z_OK) {
        return Status(Code::kIoError,
                      path + ":" + std::to_string(next_line + 1) +
                          ": cannot read: " + GzErrorText(file.get()));
      }
      if (got == nullptr) {  // end of file
        line.resize(len);
        return len > 0;  // a last line without '\n'
      }
      len += std::strlen(line.data() + len);
      if (len > 0 && line[len - 1] == '\n') {
        line.resize(len - 1);
        return true;
      }
      if (len + 1 < line.size()) {  // stopped short of the buffer: EOF
        line.resize(len);
        return true;
      }
      if (line.size() >= kMaxLineBytes) {
        return InvalidArgument(path + ":" + std::to_string(next_line + 1) +
                               ": line longer than " +
                               std::to_string(kMaxLineBytes) + " bytes");
      }
      line.reserve(line.size() * 2);
    }
  }
};

LibsvmReader::LibsvmReader(std::string path, int share, int shares,
                           std::unique_ptr<Impl> impl)
    : path_(std::move(path)),
      share_(share),
      shares_(shares),
      impl_(std::move(impl)) {}

LibsvmReader::~LibsvmReader() = default;

Result<std::unique_ptr<LibsvmReader>> LibsvmReader::Open(
    const std::string& path, int share, int shares) {
  if (shares < 1 || share < 0 || share >= shares) {
    return InvalidArgument(path + ": share " + std::to_string(share) + " of " +
                           std::to_string(shares) +
                           " (expected 0 <= share < shares)");
  }
  TETHER_ASSIGN_OR_RETURN(auto file, OpenForReading(path));
  auto impl = std::make_unique<Impl>();
  impl->file = std::move(file);
  // The constructor is private, so make_unique cannot call it.
  return std::unique_ptr<LibsvmReader>(
      new LibsvmReader(path, share, shares, std::move(impl)));
}

Result<size_t> LibsvmReader::Next(size_t max, std::vector<SparseExample>* out) {
  // Reuse the caller's examples so their key/value buffers keep capacity.
  size_t n = 0;
  while (n < max) {
    auto more = impl_->ReadLine(path_);
    if (!more.ok()) {
      out->resize(n);
      return more.status();
    }
    if (!*more) break;
    const uint64_t line_number = impl_->next_line++;
    if (line_number % static_cast<uint64_t>(shares_) !=
        static_cast<uint64_t>(share_)) {
      continue;
    }
    std::string_view text = impl_->line;
    size_t first = 0;
    while (first < text.size() && IsSpace(text[first])) ++first;
    if (first == text.size() || text[first] == '#') continue;
    if (n == out->size()) out->emplace_back();
    std::string error = ParseExample(text.substr(first), &(*out)[n]);
    if (!error.empty()) {
      out->resize(n);
      return InvalidArgument(path_ + ":" + std::to_string(line_number + 1) +
                             ": " + error);
    }
    ++n;
  }
  out->resize(n);
  return n;
}

Status LibsvmReader::Rewind() {
  if (gzrewind(impl_->file.get()) != 0) {
    return Status(Code::kIoError,
                  path_ + ": cannot rewind: " + GzErrorText(impl_->file.get()));
  }
  impl_->next_line = 0;
  return Status::Ok();
}

}  // namespace tether
