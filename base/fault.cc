#include "base/fault.h"

#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>

#include "base/error.h"

namespace mammoth::fault {
namespace {

struct Spec {
  bool active = false;
  std::string kind, phase = "forward";
  int rank = -1;
  int64_t step = -1;
};

Spec parse(const char* text) {
  Spec s;
  if (!text || !*text) return s;
  const std::string v = text;
  const size_t at = v.find('@'), colon = v.find(':', at == std::string::npos ? 0 : at);
  MAMMOTH_CHECK(at != std::string::npos && colon != std::string::npos)
      << "[fault] MAMMOTH_FAULT='" << v << "': expected KIND@RANK:STEP[:PHASE]";
  s.kind = v.substr(0, at);
  const size_t colon2 = v.find(':', colon + 1);
  char* end = nullptr;
  s.rank = static_cast<int>(std::strtol(v.c_str() + at + 1, &end, 10));
  MAMMOTH_CHECK(end == v.c_str() + colon && s.rank >= 0)
      << "[fault] MAMMOTH_FAULT='" << v << "': RANK must be a number >= 0";
  const std::string step =
      v.substr(colon + 1, colon2 == std::string::npos ? std::string::npos : colon2 - colon - 1);
  s.step = std::strtoll(step.c_str(), &end, 10);
  MAMMOTH_CHECK(!step.empty() && *end == 0 && s.step >= 1)
      << "[fault] MAMMOTH_FAULT='" << v << "': STEP must be a number >= 1";
  if (colon2 != std::string::npos) s.phase = v.substr(colon2 + 1);
  static const char* const kKinds[] = {"exit0", "exit1", "kill", "stop", "term", "throw", "stall", "delay"};
  static const char* const kPhases[] = {"forward", "backward", "send", "optimizer", "checkpoint"};
  bool kind_ok = false, phase_ok = false;
  for (const char* k : kKinds) kind_ok |= s.kind == k;
  for (const char* p : kPhases) phase_ok |= s.phase == p;
  MAMMOTH_CHECK(kind_ok) << "[fault] MAMMOTH_FAULT='" << v << "': unknown kind '" << s.kind
                         << "' (exit0, exit1, kill, stop, term, throw, stall, delay)";
  MAMMOTH_CHECK(phase_ok) << "[fault] MAMMOTH_FAULT='" << v << "': unknown phase '" << s.phase
                          << "' (forward, backward, send, optimizer, checkpoint)";
  s.active = true;
  return s;
}

const Spec& spec() {
  static const Spec s = parse(std::getenv("MAMMOTH_FAULT"));
  return s;
}

int g_rank = 0;
int64_t g_step = 0;
bool g_fired = false;

}  // namespace

void set_context(int world_rank, int64_t step) {
  g_rank = world_rank;
  g_step = step;
}

void point(const char* phase) {
  const Spec& s = spec();
  if (!s.active || g_fired || s.rank != g_rank || s.step != g_step || s.phase != phase) return;
  g_fired = true;
  std::fprintf(stderr, "[fault] rank %d, step %lld, %s: injecting %s (MAMMOTH_FAULT)\n", g_rank,
               static_cast<long long>(g_step), phase, s.kind.c_str());
  std::fflush(stderr);
  if (s.kind == "exit0") std::_Exit(0);
  if (s.kind == "exit1") std::_Exit(1);
  if (s.kind == "kill") ::raise(SIGKILL);
  if (s.kind == "stop") ::raise(SIGSTOP);
  if (s.kind == "term") ::raise(SIGTERM);
  if (s.kind == "throw") {
    MAMMOTH_THROW() << "[fault] rank " << g_rank << ": injected error at step " << g_step << ", "
                    << phase;
  }
  if (s.kind == "stall") std::this_thread::sleep_for(std::chrono::hours(1));
  if (s.kind == "delay") std::this_thread::sleep_for(std::chrono::seconds(1));
}

}  // namespace mammoth::fault
