#include "schema/launcher.h"

#include <signal.h>
#include <sys/prctl.h>
#include <unistd.h>

#include <cstdlib>

namespace tether {

void DieWithLauncher() {
  const char* value = std::getenv(kLauncherPidEnv);
  if (value == nullptr) return;
  const long launcher = std::strtol(value, nullptr, 10);
  unsetenv(kLauncherPidEnv);
  if (launcher <= 0) return;
  prctl(PR_SET_PDEATHSIG, SIGTERM);
  // The launcher may have died before prctl: this process was then
  // reparented, and no signal will come.
  if (getppid() != static_cast<pid_t>(launcher)) _exit(1);
}

}  // namespace tether
