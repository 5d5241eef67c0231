// A worker's part of the run manifest: everything about it that decides
// what it computes (model and widths, batch, epochs, data files with their
// SHA-256, chunk rows, threads, device, slowdown), how it was started, on
// which host, and the tether build. Told to the coordinator in Hello
// (ClientOptions::manifest), which keeps it in every round; tether-up
// --manifest starts the worker again from it.
#pragma once

#include <string>
#include <vector>

#include "worker/trainer.h"

namespace tether {

// The files a --data or --test-data value reads: "fashion-mnist" (the
// train or test split of the Debian package), "IMAGES,LABELS", or one
// LIBSVM file.
std::vector<std::string> DataFiles(const std::string& spec, bool train);

// The manifest of a tether-worker started with `argv` and options `o`, as
// a JSON object:
//   {"program": "tether-worker", "version", "commit", "host", "argv": [...],
//    "settings": {"model", "hidden", "batch", "epochs", "threads", "device",
//                 "slowdown", "chunk_rows", "staleness", "eval_every",
//                 "data", "test_data"},
//    "data_files": [{"path", "sha256", "bytes"} or {"path", "error"}]}
// A data file that cannot be read is listed with the error (training then
// fails on it and says so).
std::string WorkerManifest(const TrainerOptions& o,
                           const std::vector<std::string>& argv);

}  // namespace tether
