#include "parallel/comm/flight_report.h"

#include <algorithm>
#include <filesystem>
#include <map>
#include <set>
#include <sstream>

#include "base/error.h"

namespace mammoth::parallel::flight {
namespace {

// Ranks that post the same collective this much later than the first one held it up.
constexpr double kLateS = 1.0;

struct Op {
  int64_t seq = 0;
  std::string what;
  bool in_flight = false;
  int peer = -1;        // group rank of a point-to-point peer
  double age_s = 0;     // how long before the dump it was posted
  double posted_s = 0;  // wall-clock time it was posted
};

// One group as one rank recorded it.
struct Membership {
  std::string name;
  std::vector<int> world_ranks;
  int64_t collectives = 0;
  Op last_collective;
  std::vector<Op> in_flight;
  std::map<int64_t, double> collective_posted_s;  // seq -> wall-clock time it was posted
};

struct RankRecord {
  int rank = 0;
  std::string host, reason;
  int64_t pid = 0;
  std::map<std::string, Membership> groups;  // by group key
  bool waiting = false;                      // anything in flight
  double oldest_wait_s = 1e300;              // when the oldest operation in flight was posted
  bool timed_out = false;                    // dumped at its deadline (not on a signal)
};

std::string group_key(const std::string& name, const std::vector<int>& ranks) {
  std::string key = name + " [";
  for (size_t i = 0; i < ranks.size(); ++i) key += (i ? "," : "") + std::to_string(ranks[i]);
  return key + "]";
}

std::string list(const std::vector<int>& ranks) {
  std::string s;
  for (size_t i = 0; i < ranks.size(); ++i) s += (i ? ", " : "") + std::to_string(ranks[i]);
  return s;
}

RankRecord read_record(const json::Value& d) {
  RankRecord r;
  r.rank = static_cast<int>(d.at("rank").as_int());
  r.host = d.at("host").as_string();
  r.reason = d.at("reason").as_string();
  // The deadline's message (abort_job_on_timeout) ends by naming the flag.
  r.timed_out = r.reason.find("(--comm-timeout)") != std::string::npos;
  r.pid = d.at("pid").as_int();
  const int64_t dumped_us = d.at("dumped_us").as_int();
  const int64_t wall_at_epoch_us = d.at("wall_at_epoch_us").as_int();
  std::map<int64_t, std::string> key_of;
  // A group built twice over the same ranks (every rank builds its groups in the same order,
  // as splits are collective) is told apart by its occurrence: "world [0,1] #2".
  std::map<std::string, int> seen;
  for (const json::Value& g : d.at("groups")) {
    std::vector<int> ranks;
    for (const json::Value& w : g.at("world_ranks")) ranks.push_back(static_cast<int>(w.as_int()));
    std::string key = group_key(g.at("name").as_string(), ranks);
    if (const int n = ++seen[key]; n > 1) key += " #" + std::to_string(n);
    key_of[g.at("id").as_int()] = key;
    Membership& m = r.groups[key];
    m.name = g.at("name").as_string();
    m.world_ranks = ranks;
    m.collectives = g.at("collectives_posted").as_int();
  }
  for (const json::Value& e : d.at("entries")) {
    const auto k = key_of.find(e.at("group").as_int());
    if (k == key_of.end()) continue;
    Membership& m = r.groups[k->second];
    Op op;
    op.seq = e.at("seq").as_int();
    op.what = e.at("what").as_string();
    op.in_flight = e.at("state").as_string() == "in_flight";
    if (const json::Value* p = e.find("peer")) op.peer = static_cast<int>(p->as_int());
    op.age_s = static_cast<double>(dumped_us - e.at("posted_us").as_int()) * 1e-6;
    op.posted_s = static_cast<double>(wall_at_epoch_us + e.at("posted_us").as_int()) * 1e-6;
    if (e.at("kind").as_string() == "collective") {
      if (op.seq >= m.last_collective.seq) m.last_collective = op;
      m.collective_posted_s[op.seq] = op.posted_s;
    }
    if (op.in_flight) {
      m.in_flight.push_back(op);
      r.waiting = true;
      r.oldest_wait_s = std::min(r.oldest_wait_s, op.posted_s);
    }
  }
  return r;
}

// The member's view of group `key`, or nullptr when its record lacks the group.
const Membership* membership(const std::map<int, RankRecord>& records, int rank,
                             const std::string& key) {
  const auto r = records.find(rank);
  if (r == records.end()) return nullptr;
  const auto g = r->second.groups.find(key);
  return g == r->second.groups.end() ? nullptr : &g->second;
}

std::string describe(const Op& op) {
  std::ostringstream s;
  s << "#" << op.seq << " " << op.what;
  if (op.in_flight) {
    s << " (in flight " << std::fixed;
    s.precision(1);
    s << op.age_s << " s)";
  } else {
    s << " (completed)";
  }
  return s.str();
}

}  // namespace

Report merge_dumps(const std::vector<json::Value>& dumps) {
  MAMMOTH_CHECK(!dumps.empty()) << "[flight] no dumps to merge";
  std::map<int, RankRecord> records;
  int world = 0;
  for (const json::Value& d : dumps) {
    RankRecord r = read_record(d);
    world = std::max(world, static_cast<int>(d.at("world").as_int()));
    records[r.rank] = std::move(r);
  }
  std::ostringstream out;
  std::set<int> suspects;
  std::vector<int> missing;
  for (int r = 0; r < world; ++r) {
    if (!records.count(r)) missing.push_back(r);
  }
  out << "[flight] " << records.size() << " of " << world << " rank(s) left a record";
  if (!missing.empty()) out << "; none from rank(s) " << list(missing);
  out << "\n";

  // Every group any rank knows, by key, with its members' views.
  std::map<std::string, std::vector<int>> members;
  for (const auto& [rank, rec] : records) {
    for (const auto& [key, m] : rec.groups) members[key] = m.world_ranks;
  }
  for (const auto& [key, ranks] : members) {
    int64_t most = 0;
    for (int r : ranks) {
      if (const Membership* m = membership(records, r, key)) most = std::max(most, m->collectives);
    }
    // What the leaders wait in, from any leader's record.
    std::string awaited;
    std::vector<int> leaders;
    for (int r : ranks) {
      const Membership* m = membership(records, r, key);
      if (!m || m->collectives != most) continue;
      leaders.push_back(r);
      if (m->last_collective.in_flight) awaited = describe(m->last_collective);
    }
    // A collective some member waits in that another reached only long after the first: a
    // rank that was stopped or stuck and resumed (SIGCONT, say) before the dumps. What it did
    // after that came after the waiter's deadline, so its count does not make the waiter late.
    std::set<int64_t> reached_late;
    std::set<int> late;
    for (int w : ranks) {
      const Membership* mw = membership(records, w, key);
      if (!mw || !mw->last_collective.in_flight) continue;
      const int64_t seq = mw->last_collective.seq;
      double first = 1e300;
      for (int r : ranks) {
        const Membership* m = membership(records, r, key);
        if (!m) continue;
        if (const auto it = m->collective_posted_s.find(seq); it != m->collective_posted_s.end())
          first = std::min(first, it->second);
      }
      for (int r : ranks) {
        const Membership* m = membership(records, r, key);
        if (!m || late.count(r)) continue;
        const auto it = m->collective_posted_s.find(seq);
        if (it == m->collective_posted_s.end() || it->second - first < kLateS) continue;
        out << "[flight] rank " << r << " reached " << describe(mw->last_collective)
            << " on group '" << key << "' "
            << static_cast<int64_t>((it->second - first) * 10 + 0.5) / 10.0
            << " s after the first rank (it was stalled, stopped or slow)\n";
        suspects.insert(r);
        late.insert(r);
        reached_late.insert(seq);
      }
    }
    for (int r : ranks) {
      if (!records.count(r)) {
        if (!awaited.empty()) {
          out << "[flight] rank " << r << " left no record on group '" << key << "': rank(s) "
              << list(leaders) << " wait in " << awaited << " (rank " << r
              << " stalled outside communication, was stopped or killed)\n";
          suspects.insert(r);
        }
        continue;
      }
      const Membership* m = membership(records, r, key);
      if (!m || m->collectives >= most || late.count(r)) continue;
      if (m->last_collective.in_flight && reached_late.count(m->last_collective.seq)) continue;
      out << "[flight] rank " << r << " fell behind on group '" << key << "': it posted "
          << m->collectives << " collective(s), rank(s) " << list(leaders) << " posted " << most;
      if (!awaited.empty()) out << " and wait in " << awaited;
      out << "; rank " << r << "'s last: "
          << (m->last_collective.seq ? describe(m->last_collective) : std::string("none")) << "\n";
      suspects.insert(r);
    }
  }

  // Point-to-point waits name their peer; follow each wait to a rank that waits for nothing.
  for (const auto& [rank, rec] : records) {
    for (const auto& [key, m] : rec.groups) {
      for (const Op& op : m.in_flight) {
        if (op.peer < 0 || op.peer >= static_cast<int>(m.world_ranks.size())) continue;
        const int peer = m.world_ranks[static_cast<size_t>(op.peer)];
        out << "[flight] rank " << rank << " waits in " << describe(op) << " on group '" << key
            << "' for world rank " << peer;
        if (!records.count(peer)) {
          out << ", which left no record\n";
          suspects.insert(peer);
        } else if (!records.at(peer).waiting) {
          out << ", which waits for nothing (busy outside communication)\n";
          suspects.insert(peer);
        } else if (const double later = records.at(peer).oldest_wait_s - op.posted_s;
                   later >= kLateS) {
          // The peer waits too, but began only after this wait had run long: it was stalled,
          // stopped (and resumed before the dumps) or slow when this rank needed it.
          out << ", which began waiting only " << static_cast<int64_t>(later * 10 + 0.5) / 10.0
              << " s later (it was stalled, stopped or slow)\n";
          suspects.insert(peer);
        } else if (rec.timed_out && !records.at(peer).timed_out) {
          // This rank waited out its whole deadline; the peer, waiting too, had not reached its
          // own when the abort came: it entered its wait late.
          out << ", which had not reached its own deadline (it was stalled, stopped or slow)\n";
          suspects.insert(peer);
        } else {
          out << "\n";
        }
      }
    }
  }

  for (const auto& [rank, rec] : records) {
    out << "[flight] rank " << rank << " (" << rec.host << ", pid " << rec.pid
        << "): " << rec.reason << "\n";
    for (const auto& [key, m] : rec.groups) {
      for (const Op& op : m.in_flight) {
        out << "[flight]   in flight on '" << key << "': " << describe(op) << "\n";
      }
    }
  }
  // A rank that is behind but itself waits (on a peer's send, say) is held up, not the cause:
  // the cause is a rank that left no record or waits for nothing.
  std::vector<int> causes, held_up;
  for (int r : suspects) {
    const bool waits = records.count(r) && records.at(r).waiting;
    (waits ? held_up : causes).push_back(r);
  }
  Report report;
  report.suspects = causes.empty() ? held_up : causes;
  if (report.suspects.empty()) {
    out << "[flight] no rank fell behind by sequence number\n";
  } else {
    out << "[flight] fell behind: rank(s) " << list(report.suspects);
    if (!causes.empty() && !held_up.empty()) {
      out << " (rank(s) " << list(held_up) << " wait on them)";
    }
    out << "\n";
  }
  report.text = out.str();
  return report;
}

Report merge_dump_dir(const std::string& dir) {
  MAMMOTH_CHECK(std::filesystem::is_directory(dir))
      << "[flight] " << dir << " is not a directory (train writes SAVE_DIR/flight)";
  std::vector<json::Value> dumps;
  std::string unreadable;
  std::vector<std::filesystem::path> files;
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    const std::string name = e.path().filename().string();
    if (name.rfind("rank_", 0) == 0 && e.path().extension() == ".json") files.push_back(e.path());
  }
  std::sort(files.begin(), files.end());
  for (const auto& f : files) {
    try {
      dumps.push_back(json::parse_file(f.string()));
    } catch (const std::exception& e) {
      unreadable += "[flight] skipped " + f.string() + ": " + e.what() + "\n";
    }
  }
  MAMMOTH_CHECK(!dumps.empty()) << "[flight] no readable rank_*.json in " << dir << "\n"
                                << unreadable;
  Report report = merge_dumps(dumps);
  report.text = unreadable + report.text;
  return report;
}

}  // namespace mammoth::parallel::flight
