// The answers a cluster engine's probes get (Kubernetes' liveness and
// readiness): GET /healthz says the process is up and its I/O threads
// answer; GET /readyz says whether the shard serves the run (200 "ready")
// or why not yet (503 with the reason). Served on shard 0's dashboard and,
// with --health, on a port of its own on any shard.
#pragma once

#include <functional>
#include <optional>

#include "schema/status.h"
#include "server/http.h"

namespace tether {

// The answer to a health probe for `request`, or nullopt when its path is
// neither /healthz nor /readyz. `ready` says whether the shard serves the
// run; it runs on an I/O thread.
std::optional<HttpResponse> HealthAnswer(const HttpRequest& request,
                                         const std::function<Status()>& ready);

}  // namespace tether
