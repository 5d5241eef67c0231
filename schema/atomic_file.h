// Files that other processes read while this one writes them (a shard's
// --ready-file, tether-up's --summary-file): a reader sees the old file or
// the new one whole, never a part.
#pragma once

#include <string>
#include <string_view>

#include "schema/status.h"

namespace tether {

// Writes `text` to PATH.tmp, fsyncs it and renames it over `path` (atomic
// within one filesystem). kIoError naming the path and the reason when a
// step fails; PATH.tmp is removed then and `path` is left as it was.
Status WriteFileAtomically(const std::string& path, std::string_view text);

}  // namespace tether
