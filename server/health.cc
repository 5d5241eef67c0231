#include "server/health.h"

namespace tether {

std::optional<HttpResponse> HealthAnswer(const HttpRequest& request,
                                         const std::function<Status()>& ready) {
  const bool healthz = request.target == "/healthz";
  if (!healthz && request.target != "/readyz") return std::nullopt;
  HttpResponse r;
  r.content_type = "text/plain; charset=utf-8";
  if (request.method != "GET" && request.method != "HEAD") {
    r.status = 405;
    r.allow = "GET, HEAD";
    r.body = request.target + " answers GET\n";
    return r;
  }
  if (healthz) {
    r.body = "ok\n";
    return r;
  }
  Status s = ready();
  if (s.ok()) {
    r.body = "ready\n";
  } else {
    r.status = 503;
    r.body = "not ready: " + s.message() + "\n";
  }
  return r;
}

}  // namespace tether
