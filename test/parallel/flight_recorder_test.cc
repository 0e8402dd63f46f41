// The flight recorder's ring and the report that merges per-rank dumps, on dumps made by the
// recorder itself for simulated ranks (the real multi-process case: fault_matrix_test).
#include "parallel/comm/flight_recorder.h"

#include <catch2/catch.hpp>
#include <cstdlib>

#include "base/json.h"
#include "parallel/comm/flight_report.h"

using namespace mammoth;
namespace flight = mammoth::parallel::flight;

namespace {

// One simulated rank's record: `collectives` all_reduces on the world group of `world` ranks,
// the last one left in flight when `last_in_flight`; then an optional p2p wait.
json::Value rank_dump(int rank, int world, int collectives, bool last_in_flight,
                      std::vector<int> p2p_group = {}, int p2p_peer = -1) {
  flight::reset_for_testing();
  flight::set_world(rank, world);
  std::vector<int> all;
  for (int r = 0; r < world; ++r) all.push_back(r);
  const int g = flight::register_group(
      {.name = "world", .backend = "mpi", .rank = rank, .size = world, .world_ranks = all});
  for (int i = 1; i <= collectives; ++i) {
    const uint64_t t = flight::posted(g, "all_reduce", "all_reduce(sum, f32, 8 elements)", -1, 32);
    if (i < collectives || !last_in_flight) flight::completed(t);
  }
  if (p2p_peer >= 0) {
    int me = 0;
    for (size_t i = 0; i < p2p_group.size(); ++i) {
      if (p2p_group[i] == rank) me = static_cast<int>(i);
    }
    const int p = flight::register_group({.name = "pp",
                                          .backend = "mpi",
                                          .rank = me,
                                          .size = static_cast<int>(p2p_group.size()),
                                          .world_ranks = p2p_group});
    flight::posted(p, "recv", "recv(from 1, f32, 64 elements)", p2p_peer, 256);
  }
  return json::parse(flight::dump_json("test"));
}

}  // namespace

TEST_CASE("the ring keeps the newest entries in order and marks what is in flight") {
  flight::reset_for_testing();
  const int g = flight::register_group(
      {.name = "dp", .backend = "mpi", .rank = 0, .size = 2, .world_ranks = {0, 1}});
  const size_t capacity = 2048;  // the default (MAMMOTH_FLIGHT_ENTRIES unset)
  REQUIRE(std::getenv("MAMMOTH_FLIGHT_ENTRIES") == nullptr);
  for (size_t i = 0; i < capacity + 10; ++i) {
    const uint64_t t = flight::posted(g, "all_reduce", "all_reduce(avg, f32, 4 elements)", -1, 16);
    if (i + 1 < capacity + 10) flight::completed(t);
  }
  const json::Value d = json::parse(flight::dump_json("why"));
  CHECK(d.at("reason").as_string() == "why");
  const json::Value& e = d.at("entries");
  REQUIRE(e.size() == capacity);
  CHECK(e[0].at("seq").as_int() == 11);  // the 10 oldest were overwritten
  CHECK(e[e.size() - 1].at("seq").as_int() == static_cast<int64_t>(capacity + 10));
  CHECK(e[e.size() - 1].at("state").as_string() == "in_flight");
  CHECK(e[e.size() - 2].at("state").as_string() == "completed");
  CHECK(d.at("groups")[0].at("collectives_posted").as_int() == static_cast<int64_t>(capacity + 10));
  CHECK(flight::tail_text(2).find("IN FLIGHT") != std::string::npos);
}

TEST_CASE("the report names the rank that posted fewer collectives") {
  const flight::Report r = flight::merge_dumps(
      {rank_dump(0, 3, 5, true), rank_dump(1, 3, 4, false), rank_dump(2, 3, 5, true)});
  INFO(r.text);
  CHECK(r.suspects == std::vector<int>{1});
  CHECK(r.text.find("rank 1 fell behind on group 'world [0,1,2]': it posted 4") !=
        std::string::npos);
}

TEST_CASE("the report names a rank that left no record while the others wait for it") {
  const flight::Report r =
      flight::merge_dumps({rank_dump(0, 3, 5, true), rank_dump(2, 3, 5, true)});
  INFO(r.text);
  CHECK(r.suspects == std::vector<int>{1});
  CHECK(r.text.find("none from rank(s) 1") != std::string::npos);
}

TEST_CASE("the report follows point-to-point waits to the rank that waits for nothing") {
  // Rank 0 waits to receive from rank 1, which waits to receive from rank 2, which is busy
  // elsewhere: rank 2 is the cause, rank 1 only held up (although it is behind on 'world').
  const flight::Report r =
      flight::merge_dumps({rank_dump(0, 3, 3, false, {0, 1}, 1),
                           rank_dump(1, 3, 2, false, {1, 2}, 1), rank_dump(2, 3, 3, false)});
  INFO(r.text);
  CHECK(r.suspects == std::vector<int>{2});
  CHECK(r.text.find("waits for nothing") != std::string::npos);
  CHECK(r.text.find("rank(s) 1 wait on them") != std::string::npos);
}

TEST_CASE("no suspect when every rank is at the same collective") {
  const flight::Report r =
      flight::merge_dumps({rank_dump(0, 2, 4, true), rank_dump(1, 2, 4, true)});
  CHECK(r.suspects.empty());
  CHECK(r.text.find("no rank fell behind") != std::string::npos);
  CHECK_THROWS_WITH(flight::merge_dumps({}), Catch::Contains("no dumps"));
}

TEST_CASE("a rank that reached the awaited collective late is named, not the rank that waited") {
  // Rank 1 was stopped before #5; rank 0 waited in #5 until its deadline; rank 1 then resumed
  // (mpirun's SIGCONT before its SIGTERM), joined #5 5 s late and went on into #6.
  const json::Value waiter = rank_dump(0, 2, 5, true);
  json::Value late = rank_dump(1, 2, 6, true);
  const int64_t shift_us = 5000000;
  late.set("dumped_us", json::Value(late.at("dumped_us").as_int() + shift_us));
  json::Value& entries = late.at("entries");
  for (size_t i = 0; i < entries.size(); ++i) {
    json::Value& e = entries[i];
    if (e.at("seq").as_int() >= 5)
      e.set("posted_us", json::Value(e.at("posted_us").as_int() + shift_us));
  }
  const flight::Report r = flight::merge_dumps({waiter, late});
  INFO(r.text);
  CHECK(r.suspects == std::vector<int>{1});
  CHECK(r.text.find("rank 1 reached #5 all_reduce(sum, f32, 8 elements)") != std::string::npos);
  CHECK(r.text.find("rank 0 fell behind") == std::string::npos);
}

TEST_CASE("a peer that began its point-to-point wait long after the waiter is named") {
  // Pipeline stages: rank 0 waits to receive from rank 1, which was stopped and, resumed 5 s
  // later, waits to receive from rank 0 in turn.
  const json::Value waiter = rank_dump(0, 2, 3, false, {0, 1}, 1);
  json::Value late = rank_dump(1, 2, 3, false, {0, 1}, 0);
  const int64_t shift_us = 5000000;
  late.set("dumped_us", json::Value(late.at("dumped_us").as_int() + shift_us));
  json::Value& entries = late.at("entries");
  json::Value& recv = entries[entries.size() - 1];
  REQUIRE(recv.at("state").as_string() == "in_flight");
  recv.set("posted_us", json::Value(recv.at("posted_us").as_int() + shift_us));
  const flight::Report r = flight::merge_dumps({waiter, late});
  INFO(r.text);
  CHECK(r.suspects == std::vector<int>{1});
  CHECK(r.text.find("for world rank 1, which began waiting only 5") != std::string::npos);
}

TEST_CASE("a peer that had not reached its deadline while the waiter timed out is named") {
  // Rank 1 waited out its deadline receiving from rank 0; rank 0, stopped after posting its
  // sends and resumed before the abort, dumped on mpirun's SIGTERM while waiting in turn.
  json::Value stopped = rank_dump(0, 2, 3, false, {0, 1}, 1);
  json::Value waiter = rank_dump(1, 2, 3, false, {0, 1}, 0);
  waiter.set("reason", json::Value("rank 1 (world rank 1): recv(from 0) on group 'pp' did not "
                                   "complete within 4 s (--comm-timeout); Aborting the job."));
  stopped.set("reason", json::Value("signal 15 while waiting"));
  const flight::Report r = flight::merge_dumps({stopped, waiter});
  INFO(r.text);
  CHECK(r.suspects == std::vector<int>{0});
  CHECK(r.text.find("for world rank 0, which had not reached its own deadline") !=
        std::string::npos);
}
