// What this build of tether is: its version and the commit it was built
// from, embedded at build time (cmake/build_info.cmake), for run manifests
// and logs. Thread-safe.
#pragma once

namespace tether {

// "0.1.0": the project's version (CMakeLists.txt).
const char* TetherVersion();
// The git commit (40 hex digits) the build was made from, with "-dirty"
// when tracked files differed from it; "unknown" outside a git checkout.
const char* TetherCommit();

}  // namespace tether
