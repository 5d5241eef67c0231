// libFuzzer target: the dashboard's request path. Bytes as a client sends
// them are parsed the way a dashboard session parses them (Beast, under the
// default header and body limits) and a parsed request is answered by a
// fresh shard 0's Dashboard::Handle (tests/fuzz/shard0.h).
#include <cstdint>
#include <string_view>

#include "schema/log.h"
#include "server/http.h"
#include "tests/fuzz/shard0.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace tether;
  static fuzz::Shard0* s0 = [] {
    InitLogging("fuzz", LogLevel::kError);
    return new fuzz::Shard0();  // Handle changes nothing it reads
  }();
  ParsedRequest parsed = ParseHttpRequest(
      std::string_view(reinterpret_cast<const char*>(data), size),
      s0->options.dashboard.http);
  if (parsed.status != 0) return 0;
  HttpResponse answer = s0->dashboard->Handle(parsed.request);
  if (answer.status < 200 || answer.status > 599) __builtin_trap();
  return 0;
}
