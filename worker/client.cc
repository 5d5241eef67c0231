#include "worker/client.h"

#include <algorithm>
#include <chrono>
#include <thread>

#include "schema/auth.h"
#include "schema/frame.h"
#include "schema/log.h"
#include "schema/mutex.h"
#include "schema/stats_frame.h"
#include "schema/tls.h"
#include "worker/completion.h"
#include "worker/request_cutter.h"
#include "worker/shard_link.h"

namespace tether {

// The API over the links (shard_link.h); requests are cut into per-shard
// frames and their replies put back by request_cutter.h.
using client_internal::BlockPart;
using client_internal::CopyPulledBlocks;
using client_internal::CopyPulledRows;
using client_internal::CutBlocks;
using client_internal::CutKeys;
using client_internal::Defined;
using client_internal::DefineFrame;
using client_internal::KeyPart;
using client_internal::PullBlocksFrame;
using client_internal::PullRowsFrame;
using client_internal::PushBlocksFrame;
using client_internal::PushKind;
using client_internal::PushRowsFrame;
using client_internal::TensorMeta;
using client_internal::WelcomeInfo;

namespace {

// Completes one request that was cut into parts: `done` runs once, after
// the last part, with the first error any part reported.
class Fanout {
 public:
  Fanout(size_t parts, Client::Callback done)
      : remaining_(parts), done_(std::move(done)) {}

  void Finish(const Status& s) TETHER_EXCLUDES(mu_) {
    MutexLock lock(&mu_);
    if (!s.ok() && first_error_.ok()) first_error_ = s;
    if (--remaining_ > 0) return;
    Status result = first_error_;
    lock.Unlock();
    done_(result);
  }

 private:
  Mutex mu_;
  size_t remaining_ TETHER_GUARDED_BY(mu_);
  Status first_error_ TETHER_GUARDED_BY(mu_);
  const Client::Callback done_;
};

// Buffers a shard on this host writes pull replies into (Pull.landing).
// The shard writes before it answers, so a buffer whose pull was answered
// (values or error) is free again; one whose pull ended otherwise (a
// dropped connection, while a stalled shard may still write into it) is
// never reused or freed.
class LandingPool {
 public:
  // Shared only to fit in a copyable handler; one holder at a time.
  using Buffer = std::shared_ptr<std::vector<float>>;

  // A buffer of `n` floats.
  Buffer Take(size_t n) TETHER_EXCLUDES(mu_) {
    Buffer buffer;
    {
      MutexLock lock(&mu_);
      auto fits =
          std::find_if(free_.begin(), free_.end(),
                       [n](const Buffer& b) { return b->capacity() >= n; });
      if (fits != free_.end()) {
        buffer = std::move(*fits);
        free_.erase(fits);
      }
    }
    if (!buffer) buffer = std::make_shared<std::vector<float>>();
    buffer->resize(n);
    return buffer;
  }
  // `buffer`, which no shard writes into any more, may serve again.
  void Give(Buffer buffer) TETHER_EXCLUDES(mu_) {
    MutexLock lock(&mu_);
    if (free_.size() < kKept) free_.push_back(std::move(buffer));
  }
  // `buffer` may still be written into by a shard.
  static void Abandon(Buffer buffer) {
    static Mutex mu;
    // Never destroyed: outlives every client.
    static auto* abandoned = new std::vector<Buffer>;
    MutexLock lock(&mu);
    abandoned->push_back(std::move(buffer));
  }

 private:
  static constexpr size_t kKept = 32;
  Mutex mu_;
  std::vector<Buffer> free_ TETHER_GUARDED_BY(mu_);
};

}  // namespace

struct Client::Impl {
  Impl(ClientOptions o, std::shared_ptr<const AuthKey> key,
       std::shared_ptr<asio::ssl::context> tls)
      : options(std::move(o)),
        links(options, std::move(key), std::move(tls), clock,
              [this] { return Definitions(); }) {}

  Result<TensorMeta> Lookup(const std::string& name, bool sparse);

  // A request on every float of dense tensor `name`: its id and its parts
  // (CutBlocks), one frame each.
  struct DenseParts {
    uint32_t tensor = 0;
    std::vector<BlockPart> parts;
  };
  // Looks `name` up as a dense tensor and cuts it into parts. Each of
  // `buffers` ({what it is, the floats it holds}) must hold the tensor's
  // size; the error says which does not, after `request` ("pull of", ...)
  // and the tensor's name.
  Result<DenseParts> CutDense(
      const std::string& name, std::string_view request,
      std::initializer_list<std::pair<std::string_view, size_t>> buffers);

  // The clock a prefetch is for (the next one), marked so that Clock()
  // reaching it makes it the read clock.
  int64_t MarkPrefetch() {
    const int64_t next = clock.load() + 1;
    prefetched_for = next;
    return next;
  }
  void Define(const std::string& name, bool sparse,
              const std::vector<uint64_t>& shape, uint32_t dim, Init init,
              Callback done);
  // What a restarted shard is given again.
  Defined Definitions() TETHER_EXCLUDES(tensors_mu) {
    MutexLock lock(&tensors_mu);
    return Defined(tensors.begin(), tensors.end());
  }

  // How values travel (ClientOptions::wire_dtype).
  WireDtype dtype() const { return options.wire_dtype; }

  // Sends the part of a dense push (or provide, or assign) of `grad` to
  // `shard` that holds `blocks`; its answer finishes `fanout`. `direct`: the
  // floats are named by address (PushBlocksFrame); should the shard not take
  // that (kProtocol: it cannot read this process), the part goes again with its
  // floats, and so do later pushes to that shard until an answer says it reads
  // them. The highest staleness acknowledged is kept in `max_staleness`.
  void SendDensePart(int shard, uint32_t tensor, int64_t read_clock,
                     PushKind kind, std::vector<uint32_t> blocks,
                     std::span<const float> grad,
                     std::shared_ptr<Fanout> fanout, bool direct,
                     std::atomic<int64_t>* max_staleness);
  // Sends the part of a dense pull into `out` that `shard` holds
  // (`blocks`); its answer finishes `fanout`. `land`: the shard writes the
  // values into a buffer of this process (Pull.landing) that are copied to
  // `out` when it answers, instead of sending them; should it not (kProtocol),
  // the part is asked for again without, and so are later pulls from that
  // shard until a PushAck says it takes this process's memory.
  void SendPullPart(int shard, uint32_t tensor, std::vector<uint32_t> blocks,
                    int64_t for_clock, std::span<float> out,
                    std::shared_ptr<Fanout> fanout, bool land);
  // Whether pushes to `shard` may name their floats by address, and pulls
  // from it land in this process's memory: its last answer to a push said
  // so (PushAck.direct).
  bool DirectTo(int shard) const {
    return options.direct_memory && dtype() == WireDtype::kF32 && direct_to &&
           direct_to[shard].load(std::memory_order_relaxed);
  }
  // `shard` refused a push or pull by memory (kProtocol, `why`): said once
  // here, and its pushes and pulls go over TCP until a PushAck says again
  // that it takes this process's memory.
  void FallBackToTcp(int shard, const Status& why) {
    TETHER_LOG(kInfo) << "shard " << shard << " does not take this "
                      << "process's memory (" << why.message()
                      << "): its pushes and pulls go over TCP";
    direct_to[shard] = false;
  }

  const ClientOptions options;
  WelcomeInfo welcome;  // written by Connect() only
  // Per shard, from its latest PushAck (see DirectTo); sized by Connect().
  std::unique_ptr<std::atomic<bool>[]> direct_to;
  LandingPool landings;
  std::atomic<int64_t> clock{0};
  std::atomic<int64_t> read_clock{0};
  // The clock the last PrefetchAsync was for; Clock() reaching it makes
  // it the read clock.
  std::atomic<int64_t> prefetched_for{-1};
  // The clock ClockPipelined() left in flight; not valid() when none.
  PendingStatus clock_in_flight;

  // PullAsync and PrefetchAsync: for `for_clock`, -1 for the clock now.
  void Pull(const std::string& name, std::span<float> out, int64_t for_clock,
            Callback done);

  Mutex tensors_mu;
  std::unordered_map<std::string, TensorMeta> tensors
      TETHER_GUARDED_BY(tensors_mu);

  Mutex share_mu;
  Client::SharePart share_rest TETHER_GUARDED_BY(share_mu);

  // Last: destroyed first, it joins the I/O threads before anything their
  // callbacks use goes away.
  client_internal::ShardLinks links;
};

namespace {

// Waits for `answer`, spinning for `c`'s spin_us first (running the I/O
// threads' work meanwhile: schema/io_pool.h).
Status Await(Client::Impl& c, PendingStatus& answer) {
  return answer.get(c.options.spin_us, &c.links.io_pool());
}

// Starts a request with `start` and waits for its callback.
Status Wait(Client::Impl& c,
            const std::function<void(Client::Callback)>& start) {
  PendingStatus answer = PendingStatus::Of(start);
  return Await(c, answer);
}

}  // namespace

Result<TensorMeta> Client::Impl::Lookup(const std::string& name, bool sparse) {
  MutexLock lock(&tensors_mu);
  auto it = tensors.find(name);
  if (it == tensors.end() || it->second.sparse != sparse) {
    return NotFound(std::string(sparse ? "table '" : "tensor '") + name +
                    "' is not defined by this client (call Define" +
                    (sparse ? "Table" : "Tensor") + " first)");
  }
  return it->second;
}

Result<Client::Impl::DenseParts> Client::Impl::CutDense(
    const std::string& name, std::string_view request,
    std::initializer_list<std::pair<std::string_view, size_t>> buffers) {
  TETHER_ASSIGN_OR_RETURN(TensorMeta meta, Lookup(name, false));
  for (const auto& [what, floats] : buffers) {
    if (floats != meta.size) {
      return InvalidArgument(std::string(request) + " '" + name +
                             "': " + std::string(what) + " of " +
                             std::to_string(floats) + " floats, the tensor " +
                             "has " + std::to_string(meta.size));
    }
  }
  TETHER_ASSIGN_OR_RETURN(
      std::vector<BlockPart> parts,
      CutBlocks(options.slicer, meta.id, meta.size, welcome.block_size,
                welcome.num_shards, options.chunk_bytes));
  return DenseParts{meta.id, std::move(parts)};
}

void Client::Impl::Define(const std::string& name, bool sparse,
                          const std::vector<uint64_t>& shape, uint32_t dim,
                          Init init, Callback done) {
  uint64_t size = 1;
  for (uint64_t d : shape) size *= d;
  auto id = std::make_shared<std::atomic<uint32_t>>(0);
  auto fanout = std::make_shared<Fanout>(
      links.size(), [this, name, sparse, size, dim, id, shape, init,
                     done = std::move(done)](const Status& s) {
        if (s.ok()) {
          MutexLock lock(&tensors_mu);
          tensors[name] = {id->load(), sparse ? dim : size, sparse, shape, dim,
                           init};
        }
        done(s);
      });
  for (int shard = 0; shard < links.size(); ++shard) {
    uint64_t request = links.NextId();
    OutFrame frame = DefineFrame(request, name, sparse, shape, dim, init);
    links.Send(shard, request, std::move(frame),
               [fanout, id](const wire::Message* m, const Status& error) {
                 if (m == nullptr) return fanout->Finish(error);
                 const wire::DefineAck* ack = m->body_as_DefineAck();
                 if (ack == nullptr) {
                   return fanout->Finish(ProtocolError(
                       "Define answered with " +
                       std::string(wire::EnumNameBody(m->body_type()))));
                 }
                 id->store(ack->id());
                 fanout->Finish(Status::Ok());
               });
  }
}

Client::Client(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Client::~Client() = default;

Result<std::unique_ptr<Client>> Client::Connect(ClientOptions options) {
  if (options.coordinator.empty()) {
    return InvalidArgument("coordinator: no address given");
  }
  if (options.io_threads < 1) {
    return InvalidArgument("io_threads: must be at least 1");
  }
  if (options.chunk_bytes < 1024) {
    return InvalidArgument("chunk_bytes: must be at least 1024");
  }
  std::shared_ptr<const AuthKey> key;
  if (!options.auth_key_file.empty()) {
    TETHER_ASSIGN_OR_RETURN(
        auto loaded, AuthKey::Load(options.auth_key_file, "--auth-key-file"));
    key = loaded;
  }
  TETHER_ASSIGN_OR_RETURN(auto tls,
                          MakeTlsContext(options.tls, TlsRole::kClient));
  auto impl = std::make_unique<Impl>(std::move(options), std::move(key),
                                     std::move(tls));
  Impl& c = *impl;
  TETHER_ASSIGN_OR_RETURN(auto welcome,
                          c.links.Join(0, c.options.coordinator,
                                       c.options.observer ? -1 : c.options.rank,
                                       c.options.join_timeout_ms));
  c.welcome = welcome;
  if (static_cast<int>(c.welcome.shard_addresses.size()) !=
      c.welcome.num_shards) {
    return ProtocolError("the coordinator's Welcome lists " +
                         std::to_string(c.welcome.shard_addresses.size()) +
                         " shards, expected " +
                         std::to_string(c.welcome.num_shards));
  }
  for (int i = 1; i < c.welcome.num_shards; ++i) {
    TETHER_ASSIGN_OR_RETURN(
        auto w, c.links.Join(i, c.welcome.shard_addresses[i], c.welcome.rank,
                             c.options.connect_timeout_ms));
    c.welcome.clock = std::max(c.welcome.clock, w.clock);
  }
  c.clock = c.welcome.clock;
  c.read_clock = c.welcome.clock;
  c.direct_to = std::make_unique<std::atomic<bool>[]>(c.welcome.num_shards);
  c.links.Welcomed(c.welcome.rank, c.welcome.heartbeat_ms,
                   c.welcome.silence_ms);
  return std::unique_ptr<Client>(new Client(std::move(impl)));
}

int Client::rank() const { return impl_->welcome.rank; }
int Client::staleness() const { return impl_->welcome.staleness; }
int Client::num_shards() const { return impl_->welcome.num_shards; }
int Client::num_workers() const { return impl_->welcome.num_workers; }
uint64_t Client::seed() const { return impl_->welcome.seed; }
bool Client::records() const { return impl_->welcome.record; }
uint32_t Client::block_size() const { return impl_->welcome.block_size; }
int64_t Client::clock() const { return impl_->clock; }
int64_t Client::resume_round() const { return impl_->welcome.resume_round; }

void Client::DefineTensorAsync(const std::string& name,
                               const std::vector<uint64_t>& shape, Init init,
                               Callback done) {
  impl_->Define(name, false, shape, 0, init, std::move(done));
}

Status Client::DefineTensor(const std::string& name,
                            const std::vector<uint64_t>& shape, Init init) {
  return Wait(*impl_, [&](Callback cb) {
    DefineTensorAsync(name, shape, init, std::move(cb));
  });
}

void Client::DefineTableAsync(const std::string& name, uint32_t dim, Init init,
                              Callback done) {
  impl_->Define(name, true, {}, dim, init, std::move(done));
}

Status Client::DefineTable(const std::string& name, uint32_t dim, Init init) {
  return Wait(*impl_, [&](Callback cb) {
    DefineTableAsync(name, dim, init, std::move(cb));
  });
}

void Client::PullAsync(const std::string& name, std::span<float> out,
                       Callback done) {
  impl_->Pull(name, out, -1, std::move(done));
}

void Client::PrefetchAsync(const std::string& name, std::span<float> out,
                           Callback done) {
  impl_->Pull(name, out, impl_->MarkPrefetch(), std::move(done));
}

void Client::Impl::Pull(const std::string& name, std::span<float> out,
                        int64_t for_clock, Callback done) {
  auto request = CutDense(name, "pull of", {{"a buffer", out.size()}});
  if (!request.ok()) return done(request.status());
  if (for_clock < 0) read_clock = clock.load();
  auto fanout =
      std::make_shared<Fanout>(request->parts.size(), std::move(done));
  for (auto& [shard, blocks] : request->parts) {
    SendPullPart(shard, request->tensor, std::move(blocks), for_clock, out,
                 fanout, DirectTo(shard));
  }
}

void Client::Impl::SendPullPart(int shard, uint32_t tensor,
                                std::vector<uint32_t> blocks, int64_t for_clock,
                                std::span<float> out,
                                std::shared_ptr<Fanout> fanout, bool land) {
  const uint32_t bs = welcome.block_size;
  LandingPool::Buffer landing;
  if (land) {
    size_t floats = 0;
    for (uint32_t b : blocks) {
      const uint64_t first = uint64_t{b} * bs;
      if (first < out.size())
        floats += std::min<uint64_t>(bs, out.size() - first);
    }
    landing = landings.Take(floats);
  }
  uint64_t request = links.NextId();
  OutFrame frame = PullBlocksFrame(
      request, tensor, blocks, dtype(), for_clock,
      landing ? reinterpret_cast<uintptr_t>(landing->data()) : 0);
  if (!landing) blocks.clear();  // kept only to ask again
  // A link that is down fails the request at once, on this thread, before
  // Send returns: the frame never left.
  auto sent = std::make_shared<std::atomic<bool>>(false);
  links.Send(
      shard, request, std::move(frame),
      [this, shard, tensor, blocks = std::move(blocks), for_clock, out, fanout,
       landing = std::move(landing), sent, caller = std::this_thread::get_id()](
          const wire::Message* m, const Status& e) mutable {
        if (m == nullptr) {
          if (!landing) return fanout->Finish(e);
          const bool never_sent =
              !sent->load() && std::this_thread::get_id() == caller;
          // Unavailable otherwise: perhaps a dropped connection to a shard
          // that may still write; any other error is the shard's answer.
          if (e.code() == Code::kUnavailable && !never_sent) {
            LandingPool::Abandon(std::move(landing));
            return fanout->Finish(e);
          }
          landings.Give(std::move(landing));
          if (e.code() != Code::kProtocol) return fanout->Finish(e);
          FallBackToTcp(shard, e);
          return SendPullPart(shard, tensor, std::move(blocks), for_clock, out,
                              std::move(fanout), false);
        }
        const wire::PullReply* reply = m->body_as_PullReply();
        Status copied =
            reply == nullptr
                ? ProtocolError("pull answered without blocks")
                : CopyPulledBlocks(*reply, welcome.block_size, out,
                                   landing ? std::span<const float>(*landing)
                                           : std::span<const float>());
        if (landing) landings.Give(std::move(landing));
        fanout->Finish(copied);
      });
  sent->store(true);
}

Status Client::Pull(const std::string& name, std::span<float> out) {
  return Wait(*impl_,
              [&](Callback cb) { PullAsync(name, out, std::move(cb)); });
}

Status Client::PullWhenReady(const std::string& name, std::span<float> out,
                             int timeout_ms) {
  const auto start = std::chrono::steady_clock::now();
  bool told = false;
  while (true) {
    Status s = Pull(name, out);
    if (s.code() != Code::kNotReady) return s;
    const auto waited = std::chrono::duration_cast<std::chrono::milliseconds>(
                            std::chrono::steady_clock::now() - start)
                            .count();
    if (waited >= timeout_ms) return s;
    if (!told && waited >= 5000) {
      TETHER_LOG(kInfo) << "waiting for the initial values of '" << name
                        << "' from the worker that provides them: "
                        << s.message();
      told = true;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
}

void Client::PushAsync(const std::string& name, std::span<const float> grad,
                       Callback done) {
  PushDense(name, grad, PushKind::kGradient, std::move(done));
}

void Client::ProvideTensorAsync(const std::string& name,
                                std::span<const float> values, Callback done) {
  PushDense(name, values, PushKind::kProvide, std::move(done));
}

void Client::AssignTensorAsync(const std::string& name,
                               std::span<const float> values, Callback done) {
  PushDense(name, values, PushKind::kAssign, std::move(done));
}

Status Client::AssignTensor(const std::string& name,
                            std::span<const float> values) {
  return Wait(*impl_, [&](Callback cb) {
    AssignTensorAsync(name, values, std::move(cb));
  });
}

Status Client::ProvideTensor(const std::string& name,
                             std::span<const float> values) {
  return Wait(*impl_, [&](Callback cb) {
    ProvideTensorAsync(name, values, std::move(cb));
  });
}

void Client::PushDense(const std::string& name, std::span<const float> grad,
                       PushKind kind, Callback done) {
  Impl& c = *impl_;
  const bool gradient = kind == PushKind::kGradient;
  const char* verb = gradient                     ? "push to"
                     : kind == PushKind::kProvide ? "provide of"
                                                  : "assign to";
  auto request = c.CutDense(
      name, verb, {{gradient ? "a gradient" : "values", grad.size()}});
  if (!request.ok()) return done(request.status());
  int64_t read_clock = c.options.observer ? -1 : c.read_clock.load();
  auto fanout =
      std::make_shared<Fanout>(request->parts.size(), std::move(done));
  for (auto& [shard, blocks] : request->parts) {
    // The gradient is sent (or read by the shard) from the caller's
    // buffer, which stays valid and unchanged until `done` runs (after
    // every part is acknowledged).
    c.SendDensePart(shard, request->tensor, read_clock, kind, std::move(blocks),
                    grad, fanout, gradient && c.DirectTo(shard),
                    &max_push_staleness_);
  }
}

void Client::PushAndPrefetchAsync(const std::string& name,
                                  std::span<const float> grad,
                                  std::span<float> out, Callback pushed,
                                  Callback prefetched) {
  Impl& c = *impl_;
  auto refuse = [&](const Status& why) {
    pushed(why);
    prefetched(why);
  };
  if (c.options.observer) {
    return refuse(ProtocolError("observers have no clock to prefetch for"));
  }
  auto request =
      c.CutDense(name, "push and prefetch of",
                 {{"a gradient", grad.size()}, {"a buffer", out.size()}});
  if (!request.ok()) return refuse(request.status());
  const int64_t read_clock = c.read_clock.load();
  const int64_t next = c.MarkPrefetch();
  const size_t n = request->parts.size();
  auto push_fanout = std::make_shared<Fanout>(n, std::move(pushed));
  auto pull_fanout = std::make_shared<Fanout>(n, std::move(prefetched));
  for (auto& [shard, blocks] : request->parts) {
    // As in PushDense: `grad` stays valid and unchanged until `pushed`.
    c.SendDensePart(shard, request->tensor, read_clock, PushKind::kGradient,
                    blocks, grad, push_fanout, c.DirectTo(shard),
                    &max_push_staleness_);
    c.SendPullPart(shard, request->tensor, std::move(blocks), next, out,
                   pull_fanout, c.DirectTo(shard));
  }
}

void Client::Impl::SendDensePart(int shard, uint32_t tensor, int64_t read_clock,
                                 PushKind kind, std::vector<uint32_t> blocks,
                                 std::span<const float> grad,
                                 std::shared_ptr<Fanout> fanout, bool direct,
                                 std::atomic<int64_t>* max_staleness) {
  uint64_t request = links.NextId();
  OutFrame frame = PushBlocksFrame(request, tensor, read_clock, kind, blocks,
                                   welcome.block_size, grad, dtype(), direct);
  if (!direct) blocks.clear();  // kept only to send again
  links.Send(
      shard, request, std::move(frame),
      [this, shard, tensor, read_clock, kind, blocks = std::move(blocks), grad,
       fanout, direct,
       max_staleness](const wire::Message* m, const Status& e) mutable {
        if (m == nullptr) {
          if (direct && e.code() == Code::kProtocol) {
            FallBackToTcp(shard, e);
            return SendDensePart(shard, tensor, read_clock, kind,
                                 std::move(blocks), grad, std::move(fanout),
                                 false, max_staleness);
          }
          return fanout->Finish(e);
        }
        if (const wire::PushAck* ack = m->body_as_PushAck()) {
          direct_to[shard] = ack->direct();
          int64_t s = ack->staleness();
          int64_t seen = max_staleness->load();
          while (s > seen && !max_staleness->compare_exchange_weak(seen, s)) {
          }
          return fanout->Finish(Status::Ok());
        }
        fanout->Finish(
            ProtocolError("push answered with " +
                          std::string(wire::EnumNameBody(m->body_type()))));
      });
}

Status Client::Push(const std::string& name, std::span<const float> grad) {
  return Wait(*impl_,
              [&](Callback cb) { PushAsync(name, grad, std::move(cb)); });
}

void Client::PullRowsAsync(const std::string& table,
                           std::span<const uint64_t> keys, std::span<float> out,
                           Callback done) {
  Impl& c = *impl_;
  auto meta = c.Lookup(table, true);
  if (!meta.ok()) return done(meta.status());
  const uint64_t dim = meta->size;
  if (out.size() != keys.size() * dim) {
    return done(InvalidArgument("pull of rows of '" + table +
                                "': buffer holds " +
                                std::to_string(out.size()) + " floats, need " +
                                std::to_string(keys.size() * dim)));
  }
  if (keys.empty()) return done(Status::Ok());
  auto parts =
      CutKeys(c.options.slicer, meta->id, keys, static_cast<uint32_t>(dim),
              c.welcome.num_shards, c.options.chunk_bytes);
  if (!parts.ok()) return done(parts.status());
  c.read_clock = c.clock.load();
  auto fanout = std::make_shared<Fanout>(parts->size(), std::move(done));
  for (KeyPart& part : *parts) {
    uint64_t request = c.links.NextId();
    OutFrame frame = PullRowsFrame(request, meta->id, part, c.dtype());
    c.links.Send(part.shard, request, std::move(frame),
                 [fanout, out, dim, positions = std::move(part.positions)](
                     const wire::Message* m, const Status& e) {
                   if (m == nullptr) return fanout->Finish(e);
                   const wire::PullReply* reply = m->body_as_PullReply();
                   if (reply == nullptr) {
                     return fanout->Finish(ProtocolError(
                         "row pull answered with the wrong rows"));
                   }
                   fanout->Finish(CopyPulledRows(*reply, positions, dim, out));
                 });
  }
}

Status Client::PullRows(const std::string& table,
                        std::span<const uint64_t> keys, std::span<float> out) {
  return Wait(*impl_, [&](Callback cb) {
    PullRowsAsync(table, keys, out, std::move(cb));
  });
}

void Client::PushRowsAsync(const std::string& table,
                           std::span<const uint64_t> keys,
                           std::span<const float> grads, Callback done) {
  PushSparse(table, keys, grads, /*provide=*/false, std::move(done));
}

void Client::ProvideRowsAsync(const std::string& table,
                              std::span<const uint64_t> keys,
                              std::span<const float> values, Callback done) {
  PushSparse(table, keys, values, /*provide=*/true, std::move(done));
}

Status Client::ProvideRows(const std::string& table,
                           std::span<const uint64_t> keys,
                           std::span<const float> values) {
  return Wait(*impl_, [&](Callback cb) {
    ProvideRowsAsync(table, keys, values, std::move(cb));
  });
}

void Client::PushSparse(const std::string& table,
                        std::span<const uint64_t> keys,
                        std::span<const float> grads, bool provide,
                        Callback done) {
  Impl& c = *impl_;
  auto meta = c.Lookup(table, true);
  if (!meta.ok()) return done(meta.status());
  const uint64_t dim = meta->size;
  if (grads.size() != keys.size() * dim) {
    return done(
        InvalidArgument("push of rows to '" + table + "': gradient holds " +
                        std::to_string(grads.size()) + " floats, need " +
                        std::to_string(keys.size() * dim)));
  }
  if (keys.empty()) return done(Status::Ok());
  auto parts =
      CutKeys(c.options.slicer, meta->id, keys, static_cast<uint32_t>(dim),
              c.welcome.num_shards, c.options.chunk_bytes);
  if (!parts.ok()) return done(parts.status());
  int64_t read_clock = c.options.observer ? -1 : c.read_clock.load();
  auto fanout = std::make_shared<Fanout>(parts->size(), std::move(done));
  for (KeyPart& part : *parts) {
    uint64_t request = c.links.NextId();
    OutFrame frame = PushRowsFrame(request, meta->id, read_clock, provide, part,
                                   dim, grads, c.dtype());
    c.links.Send(
        part.shard, request, std::move(frame),
        [fanout](const wire::Message* m, const Status& e) {
          if (m == nullptr) return fanout->Finish(e);
          fanout->Finish(m->body_as_PushAck() != nullptr
                             ? Status::Ok()
                             : ProtocolError("row push not acknowledged"));
        });
  }
}

Status Client::PushRows(const std::string& table,
                        std::span<const uint64_t> keys,
                        std::span<const float> grads) {
  return Wait(*impl_, [&](Callback cb) {
    PushRowsAsync(table, keys, grads, std::move(cb));
  });
}

void Client::ClockAsync(Callback done) {
  Impl& c = *impl_;
  if (c.options.observer) {
    return done(ProtocolError("observers have no clock"));
  }
  int64_t clock = ++c.clock;
  // The values prefetched for this clock are what its pushes come from.
  if (c.prefetched_for.load() == clock) c.read_clock = clock;
  auto fanout = std::make_shared<Fanout>(c.links.size(), std::move(done));
  for (int shard = 0; shard < c.links.size(); ++shard) {
    uint64_t request = c.links.NextId();
    flatbuffers::FlatBufferBuilder fbb(64);
    OutFrame frame = FinishFrame(fbb, wire::CreateClock(fbb, request, clock));
    c.links.Send(
        shard, request, std::move(frame),
        [fanout, &c](const wire::Message* m, const Status& e) {
          if (m == nullptr) return fanout->Finish(e);
          const wire::ClockAck* ack = m->body_as_ClockAck();
          if (ack == nullptr) {
            return fanout->Finish(ProtocolError("clock not acknowledged"));
          }
          // A shard that moved this worker ahead (it rejoined, or backup
          // workers closed its clock) says where it is now.
          int64_t mine = c.clock.load();
          while (ack->clock() > mine &&
                 !c.clock.compare_exchange_weak(mine, ack->clock())) {
          }
          fanout->Finish(Status::Ok());
        });
  }
}

Status Client::Clock() {
  TETHER_RETURN_IF_ERROR(AwaitClock());
  return Wait(*impl_, [&](Callback cb) { ClockAsync(std::move(cb)); });
}

Status Client::ClockPipelined() {
  TETHER_RETURN_IF_ERROR(AwaitClock());
  impl_->clock_in_flight =
      PendingStatus::Of([&](Callback cb) { ClockAsync(std::move(cb)); });
  return Status::Ok();
}

Status Client::AwaitClock() {
  PendingStatus& answer = impl_->clock_in_flight;
  return answer.valid() ? Await(*impl_, answer) : Status::Ok();
}

void Client::ReportAsync(const Progress& p, Callback done) {
  Impl& c = *impl_;
  if (c.options.observer) {
    return done(ProtocolError("observers do not report progress"));
  }
  uint64_t request = c.links.NextId();
  flatbuffers::FlatBufferBuilder fbb(256);
  auto device = fbb.CreateString(p.device);
  auto host = fbb.CreateString(p.host);
  wire::WorkerReportBuilder b(fbb);
  b.add_request_id(request);
  b.add_clock(c.clock);
  b.add_epoch(p.epoch);
  b.add_samples(p.samples);
  b.add_loss(p.loss);
  b.add_samples_per_s(p.samples_per_s);
  b.add_test_accuracy(p.test_accuracy);
  b.add_test_loss(p.test_loss);
  b.add_device(device);
  b.add_host(host);
  b.add_wait_fraction(p.wait_fraction);
  b.add_done(p.done);
  c.links.Send(
      0, request, FinishFrame(fbb, b.Finish()),
      [done = std::move(done)](const wire::Message* m, const Status& e) {
        if (m == nullptr) return done(e);
        done(m->body_as_Ack() != nullptr
                 ? Status::Ok()
                 : ProtocolError("report not acknowledged"));
      });
}

Status Client::Report(const Progress& progress) {
  return Wait(*impl_,
              [&](Callback cb) { ReportAsync(progress, std::move(cb)); });
}

Result<int64_t> Client::CheckpointNow() {
  Impl& c = *impl_;
  auto round = std::make_shared<std::atomic<int64_t>>(-1);
  Status s = Wait(*impl_, [&](Callback cb) {
    uint64_t request = c.links.NextId();
    flatbuffers::FlatBufferBuilder fbb(64);
    c.links.Send(
        0, request, FinishFrame(fbb, wire::CreateCheckpointNow(fbb, request)),
        [round, cb = std::move(cb)](const wire::Message* m, const Status& e) {
          if (m == nullptr) return cb(e);
          const wire::CheckpointStarted* started =
              m->body_as_CheckpointStarted();
          if (started == nullptr) {
            return cb(ProtocolError("checkpoint request not answered"));
          }
          round->store(started->round());
          cb(Status::Ok());
        });
  });
  if (!s.ok()) return s;
  return round->load();
}

uint64_t Client::shard_losses() const { return impl_->links.losses(); }

bool Client::stop_requested() const { return impl_->links.stop_requested(); }

std::string Client::stop_reason() const { return impl_->links.stop_reason(); }

Status Client::AwaitShards(int timeout_ms) {
  return impl_->links.AwaitShards(timeout_ms);
}

Result<Client::DataChunk> Client::NextChunk(uint64_t rows, uint32_t chunk_rows,
                                            int epochs, uint32_t batch) {
  Impl& c = *impl_;
  const int64_t now = clock();
  auto chunk = std::make_shared<DataChunk>();
  Status s = Wait(*impl_, [&](Callback cb) {
    uint64_t request = c.links.NextId();
    flatbuffers::FlatBufferBuilder fbb(64);
    c.links.Send(
        0, request,
        FinishFrame(fbb, wire::CreateDataRequest(fbb, request, rows, chunk_rows,
                                                 epochs, now, batch)),
        [chunk, cb = std::move(cb)](const wire::Message* m, const Status& e) {
          if (m == nullptr) return cb(e);
          const wire::DataChunk* d = m->body_as_DataChunk();
          if (d == nullptr) return cb(ProtocolError("no chunk in answer"));
          *chunk = {d->epoch(), d->index(), d->first(), d->count(),
                    d->finished()};
          cb(Status::Ok());
        });
  });
  if (!s.ok()) return s;
  return *chunk;
}

namespace {

// One ShareRequest to shard 0 from worker `c` (its own share of `epoch`,
// or a leftover); `read` takes the answer apart.
Status AskShare(Client::Impl& c, int64_t clock, int epoch, bool leftover,
                uint32_t batch,
                std::function<void(const wire::ShareAnswer&)> read) {
  return Wait(c, [&](Client::Callback cb) {
    uint64_t request = c.links.NextId();
    flatbuffers::FlatBufferBuilder fbb(64);
    c.links.Send(
        0, request,
        FinishFrame(fbb, wire::CreateShareRequest(fbb, request, epoch, clock,
                                                  leftover, batch)),
        [read, cb = std::move(cb)](const wire::Message* m, const Status& e) {
          if (m == nullptr) return cb(e);
          const wire::ShareAnswer* a = m->body_as_ShareAnswer();
          if (a == nullptr) {
            return cb(ProtocolError("no share in answer"));
          }
          read(*a);
          cb(Status::Ok());
        });
  });
}

}  // namespace

Result<Client::DataShare> Client::Share(int epoch, uint32_t batch) {
  auto share = std::make_shared<DataShare>();
  TETHER_RETURN_IF_ERROR(AskShare(
      *impl_, clock(), epoch, false, batch,
      [share](const wire::ShareAnswer& a) {
        *share = {a.decided(), a.index(), a.members(), a.start_clock()};
      }));
  return *share;
}

Result<Client::SharePart> Client::TakeLeftover(int epoch) {
  auto part = std::make_shared<SharePart>();
  TETHER_RETURN_IF_ERROR(AskShare(
      *impl_, clock(), epoch, true, 0, [part](const wire::ShareAnswer& a) {
        if (a.decided()) {
          *part = {a.epoch(), a.index(), a.members(), a.first_row()};
        }
      }));
  return *part;
}

void Client::SetSharePosition(const SharePart& rest) {
  MutexLock lock(&impl_->share_mu);
  impl_->share_rest = rest;
}

Status Client::Leave(const std::string& reason, bool finished) {
  Impl& c = *impl_;
  SharePart rest;
  {
    MutexLock lock(&c.share_mu);
    rest = c.share_rest;
  }
  return Wait(*impl_, [&](Callback cb) {
    uint64_t request = c.links.NextId();
    flatbuffers::FlatBufferBuilder fbb(128);
    c.links.Send(0, request,
                 FinishFrame(fbb, wire::CreateLeave(
                                      fbb, request, fbb.CreateString(reason),
                                      finished, rest.epoch, rest.index,
                                      rest.members, rest.first_row)),
                 [cb = std::move(cb)](const wire::Message* m, const Status& e) {
                   cb(m == nullptr ? e : Status::Ok());
                 });
  });
}

void Client::RequestStop(const std::string& reason) {
  impl_->links.RequestStop(reason);
}

Result<std::vector<ShardStats>> Client::Stats() {
  Impl& c = *impl_;
  auto stats = std::make_shared<std::vector<ShardStats>>(c.links.size());
  Status s = Wait(*impl_, [&](Callback cb) {
    auto fanout = std::make_shared<Fanout>(c.links.size(), std::move(cb));
    for (int i = 0; i < c.links.size(); ++i) {
      uint64_t request = c.links.NextId();
      flatbuffers::FlatBufferBuilder fbb(64);
      OutFrame frame = FinishFrame(fbb, wire::CreateStatsRequest(fbb, request));
      c.links.Send(
          i, request, std::move(frame),
          [fanout, stats, i](const wire::Message* m, const Status& e) {
            if (m == nullptr) return fanout->Finish(e);
            const wire::Stats* r = m->body_as_Stats();
            if (r == nullptr) {
              return fanout->Finish(ProtocolError("stats not answered"));
            }
            (*stats)[i] = ReadStats(*r);
            fanout->Finish(Status::Ok());
          });
    }
  });
  if (!s.ok()) return s;
  return std::move(*stats);
}

}  // namespace tether
