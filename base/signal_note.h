// A signal noted by a handler for code that is blocked elsewhere: the training loop's SIGTERM
// handler sets it, and a rank waiting on communication (parallel/comm) takes it to write its
// flight record before the launcher's SIGKILL follows. Lock-free and constant-initialised, so
// a handler may set it (async-signal-safe).
#pragma once

#include <atomic>

namespace mammoth {

inline std::atomic<int> g_noted_signal{0};

inline void note_signal(int sig) noexcept { g_noted_signal.store(sig, std::memory_order_relaxed); }

// The signal noted since the last call, or 0.
inline int take_noted_signal() noexcept {
  return g_noted_signal.exchange(0, std::memory_order_relaxed);
}

}  // namespace mammoth
