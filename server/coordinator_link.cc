#include "server/coordinator_link.h"

#include <algorithm>
#include <future>

#include "schema/flags.h"
#include "schema/frame.h"
#include "schema/log.h"

namespace tether {

CoordinatorLink::CoordinatorLink(boost::asio::io_context& io, Options options,
                                 Callbacks callbacks)
    : io_(io),
      options_(std::move(options)),
      callbacks_(std::move(callbacks)),
      peer_("coordinator " + options_.coordinator) {}

CoordinatorLink::~CoordinatorLink() {
  Close();
  std::thread rejoin;
  {
    MutexLock lock(&mu_);
    rejoin = std::move(rejoin_);
  }
  if (rejoin.joinable()) rejoin.join();
}

Result<RunSettings> CoordinatorLink::Register() {
  TETHER_ASSIGN_OR_RETURN(RunSettings settings,
                          Connect("", options_.connect_timeout_ms));
  MutexLock lock(&mu_);
  run_id_ = settings.run_id;
  return settings;
}

void CoordinatorLink::Send(OutFrame frame) {
  std::shared_ptr<Connection> conn;
  {
    MutexLock lock(&mu_);
    conn = conn_;
  }
  if (conn) conn->Send(std::move(frame));
}

void CoordinatorLink::Close() {
  closed_ = true;
  std::shared_ptr<Connection> conn;
  {
    MutexLock lock(&mu_);
    conn = conn_;
  }
  if (conn) conn->Close();
}

Result<RunSettings> CoordinatorLink::Connect(const std::string& serving_run_id,
                                             int timeout_ms) {
  TETHER_ASSIGN_OR_RETURN(auto coordinator,
                          ParseHostPort(options_.coordinator, "--coordinator"));
  TETHER_ASSIGN_OR_RETURN(auto tls,
                          MakeTlsContext(options_.tls, TlsRole::kClient));
  auto stream = ConnectWithRetry(io_, coordinator, "the coordinator",
                                 timeout_ms, std::move(tls));
  if (!stream.ok()) return stream.status().WithContext("--coordinator");
  auto conn =
      std::make_shared<Connection>(std::move(*stream), options_.connection);
  std::weak_ptr<Connection> weak = conn;
  auto answer = std::make_shared<std::promise<Result<RunSettings>>>();
  auto answered = std::make_shared<std::atomic<bool>>(false);
  auto welcomed = std::make_shared<std::atomic<bool>>(false);
  auto auth = std::make_shared<PeerAuth>(options_.auth_key);
  conn->Start(
      [answer, answered, welcomed, auth, weak, this](Frame frame) {
        const wire::Message& m = *frame.message();
        if (const auto* challenge = m.body_as_Challenge();
            challenge != nullptr && !answered->load()) {
          auto second = auth->Answer(*challenge, peer_);
          if (second.ok()) {
            if (auto c = weak.lock()) c->Send(std::move(*second));
            return;
          }
          answered->store(true);
          return answer->set_value(second.status());
        }
        if (answered->exchange(true)) {
          if (callbacks_.on_order) callbacks_.on_order(m);
          return;
        }
        if (auto* welcome = m.body_as_Welcome()) {
          if (Status s = auth->CheckWelcome(peer_); !s.ok()) {
            return answer->set_value(s);
          }
          welcomed->store(true);
          answer->set_value(ReadRunConfig(welcome->config()));
        } else if (auto* error = m.body_as_Error()) {
          answer->set_value(StatusFromError(*error, peer_));
        } else {
          answer->set_value(ProtocolError(peer_ + " answered Hello with " +
                                          wire::EnumNameBody(m.body_type())));
        }
      },
      [answer, answered, welcomed, weak, this](const Status& why) {
        if (!answered->exchange(true)) {
          answer->set_value(
              Unavailable(peer_ + " closed the connection" +
                          (why.ok() ? "" : ": " + why.message())));
        } else if (*welcomed) {
          OnLost(weak.lock().get());
        }
      });
  HelloFields hello;
  hello.role = wire::Role::Shard;
  hello.shard_id = options_.shard_id;
  hello.address = options_.address;
  hello.name = "shard " + std::to_string(options_.shard_id);
  hello.command = options_.command;
  hello.manifest = options_.manifest;
  hello.serving_run_id = serving_run_id;
  conn->Send(auth->First(std::move(hello)));
  auto future = answer->get_future();
  if (future.wait_for(std::chrono::milliseconds(std::max(timeout_ms, 1000))) !=
      std::future_status::ready) {
    conn->Close();
    return Status(Code::kTimeout, peer_ + " did not answer Hello");
  }
  Result<RunSettings> settings = future.get();
  if (!settings.ok()) {
    conn->Close();
    return settings;
  }
  std::shared_ptr<Connection> old;
  {
    MutexLock lock(&mu_);
    old = std::exchange(conn_, conn);
  }
  if (old) old->Close();
  if (closed_) conn->Close();  // closed while registering
  return settings;
}

void CoordinatorLink::OnLost(const Connection* conn) {
  if (closed_) return;
  MutexLock lock(&mu_);
  // An older connection that ends late is not news.
  if (conn == nullptr || conn != conn_.get() || rejoining_) return;
  rejoining_ = true;
  lost_ = true;
  TETHER_LOG(kWarning)
      << "lost the " << peer_
      << ": this shard serves on and waits for it to come back (start "
         "shard 0 again with --resume latest and its --listen and "
         "--data-dir); workers wait for it too";
  // The previous one ended when it set rejoining_ back.
  if (rejoin_.joinable()) rejoin_.join();
  rejoin_ = std::thread([this] { Rejoin(); });
}

void CoordinatorLink::Rejoin() {
  const auto lost_at = std::chrono::steady_clock::now();
  std::string run_id;
  {
    MutexLock lock(&mu_);
    run_id = run_id_;
  }
  int delay_ms = 100;
  int attempts = 0;
  while (!closed_) {
    ++attempts;
    auto settings = Connect(run_id, 2000);
    if (settings.ok()) {
      const auto seconds = std::chrono::duration_cast<std::chrono::seconds>(
                               std::chrono::steady_clock::now() - lost_at)
                               .count();
      TETHER_LOG(kWarning) << "registered again with the " << peer_ << " after "
                           << seconds << " s (" << attempts
                           << " attempt(s)); this shard kept its state";
      lost_ = false;
      break;
    }
    const Code code = settings.status().code();
    if (code != Code::kUnavailable && code != Code::kTimeout) {
      if (callbacks_.on_refused) {
        callbacks_.on_refused(settings.status().WithContext(
            "registering again with the " + peer_));
      }
      break;
    }
    // Interruptible: a shard that stops does not wait out the backoff.
    for (int waited = 0; waited < delay_ms && !closed_; waited += 50) {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    delay_ms = std::min(delay_ms * 2, 2000);
  }
  MutexLock lock(&mu_);
  rejoining_ = false;
}

}  // namespace tether
