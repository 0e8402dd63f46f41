// engine/offload/ordered_reducer: units launch in the fixed order only once ready, never more
// than max_in_flight at once, and complete oldest first; poll completes only a done front.
#include "engine/offload/ordered_reducer.h"

#include <catch2/catch.hpp>
#include <string>
#include <vector>

using mammoth::engine::offload::OrderedReducer;

namespace {

struct Log {
  std::vector<std::string> events;
  std::vector<bool> done;  // per unit: what test() reports
};

OrderedReducer make(Log& log, std::vector<int> order, std::vector<int> need, int bound) {
  log.done.assign(need.size(), false);
  return OrderedReducer(std::move(order), std::move(need), bound, [&log](int u) {
    log.events.push_back("launch " + std::to_string(u));
    return OrderedReducer::Op{[&log, u] { return static_cast<bool>(log.done[u]); },
                              [&log, u] { log.events.push_back("complete " + std::to_string(u)); }};
  });
}

}  // namespace

TEST_CASE("units launch in the given order, each once all its pieces are ready") {
  Log log;
  OrderedReducer r = make(log, {2, 1, 0}, {1, 2, 1}, 0);
  r.begin();
  r.ready(0);  // unit 0 is last in the order: nothing launches
  r.ready(1);  // unit 1 needs two pieces
  CHECK(log.events.empty());
  r.ready(2);  // unit 2 first in order: launches; unit 1 still needs a piece
  CHECK(log.events == std::vector<std::string>{"launch 2"});
  r.ready(1);  // unit 1 ready: it and the already ready unit 0 launch, in order
  CHECK(log.events == std::vector<std::string>{"launch 2", "launch 1", "launch 0"});
  CHECK(r.all_launched());
  CHECK(r.in_flight() == 3);  // no bound
  r.complete_all();
  CHECK(log.events.back() == "complete 0");
  CHECK(log.events[3] == "complete 2");  // oldest first
  // A new backward starts from nothing; launch_rest posts the units never ready, in order.
  log.events.clear();
  r.begin();
  r.ready(0);
  r.launch_rest();
  CHECK(log.events == std::vector<std::string>{"launch 2", "launch 1", "launch 0"});
  r.complete_all();
}

TEST_CASE("at most max_in_flight are outstanding: the oldest completes first") {
  Log log;
  OrderedReducer r = make(log, {0, 1, 2, 3}, {1, 1, 1, 1}, 2);
  r.begin();
  for (int u = 0; u < 4; ++u) {
    r.ready(u);
    CHECK(r.in_flight() <= 2);
  }
  CHECK(log.events == std::vector<std::string>{"launch 0", "launch 1", "complete 0", "launch 2",
                                               "complete 1", "launch 3"});
  // post() obeys the same bound.
  r.post({nullptr, [&log] { log.events.push_back("complete posted"); }});
  CHECK(log.events.back() == "complete 2");
  r.complete_all();
  CHECK(log.events.back() == "complete posted");
}

TEST_CASE("poll completes the done operations at the front only") {
  Log log;
  OrderedReducer r = make(log, {0, 1, 2}, {1, 1, 1}, 0);
  r.begin();
  for (int u = 0; u < 3; ++u) r.ready(u);
  log.done[1] = true;  // done, but behind unit 0
  r.poll(true);
  CHECK(r.in_flight() == 3);
  log.done[0] = true;
  r.poll(false);  // progress only
  CHECK(r.in_flight() == 3);
  r.poll(true);  // 0 and 1 complete; 2 is not done
  CHECK(r.in_flight() == 1);
  CHECK(log.events.back() == "complete 1");
  CHECK_THROWS_WITH(r.begin(), Catch::Contains("collectives in flight"));
  r.complete_all();
}
