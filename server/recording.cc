#include "server/recording.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <fstream>
#include <iterator>

namespace tether {
namespace {

constexpr char kMagic[] = "TETHERREC1";
constexpr size_t kMagicBytes = sizeof(kMagic) - 1;
constexpr size_t kHeaderBytes = kMagicBytes + 4;

bool HasTensor(RecordedEvent::Kind k) {
  using K = RecordedEvent::Kind;
  return k == K::kPush || k == K::kProvide || k == K::kPull;
}
bool HasDigest(RecordedEvent::Kind k) {
  using K = RecordedEvent::Kind;
  return k == K::kPush || k == K::kProvide || k == K::kChunk || k == K::kShare;
}

void PutVarint(std::string* out, uint64_t v) {
  while (v >= 0x80) {
    out->push_back(static_cast<char>(v | 0x80));
    v >>= 7;
  }
  out->push_back(static_cast<char>(v));
}
void PutU32(std::string* out, uint32_t v) {
  for (int i = 0; i < 4; ++i) out->push_back(static_cast<char>(v >> (8 * i)));
}

void Encode(std::string* out, const RecordedEvent& e) {
  out->push_back(static_cast<char>(e.kind));
  PutVarint(out, static_cast<uint64_t>(e.rank));
  PutVarint(out, static_cast<uint64_t>(e.clock + 1));
  if (HasTensor(e.kind)) PutU32(out, e.tensor);
  if (HasDigest(e.kind)) PutU32(out, e.digest);
}

// Reads events from `data` (past the header) into `out` (when not null),
// at most `limit`; returns the bytes the complete ones take. `*bad` says
// why decoding stopped early on something that is not a torn tail.
size_t Decode(std::string_view data, uint64_t limit,
              std::vector<RecordedEvent>* out, uint64_t* count,
              std::string* bad) {
  size_t pos = 0;
  *count = 0;
  auto varint = [&](size_t* at, uint64_t* v) {
    *v = 0;
    for (int shift = 0; shift < 64; shift += 7) {
      if (*at >= data.size()) return false;
      const auto byte = static_cast<uint8_t>(data[(*at)++]);
      *v |= uint64_t{byte & 0x7fu} << shift;
      if ((byte & 0x80) == 0) return true;
    }
    return false;
  };
  auto u32 = [&](size_t* at, uint32_t* v) {
    if (*at + 4 > data.size()) return false;
    *v = 0;
    for (int i = 0; i < 4; ++i) {
      *v |= uint32_t{static_cast<uint8_t>(data[*at + i])} << (8 * i);
    }
    *at += 4;
    return true;
  };
  while (pos < data.size() && *count < limit) {
    size_t at = pos;
    RecordedEvent e;
    const auto kind = static_cast<uint8_t>(data[at++]);
    if (kind < 1 || kind > 8) {
      *bad = "unknown event kind " + std::to_string(kind) + " at byte " +
             std::to_string(kHeaderBytes + pos);
      return pos;
    }
    e.kind = static_cast<RecordedEvent::Kind>(kind);
    uint64_t rank = 0;
    uint64_t clock = 0;
    if (!varint(&at, &rank) || !varint(&at, &clock)) return pos;
    e.rank = static_cast<int>(rank);
    e.clock = static_cast<int64_t>(clock) - 1;
    if (HasTensor(e.kind) && !u32(&at, &e.tensor)) return pos;
    if (HasDigest(e.kind) && !u32(&at, &e.digest)) return pos;
    if (out != nullptr) out->push_back(e);
    ++*count;
    pos = at;
  }
  return pos;
}

// 64-bit multiply-xorshift over 8-byte words, four lanes at once; folded
// to 32 bits. Not cryptographic: it tells changed values apart.
struct Digest {
  uint64_t lanes[4] = {0x9e3779b97f4a7c15ull, 0xc2b2ae3d27d4eb4full,
                       0x165667b19e3779f9ull, 0x27d4eb2f165667c5ull};
  void Add(const void* data, size_t bytes) {
    const auto* p = static_cast<const uint8_t*>(data);
    size_t i = 0;
    for (; i + 32 <= bytes; i += 32) {
      for (int l = 0; l < 4; ++l) {
        uint64_t w;
        std::memcpy(&w, p + i + 8 * l, 8);
        lanes[l] = (lanes[l] ^ w) * 0xff51afd7ed558ccdull;
        lanes[l] ^= lanes[l] >> 29;
      }
    }
    for (; i < bytes; ++i) {
      lanes[i & 3] = (lanes[i & 3] ^ p[i]) * 0xc4ceb9fe1a85ec53ull;
    }
    lanes[0] ^= bytes;
  }
  uint32_t Finish() const {
    uint64_t h =
        lanes[0] ^ (lanes[1] * 31) ^ (lanes[2] * 131) ^ (lanes[3] * 1031);
    h ^= h >> 33;
    h *= 0xff51afd7ed558ccdull;
    h ^= h >> 33;
    return static_cast<uint32_t>(h);
  }
};

const char* KindName(RecordedEvent::Kind k) {
  switch (k) {
    case RecordedEvent::Kind::kJoin:
      return "join";
    case RecordedEvent::Kind::kLeave:
      return "leave";
    case RecordedEvent::Kind::kPush:
      return "push";
    case RecordedEvent::Kind::kProvide:
      return "initial values";
    case RecordedEvent::Kind::kPull:
      return "pull";
    case RecordedEvent::Kind::kClock:
      return "clock";
    case RecordedEvent::Kind::kChunk:
      return "data chunk request";
    case RecordedEvent::Kind::kShare:
      return "data share request";
  }
  return "event";
}

}  // namespace

std::string DescribeEvent(const RecordedEvent& e,
                          const std::function<std::string(uint32_t)>& name) {
  using K = RecordedEvent::Kind;
  std::string out = "worker " + std::to_string(e.rank) + "'s ";
  out += KindName(e.kind);
  if (HasTensor(e.kind)) {
    out += " of " +
           (name ? name(e.tensor) : "tensor id " + std::to_string(e.tensor));
  }
  switch (e.kind) {
    case K::kPush:
      out += " read at clock " + std::to_string(e.clock);
      break;
    case K::kPull:
      out += " at clock " + std::to_string(e.clock);
      break;
    case K::kClock:
      out += " " + std::to_string(e.clock);
      break;
    case K::kChunk:
    case K::kShare:
      out += " at clock " + std::to_string(e.clock);
      break;
    case K::kJoin:
      out += " at clock " + std::to_string(e.clock);
      break;
    default:
      break;
  }
  return out;
}

RecordedEvent PushEvent(int rank, const wire::Push& push) {
  const wire::Push* m = &push;
  RecordedEvent e;
  e.rank = rank;
  e.kind =
      m->provide() ? RecordedEvent::Kind::kProvide : RecordedEvent::Kind::kPush;
  e.clock = m->read_clock();
  e.tensor = m->tensor();
  Digest d;
  if (m->keys() != nullptr) d.Add(m->keys()->data(), m->keys()->size() * 8);
  if (m->rows() != nullptr) d.Add(m->rows()->data(), m->rows()->size() * 4);
  if (m->blocks() != nullptr) {
    for (const wire::Block* b : *m->blocks()) {
      const uint32_t index = b->index();
      d.Add(&index, sizeof(index));
      if (b->values() != nullptr) {
        d.Add(b->values()->data(), b->values()->size() * sizeof(float));
      }
    }
  }
  e.digest = d.Finish();
  return e;
}

RecordedEvent ChunkEvent(int rank, const wire::DataRequest& request) {
  Digest d;
  const uint64_t asked[] = {request.rows(), request.chunk_rows(),
                            static_cast<uint64_t>(request.epochs()),
                            request.batch()};
  d.Add(asked, sizeof(asked));
  return {RecordedEvent::Kind::kChunk, rank, request.clock(), 0, d.Finish()};
}

RecordedEvent ShareEvent(int rank, const wire::ShareRequest& request) {
  Digest d;
  const uint64_t asked[] = {static_cast<uint64_t>(request.epoch()),
                            request.leftover() ? 1u : 0u, request.batch()};
  d.Add(asked, sizeof(asked));
  return {RecordedEvent::Kind::kShare, rank, request.clock(), 0, d.Finish()};
}

std::optional<RecordedEvent> EventOf(int rank, const wire::Message& message) {
  RecordedEvent e;
  e.rank = rank;
  if (const wire::Push* m = message.body_as_Push()) return PushEvent(rank, *m);
  if (const wire::Pull* m = message.body_as_Pull()) {
    e.kind = RecordedEvent::Kind::kPull;
    e.tensor = m->tensor();
    return e;
  }
  if (const wire::Clock* m = message.body_as_Clock()) {
    e.kind = RecordedEvent::Kind::kClock;
    e.clock = m->clock();
    return e;
  }
  if (const wire::DataRequest* m = message.body_as_DataRequest()) {
    return ChunkEvent(rank, *m);
  }
  if (const wire::ShareRequest* m = message.body_as_ShareRequest()) {
    return ShareEvent(rank, *m);
  }
  return std::nullopt;
}

std::string RecordingPath(const std::string& data_dir) {
  return data_dir + "/record.log";
}

Result<Recording> ReadRecording(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return NotFound(path + ": no recording (was the run --record?)");
  std::string data((std::istreambuf_iterator<char>(in)),
                   std::istreambuf_iterator<char>());
  if (data.size() < kHeaderBytes || data.compare(0, kMagicBytes, kMagic) != 0) {
    return Corruption(path + ": not a tether recording");
  }
  Recording r;
  uint32_t shard = 0;
  for (int i = 0; i < 4; ++i) {
    shard |= uint32_t{static_cast<uint8_t>(data[kMagicBytes + i])} << (8 * i);
  }
  r.shard_id = static_cast<int>(shard);
  std::string_view body(data);
  body.remove_prefix(kHeaderBytes);
  std::string bad;
  uint64_t count = 0;
  const size_t used = Decode(body, UINT64_MAX, &r.events, &count, &bad);
  if (!bad.empty()) return Corruption(path + ": " + bad);
  r.torn_tail = used < body.size();
  return r;
}

Recorder::Recorder(std::string path, int fd, uint64_t events)
    : path_(std::move(path)), fd_(fd), events_(events) {
  thread_ = std::thread([this] { Loop(); });
}

Result<std::unique_ptr<Recorder>> Recorder::Open(const std::string& data_dir,
                                                 int shard_id,
                                                 uint64_t keep_events) {
  const std::string path = RecordingPath(data_dir);
  uint64_t keep_bytes = 0;
  if (keep_events > 0) {
    std::ifstream in(path, std::ios::binary);
    std::string data((std::istreambuf_iterator<char>(in)),
                     std::istreambuf_iterator<char>());
    std::string bad;
    uint64_t count = 0;
    const size_t used =
        data.size() < kHeaderBytes
            ? 0
            : Decode(std::string_view(data).substr(kHeaderBytes), keep_events,
                     nullptr, &count, &bad);
    if (count < keep_events) {
      return Corruption(path + ": holds " + std::to_string(count) +
                        " events, fewer than the " +
                        std::to_string(keep_events) +
                        " the round resumed from recorded");
    }
    keep_bytes = kHeaderBytes + used;
  }
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) {
    return Status(Code::kIoError, path + ": cannot open the recording: " +
                                      std::strerror(errno));
  }
  std::string header(kMagic, kMagicBytes);
  PutU32(&header, static_cast<uint32_t>(shard_id));
  const bool fresh = keep_bytes == 0;
  if (::ftruncate(fd, static_cast<off_t>(keep_bytes)) != 0 ||
      ::lseek(fd, static_cast<off_t>(keep_bytes), SEEK_SET) < 0 ||
      (fresh && ::write(fd, header.data(), header.size()) !=
                    static_cast<ssize_t>(header.size()))) {
    const std::string why = std::strerror(errno);
    ::close(fd);
    return Status(Code::kIoError,
                  path + ": cannot start the recording: " + why);
  }
  return std::unique_ptr<Recorder>(new Recorder(path, fd, keep_events));
}

Recorder::~Recorder() {
  {
    MutexLock lock(&mu_);
    stopping_ = true;
  }
  cv_.SignalAll();
  thread_.join();
  (void)WriteOut(/*sync=*/true);
  ::close(fd_);
}

void Recorder::Add(const RecordedEvent& e) {
  MutexLock lock(&mu_);
  Encode(&pending_, e);
  ++events_;
}

uint64_t Recorder::events() const {
  MutexLock lock(&mu_);
  return events_;
}

Status Recorder::Sync() { return WriteOut(/*sync=*/true); }

Status Recorder::WriteOut(bool sync) {
  MutexLock write_lock(&write_mu_);
  std::string out;
  {
    MutexLock lock(&mu_);
    out.swap(pending_);
  }
  size_t done = 0;
  while (write_error_.ok() && done < out.size()) {
    const ssize_t n = ::write(fd_, out.data() + done, out.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      write_error_ =
          Status(Code::kIoError,
                 path_ + ": recording not written: " + std::strerror(errno));
      break;
    }
    done += static_cast<size_t>(n);
  }
  if (sync && write_error_.ok() && ::fdatasync(fd_) != 0) {
    write_error_ =
        Status(Code::kIoError,
               path_ + ": recording not synced: " + std::strerror(errno));
  }
  return write_error_;
}

void Recorder::Loop() {
  for (;;) {
    {
      MutexLock lock(&mu_);
      if (stopping_) return;
      cv_.WaitFor(mu_, std::chrono::milliseconds(20));
      if (stopping_) return;
      if (pending_.empty()) continue;
    }
    (void)WriteOut(/*sync=*/false);
  }
}

Replayer::Replayer(std::vector<RecordedEvent> events, size_t start,
                   std::function<std::string(uint32_t)> name)
    : events_(std::move(events)), name_(std::move(name)), next_(start) {
  for (size_t i = start; i < events_.size(); ++i) {
    if (events_[i].FromMessage()) expected_[events_[i].rank].push_back(i);
  }
}

Status Replayer::Arrive(const RecordedEvent& got, std::function<void()> run,
                        std::function<void(const Status&)> refuse) {
  std::deque<size_t>& mine = expected_[got.rank];
  if (mine.empty()) {
    // Past the worker's recorded messages (a recording cut short by a
    // crash ends anywhere): it waits for the recording's end, after which
    // the run goes on as it comes.
    beyond_[got.rank].push_back({got, std::move(run), std::move(refuse)});
    return Status::Ok();
  }
  const RecordedEvent& want = events_[mine.front()];
  // A pull's clock is the worker's when it is answered: known only then.
  RecordedEvent compared = got;
  if (got.kind == RecordedEvent::Kind::kPull) compared.clock = want.clock;
  if (!(compared == want)) {
    std::string what = DescribeEvent(got, name_);
    if (got.kind == want.kind && got.tensor == want.tensor &&
        got.clock == want.clock && got.digest != want.digest) {
      what += " with other values";
    }
    return Status(Code::kProtocol,
                  "at event " + std::to_string(mine.front()) + " worker " +
                      std::to_string(got.rank) + " sent " + what +
                      "; the recording has " + DescribeEvent(want, name_));
  }
  mine.pop_front();
  held_[got.rank].push_back({want, std::move(run), std::move(refuse)});
  return Status::Ok();
}

bool Replayer::Expects(const RecordedEvent& got) const {
  using K = RecordedEvent::Kind;
  if (got.kind != K::kChunk && got.kind != K::kShare) return true;
  auto it = expected_.find(got.rank);
  return it != expected_.end() && !it->second.empty() &&
         events_[it->second.front()].kind == got.kind;
}

std::optional<Replayer::Step> Replayer::Next() {
  if (done()) return std::nullopt;
  const RecordedEvent& e = events_[next_];
  if (!e.FromMessage()) {
    ++next_;
    return Step{e, {}, {}};
  }
  auto it = held_.find(e.rank);
  if (it == held_.end() || it->second.empty()) return std::nullopt;
  Step step = std::move(it->second.front());
  it->second.pop_front();
  ++next_;
  return step;
}

std::vector<Replayer::Step> Replayer::TakeHeld() {
  std::vector<Step> out;
  for (auto* by_rank : {&held_, &beyond_}) {
    for (auto& [rank, queue] : *by_rank) {
      for (Step& h : queue) out.push_back(std::move(h));
      queue.clear();
    }
  }
  return out;
}

}  // namespace tether
