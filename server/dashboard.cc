#include "server/dashboard.h"

#include <boost/json/serialize.hpp>
#include <boost/json/value.hpp>

#include "schema/auth.h"
#include "schema/log.h"
#include "server/health.h"
#include "server/json_text.h"
#include "server/web_assets.h"

namespace tether {
namespace {

constexpr std::string_view kApi = "/api/";

HttpResponse Json(int status, const boost::json::value& value) {
  HttpResponse r;
  r.status = status;
  r.body = JsonText(value);
  return r;
}

HttpResponse Error(int status, const std::string& message) {
  return Json(status, {{"error", message}});
}

// A refused request is logged with the client's address and why (never
// the token), so an operator sees who tries what.
void LogRefusal(const HttpRequest& request, const std::string& why) {
  TETHER_LOG(kWarning) << "dashboard: refused " << request.method << " "
                       << request.target << " from " << request.peer << ": "
                       << why;
}

HttpResponse MethodNotAllowed(const HttpRequest& request,
                              const std::string& allow) {
  HttpResponse r = Error(405, request.method + " is not allowed on " +
                                  request.target + "; use " + allow);
  r.allow = allow;
  return r;
}

}  // namespace

Dashboard::Dashboard(boost::asio::io_context& io, DashboardOptions options,
                     Shard* shard, Coordinator* coordinator)
    : options_(std::move(options)),
      shard_(shard),
      coordinator_(coordinator),
      monitor_(shard->settings()),
      timer_(boost::asio::make_strand(io)) {}

std::shared_ptr<Dashboard> Dashboard::Create(boost::asio::io_context& io,
                                             DashboardOptions options,
                                             Shard* shard,
                                             Coordinator* coordinator) {
  std::shared_ptr<Dashboard> d(
      new Dashboard(io, std::move(options), shard, coordinator));
  std::weak_ptr<Dashboard> weak = d;
  d->http_ = std::make_unique<HttpServer>(
      io, d->options_.http, "/ws",
      [weak](const HttpRequest& r) {
        if (auto self = weak.lock()) return self->Handle(r);
        return HttpResponse{503, "text/plain", "the dashboard stopped\n", "",
                            ""};
      },
      [weak] {
        WsMessage greeting;
        if (auto self = weak.lock()) {
          greeting.text =
              self->monitor_.Snapshot(Monitor::Now(), &greeting.seq);
        }
        return greeting;
      });
  return d;
}

Dashboard::~Dashboard() {
  // Destroying the timer cancels its wait; a handler already queued finds
  // its weak pointer expired.
  stopped_ = true;
  http_->Stop();
}

Status Dashboard::Start() {
  if (!options_.token_file.empty()) {
    TETHER_ASSIGN_OR_RETURN(auto token, LoadOrCreateToken(options_.token_file,
                                                          "--http-token-file"));
    token_ = token;
    TETHER_LOG(kInfo) << "dashboard: POST endpoints need the token in "
                      << options_.token_file;
  }
  TETHER_RETURN_IF_ERROR(http_->Bind());
  LogExposure();
  http_->Start();
  Tick();  // the first figures, before anyone asks
  return Status::Ok();
}

void Dashboard::LogExposure() const {
  // Serving beyond this host without a token or --insecure was refused
  // with the flags (ParseServerOptions).
  if (http_->loopback()) return;
  if (!token_.empty()) {
    TETHER_LOG(kInfo) << "dashboard: " << http_->address()
                      << " is not loopback: anyone who reaches it can read "
                         "the run; POST endpoints need the token";
    return;
  }
  TETHER_LOG(kWarning) << "dashboard: no --http-token-file (--insecure): "
                          "anyone who reaches "
                       << http_->address() << " can read the run";
}

std::string Dashboard::url() const {
  return http_->scheme() + http_->address() + "/";
}

void Dashboard::Stop() {
  if (stopped_.exchange(true)) return;
  boost::asio::post(timer_.get_executor(),
                    [self = shared_from_this()] { self->timer_.cancel(); });
  http_->Stop();
}

void Dashboard::ScheduleTick() {
  if (stopped_) return;
  timer_.expires_after(std::chrono::milliseconds(options_.interval_ms));
  timer_.async_wait(
      [weak = weak_from_this()](const boost::system::error_code& ec) {
        auto self = weak.lock();
        if (self && !ec) self->Tick();
      });
}

void Dashboard::Tick() {
  monitor_.OnShardStats(shard_->Stats());
  monitor_.SetDashboardClients(http_->websocket_clients(),
                               http_->dropped_clients());
  WsMessage update;
  update.text = monitor_.Tick(Monitor::Now(), &update.seq);
  http_->Publish(std::move(update));
  ScheduleTick();
}

HttpResponse Dashboard::CheckpointNow() {
  auto round = coordinator_->CheckpointNow();
  if (!round.ok()) return Error(503, round.status().message());
  TETHER_LOG(kInfo) << "dashboard: checkpoint round " << *round << " requested";
  return Json(202, {{"round", *round}});
}

std::optional<HttpResponse> Dashboard::Refuse(const HttpRequest& request) {
  // A page on another site must not make the cluster do things.
  if (!request.origin.empty() &&
      request.origin != http_->scheme() + request.host) {
    LogRefusal(request, "cross-origin (Origin " + ForLog(request.origin) + ")");
    return Error(403,
                 "cross-origin request from " + request.origin + " refused");
  }
  if (token_.empty()) {
    LogRefusal(request, "POST endpoints are off (no --http-token-file)");
    return Error(403, request.target +
                          " is off: start tether-server with "
                          "--http-token-file to allow it");
  }
  constexpr std::string_view kBearer = "Bearer ";
  const std::string& given = request.authorization;
  if (!given.starts_with(kBearer) ||
      !SameProof(std::string_view(given).substr(kBearer.size()), token_)) {
    LogRefusal(request, given.empty() ? "no token" : "wrong token");
    HttpResponse r =
        Error(401, given.empty() ? "this needs the dashboard token "
                                   "(--http-token-file)"
                                 : "wrong dashboard token");
    r.www_authenticate = "Bearer realm=\"tether\"";
    return r;
  }
  return std::nullopt;
}

HttpResponse Dashboard::StopRun() {
  // A round first (when the run keeps them), so the run can be resumed
  // from where it stopped.
  Result<int64_t> round = coordinator_->CheckpointNow();
  auto told = coordinator_->StopRun("stopped from the dashboard");
  if (!told.ok()) return Error(409, told.status().message());
  monitor_.OnRunStopped("run stopped from the dashboard; " +
                        std::to_string(*told) + " worker(s) told");
  boost::json::object answer{{"workers", *told}};
  if (round.ok()) {
    answer["round"] = *round;
  } else {
    answer["round"] = nullptr;
    answer["checkpoint"] = round.status().message();
  }
  return Json(202, answer);
}

HttpResponse Dashboard::Handle(const HttpRequest& request) {
  const std::string& path = request.target;
  const bool get = request.method == "GET";
  if (auto probe =
          HealthAnswer(request, [this] { return coordinator_->Readiness(); })) {
    return *probe;
  }
  if (path == "/api/checkpoint" || path == "/api/stop") {
    if (request.method != "POST") return MethodNotAllowed(request, "POST");
    if (auto refused = Refuse(request)) return *refused;
    return path == "/api/stop" ? StopRun() : CheckpointNow();
  }
  if (path == "/ws") {
    return Error(426, "/ws is a WebSocket: send an upgrade request");
  }
  if (path == "/metrics") {
    if (!get) return MethodNotAllowed(request, "GET");
    HttpResponse r;
    r.content_type = "text/plain; version=0.0.4; charset=utf-8";
    r.body = monitor_.Metrics();
    return r;
  }
  if (path.starts_with(kApi)) {
    std::optional<std::string> doc =
        monitor_.Document(path.substr(kApi.size()));
    if (!doc) return Error(404, "no such document: " + path);
    if (!get) return MethodNotAllowed(request, "GET");
    HttpResponse r;
    r.body = std::move(*doc);
    return r;
  }
  if (const WebAsset* asset = FindWebAsset(path)) {
    if (!get) return MethodNotAllowed(request, "GET");
    HttpResponse r;
    r.content_type = std::string(ContentType(asset->path));
    r.body.assign(reinterpret_cast<const char*>(asset->data), asset->size);
    return r;
  }
  return Error(404, "not found: " + path);
}

}  // namespace tether
