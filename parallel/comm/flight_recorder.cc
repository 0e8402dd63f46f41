#include "parallel/comm/flight_recorder.h"

#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <filesystem>
#include <fstream>
#include <mutex>

#include "base/json.h"
#include "engine/profile/profile.h"

namespace mammoth::parallel::flight {
namespace {

using Clock = std::chrono::steady_clock;

// Entries are fixed-size so recording never allocates: a few hundred ns next to an MPI call
// that costs microseconds.
struct Entry {
  uint64_t id = 0;  // 1, 2, ... in posting order; 0: an empty slot
  int group = -1;
  uint64_t seq = 0;  // per group: collectives and point-to-point numbered apart
  int peer = -1;
  int64_t bytes = 0;
  int64_t posted_ns = 0;      // since the recorder's epoch
  int64_t completed_ns = -1;  // -1: still in flight
  char op[20] = {};
  char what[88] = {};
};

struct Group {
  GroupInfo info;
  uint64_t collectives = 0;
  uint64_t point_to_point = 0;
};

size_t capacity_from_env() {
  const char* s = std::getenv("MAMMOTH_FLIGHT_ENTRIES");
  const long n = s ? std::atol(s) : 0;
  return n > 0 ? static_cast<size_t>(n) : 2048;
}

void copy_text(char* dst, size_t cap, const char* src) {
  std::snprintf(dst, cap, "%s", src ? src : "");
}

class Recorder {
 public:
  Recorder()
      : ring_(capacity_from_env()),
        epoch_(Clock::now()),
        wall_at_epoch_us_(std::chrono::duration_cast<std::chrono::microseconds>(
                              std::chrono::system_clock::now().time_since_epoch())
                              .count()) {}

  int register_group(GroupInfo info) {
    std::lock_guard<std::mutex> lock(mu_);
    groups_.push_back(Group{std::move(info)});
    return static_cast<int>(groups_.size()) - 1;
  }

  void set_world(int rank, int size) {
    std::lock_guard<std::mutex> lock(mu_);
    world_rank_ = rank;
    world_size_ = size;
  }

  uint64_t posted(int group, const char* op, const char* what, int peer, int64_t bytes) {
    const int64_t now = since_epoch_ns();
    std::lock_guard<std::mutex> lock(mu_);
    const uint64_t id = ++last_id_;
    Entry& e = ring_[id % ring_.size()];
    e = Entry{};
    e.id = id;
    e.group = group;
    if (group >= 0 && group < static_cast<int>(groups_.size())) {
      Group& g = groups_[group];
      e.seq = peer < 0 ? ++g.collectives : ++g.point_to_point;
    }
    e.peer = peer;
    e.bytes = bytes;
    e.posted_ns = now;
    copy_text(e.op, sizeof(e.op), op);
    copy_text(e.what, sizeof(e.what), what);
    return id;
  }

  void completed(uint64_t id) {
    const int64_t now = since_epoch_ns();
    std::lock_guard<std::mutex> lock(mu_);
    Entry& e = ring_[id % ring_.size()];
    if (e.id != id) return;  // already overwritten by newer entries
    e.completed_ns = now;
    if (profile::on()) profile_event(e);
  }

  // `train --profile`: the operation as one event on the communication lane, posted to
  // completed (what the caller waited for, transfer included; the merge splits collectives
  // into waiting for the last member and the transfer after it, profile::merge_traces).
  void profile_event(const Entry& e) {
    const int64_t epoch =
        std::chrono::duration_cast<std::chrono::nanoseconds>(epoch_.time_since_epoch()).count();
    const GroupInfo* g = e.group >= 0 && e.group < static_cast<int>(groups_.size())
                             ? &groups_[static_cast<size_t>(e.group)].info
                             : nullptr;
    // The peer's world rank, so that the two ends of a send / recv pair can be matched.
    const int peer_world = g && e.peer >= 0 && e.peer < static_cast<int>(g->world_ranks.size())
                               ? g->world_ranks[static_cast<size_t>(e.peer)]
                               : -1;
    // The group's first world rank and size tell apart groups of one name (each pipeline
    // stage's "dp"), so the merge can find every member's event of one collective.
    const int first_world = g && !g->world_ranks.empty() ? g->world_ranks[0] : -1;
    char args[160];
    std::snprintf(args, sizeof(args),
                  "\"group\":\"%s\",\"group_first\":%d,\"group_size\":%d,\"seq\":%llu,"
                  "\"peer\":%d,\"peer_world\":%d,\"bytes\":%lld",
                  g ? g->name.c_str() : "?", first_world, g ? g->size : 0,
                  static_cast<unsigned long long>(e.seq), e.peer, peer_world,
                  static_cast<long long>(e.bytes));
    profile::complete(profile::Lane::kComm, e.op, epoch + e.posted_ns, epoch + e.completed_ns,
                      args);
  }

  json::Value dump(const std::string& reason) {
    const int64_t now = since_epoch_ns();
    std::lock_guard<std::mutex> lock(mu_);
    char host[256] = {};
    gethostname(host, sizeof(host) - 1);
    json::Value groups = json::Value::array();
    for (size_t i = 0; i < groups_.size(); ++i) {
      const GroupInfo& g = groups_[i].info;
      json::Value members = json::Value::array();
      for (int r : g.world_ranks) members.push_back(r);
      groups.push_back(json::Value::object()
                           .set("id", static_cast<int64_t>(i))
                           .set("name", g.name)
                           .set("backend", g.backend)
                           .set("rank", g.rank)
                           .set("size", g.size)
                           .set("world_ranks", std::move(members))
                           .set("collectives_posted", groups_[i].collectives)
                           .set("point_to_point_posted", groups_[i].point_to_point));
    }
    json::Value entries = json::Value::array();
    const uint64_t first = last_id_ >= ring_.size() ? last_id_ - ring_.size() + 1 : 1;
    for (uint64_t id = first; id <= last_id_; ++id) {
      const Entry& e = ring_[id % ring_.size()];
      if (e.id != id) continue;
      json::Value v = json::Value::object()
                          .set("id", e.id)
                          .set("group", e.group)
                          .set("seq", e.seq)
                          .set("kind", e.peer < 0 ? "collective" : "p2p")
                          .set("op", e.op)
                          .set("what", e.what)
                          .set("bytes", e.bytes)
                          .set("state", e.completed_ns < 0 ? "in_flight" : "completed")
                          .set("posted_us", e.posted_ns / 1000);
      if (e.peer >= 0) v.set("peer", e.peer);
      if (e.completed_ns >= 0) v.set("completed_us", e.completed_ns / 1000);
      entries.push_back(std::move(v));
    }
    return json::Value::object()
        .set("rank", world_rank_)
        .set("world", world_size_)
        .set("host", std::string(host))
        .set("pid", static_cast<int64_t>(getpid()))
        .set("reason", reason)
        .set("wall_at_epoch_us", wall_at_epoch_us_)
        .set("dumped_us", now / 1000)
        .set("capacity", static_cast<int64_t>(ring_.size()))
        .set("recorded", last_id_)
        .set("groups", std::move(groups))
        .set("entries", std::move(entries));
  }

  std::string tail_text(int n) {
    const int64_t now = since_epoch_ns();
    std::lock_guard<std::mutex> lock(mu_);
    std::string out;
    const uint64_t count = std::min<uint64_t>(static_cast<uint64_t>(n > 0 ? n : 0),
                                              std::min<uint64_t>(last_id_, ring_.size()));
    for (uint64_t id = last_id_ - count + 1; count > 0 && id <= last_id_; ++id) {
      const Entry& e = ring_[id % ring_.size()];
      if (e.id != id) continue;
      const std::string group = e.group >= 0 && e.group < static_cast<int>(groups_.size())
                                    ? groups_[e.group].info.name
                                    : "?";
      char line[256];
      const double age_s = static_cast<double>(now - e.posted_ns) * 1e-9;
      std::snprintf(line, sizeof(line), "  #%llu %s on '%s': %s, posted %.3f s ago\n",
                    static_cast<unsigned long long>(e.seq), e.what, group.c_str(),
                    e.completed_ns < 0 ? "IN FLIGHT" : "completed", age_s);
      out += line;
    }
    return out;
  }

  int world_rank() {
    std::lock_guard<std::mutex> lock(mu_);
    return world_rank_;
  }

  void reset() {
    std::lock_guard<std::mutex> lock(mu_);
    std::fill(ring_.begin(), ring_.end(), Entry{});
    groups_.clear();
    last_id_ = 0;
  }

 private:
  int64_t since_epoch_ns() const {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - epoch_).count();
  }

  std::mutex mu_;
  std::vector<Entry> ring_;
  std::deque<Group> groups_;
  uint64_t last_id_ = 0;
  int world_rank_ = 0;
  int world_size_ = 1;
  const Clock::time_point epoch_;
  const int64_t wall_at_epoch_us_;
};

Recorder& recorder() {
  static Recorder r;
  return r;
}

}  // namespace

int register_group(GroupInfo info) { return recorder().register_group(std::move(info)); }
void set_world(int rank, int size) { recorder().set_world(rank, size); }
uint64_t posted(int group, const char* op, const char* what, int peer, int64_t bytes) {
  return recorder().posted(group, op, what, peer, bytes);
}
void completed(uint64_t token) { recorder().completed(token); }
std::string dump_json(const std::string& reason) { return json::dump(recorder().dump(reason), 1); }
std::string tail_text(int n) { return recorder().tail_text(n); }

std::string write_dump(const std::string& reason) {
  const char* dir = std::getenv("MAMMOTH_FLIGHT_DIR");
  if (!dir || !*dir) return "";
  const std::string path =
      std::string(dir) + "/rank_" + std::to_string(recorder().world_rank()) + ".json";
  // The job is failing already: a dump that cannot be written is reported, not thrown.
  const std::string tmp = path + ".tmp";
  try {
    std::filesystem::create_directories(dir);
    {
      std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
      if (!f) throw std::runtime_error(std::string("cannot create: ") + std::strerror(errno));
      f << dump_json(reason) << "\n";
      f.close();
      if (!f)
        throw std::runtime_error(std::string("write failed (disk full?): ") + std::strerror(errno));
    }
    std::filesystem::rename(tmp, path);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "[flight] could not write %s: %s\n", path.c_str(), e.what());
    std::error_code ec;
    std::filesystem::remove(tmp, ec);
    return "";
  }
  return path;
}

void withdraw_dump() {
  const char* dir = std::getenv("MAMMOTH_FLIGHT_DIR");
  if (!dir || !*dir) return;
  std::error_code ec;
  std::filesystem::remove(
      std::string(dir) + "/rank_" + std::to_string(recorder().world_rank()) + ".json", ec);
}

void reset_for_testing() { recorder().reset(); }

}  // namespace mammoth::parallel::flight
