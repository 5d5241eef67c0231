// Test certificates for TLS (tests/support/make_certs.sh, run with
// Debian's openssl): the run's CA, a certificate it signs (node; SAN
// localhost and 127.0.0.1), and another CA's (other), in a directory.
#pragma once

#include <string>
#include <vector>

#include "schema/status.h"
#include "tests/support/cluster.h"

namespace tether::testing {

struct TestCerts {
  std::string dir;

  // Makes them in `dir` (TETHER_MAKE_CERTS names the script).
  static Result<TestCerts> Make(const std::string& dir) {
    std::string out;
    TETHER_ASSIGN_OR_RETURN(
        int rc, RunToExit({"/bin/bash", TETHER_MAKE_CERTS, dir}, &out, 30000));
    if (rc != 0) return Internal("make_certs.sh failed: " + out);
    return TestCerts{dir};
  }

  std::string File(const std::string& name) const { return dir + "/" + name; }
  // The --tls-* flags for a process holding `leaf`.pem/.key, trusting `ca`.
  std::vector<std::string> Flags(const std::string& leaf = "node",
                                 const std::string& ca = "ca") const {
    return {"--tls-cert",        File(leaf + ".pem"), "--tls-key",
            File(leaf + ".key"), "--tls-ca",          File(ca + ".pem")};
  }
};

}  // namespace tether::testing
