// The contract between a launcher (Process::Start in tools/process.h) and
// the tether programs it starts: a child dies with the launcher, even one
// killed with SIGKILL, so that no shard is left holding its data dir.
//
// The kernel does it (PR_SET_PDEATHSIG), but only a process can ask for
// itself, and posix_spawn runs nothing in the child between fork and exec.
// So the launcher puts its pid in the child's environment as
// kLauncherPidEnv, and each program asks at the top of main():
// tether-server, tether-worker and tether-up call DieWithLauncher(), and
// `python3 -m tether.worker` does the same in Python. A program that does
// neither (pgrep, tether-client) just does not die with the launcher.
#pragma once

namespace tether {

inline constexpr char kLauncherPidEnv[] = "TETHER_LAUNCHER_PID";

// When kLauncherPidEnv is set: asks for SIGTERM (so a shard still stops
// cleanly) when the thread that started this process exits, and exits
// (status 1) at once if the launcher is already gone. Removes the variable
// either way, so that what this process starts in turn does not take the
// launcher for its own. Call first in main(), before any thread starts:
// it changes the environment.
void DieWithLauncher();

}  // namespace tether
