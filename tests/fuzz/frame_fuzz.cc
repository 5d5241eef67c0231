// libFuzzer target: bytes as they arrive on a shard's socket. The frame
// header, the FlatBuffers verifier, and the readers of the messages whose
// contents we copy out (Stats, the run configuration, Error).
#include <cstdint>
#include <cstring>

#include "schema/frame.h"
#include "schema/stats_frame.h"
#include "server/run_settings.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace tether;
  if (size < kFrameHeaderBytes) return 0;
  auto length = ParseFrameHeader(data, size_t{1} << 20);
  if (!length.ok() || *length > size - kFrameHeaderBytes) return 0;
  Frame frame(*length);
  std::memcpy(frame.body(), data + kFrameHeaderBytes, *length);
  if (!frame.Verify().ok()) return 0;
  const wire::Message& m = *frame.message();
  if (const wire::Stats* stats = m.body_as_Stats()) (void)ReadStats(*stats);
  if (const wire::Welcome* w = m.body_as_Welcome()) {
    (void)ReadRunConfig(w->config());
  }
  if (const wire::Error* e = m.body_as_Error()) {
    (void)StatusFromError(*e, "fuzz");
  }
  return 0;
}
