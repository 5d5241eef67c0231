#include "worker/signals.h"

#include <signal.h>
#include <unistd.h>

#include <thread>

#include "schema/log.h"
#include "schema/mutex.h"

namespace tether {
namespace {

Mutex g_mu;
Client* g_client TETHER_GUARDED_BY(g_mu) = nullptr;

// Ends the process as `sig` does by default, at once: the kernel's
// doing, with no exit handlers (nor a sanitizer's, which may wait on
// locks the other threads hold).
[[noreturn]] void DieOf(int sig) {
  struct sigaction dfl = {};
  dfl.sa_handler = SIG_DFL;
  sigaction(sig, &dfl, nullptr);
  sigset_t only;
  sigemptyset(&only);
  sigaddset(&only, sig);
  pthread_sigmask(SIG_UNBLOCK, &only, nullptr);
  raise(sig);
  _exit(128 + sig);  // not reached
}

void WaitForSignals(sigset_t set) {
  bool asked = false;
  while (true) {
    int sig = 0;
    if (sigwait(&set, &sig) != 0) continue;
    MutexLock lock(&g_mu);
    if (g_client == nullptr || asked) DieOf(sig);
    asked = true;
    const std::string reason =
        std::string(sig == SIGTERM ? "SIGTERM" : "SIGINT") +
        ": leaving the run";
    TETHER_LOG(kWarning) << reason
                         << " after the current step (again: exit now)";
    g_client->RequestStop(reason);
  }
}

}  // namespace

void StopTrainingOnSignals() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGINT);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  std::thread(WaitForSignals, set).detach();
}

StopOnSignal::StopOnSignal(Client& client) {
  MutexLock lock(&g_mu);
  g_client = &client;
}

StopOnSignal::~StopOnSignal() {
  MutexLock lock(&g_mu);
  g_client = nullptr;
}

}  // namespace tether
