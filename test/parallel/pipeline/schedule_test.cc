// Pipeline schedules: every generated schedule is complete and deadlock-free, 1F1B's simulated
// bubble equals (p - 1) / (m + p - 1), interleaved and zero-bubble have less, and the checker
// catches broken schedules.
#include "parallel/pipeline/schedule.h"

#include <catch2/catch.hpp>
#include <string>

#include "base/error.h"

using namespace mammoth::parallel::pipeline;

namespace {

constexpr ScheduleKind kKinds[] = {ScheduleKind::kGPipe, ScheduleKind::k1F1B,
                                   ScheduleKind::kInterleaved, ScheduleKind::kZeroBubble};

Schedule make(ScheduleKind k, int p, int m, int v = 2) {
  return make_schedule(
      k,
      {.stages = p, .micro_batches = m, .virtual_stages = k == ScheduleKind::kInterleaved ? v : 1});
}

}  // namespace

TEST_CASE("every schedule is complete and deadlock-free") {
  for (ScheduleKind k : kKinds) {
    for (int p : {1, 2, 3, 4}) {
      for (int m : {1, 2, 4, 8}) {
        for (int v : {2, 3}) {
          if (k != ScheduleKind::kInterleaved && v > 2) continue;
          INFO(schedule_kind_name(k) << " p " << p << " m " << m << " v " << v);
          const Schedule s = make(k, p, m, v);
          const CheckResult r = check_schedule(s);
          CHECK(r.ok);
          CHECK(r.error == "");
          CHECK(s.split_backward == (k == ScheduleKind::kZeroBubble));
          // Every rank is busy for exactly its share of the work.
          const int actions_per_mb = s.split_backward ? 3 : 2;
          for (const auto& list : s.ranks) {
            CHECK(list.size() == static_cast<size_t>(actions_per_mb * m * s.virtual_stages));
          }
          CHECK(r.busy == Approx(3.0 * m * p));
          CHECK(r.bubble >= 0.0);
          CHECK(r.bubble < 1.0);
        }
      }
    }
  }
}

TEST_CASE("1F1B and GPipe bubbles equal (p-1)/(m+p-1)") {
  for (ScheduleKind k : {ScheduleKind::kGPipe, ScheduleKind::k1F1B}) {
    for (int p : {2, 3, 4}) {
      for (int m : {1, 2, 4, 8}) {
        // Backward costing 1 (weight = 0) or 2 times the forward: the fraction is the same.
        for (double w : {0.0, 1.0}) {
          INFO(schedule_kind_name(k) << " p " << p << " m " << m << " weight cost " << w);
          const CheckResult r = check_schedule(make(k, p, m), {1.0, 1.0, w});
          REQUIRE(r.ok);
          CHECK(r.bubble == Approx(analytic_bubble_1f1b(p, m)).epsilon(1e-12));
          CHECK(r.makespan == Approx((2.0 + w) * (m + p - 1)));
        }
      }
    }
  }
}

TEST_CASE("1F1B holds at most p - r micro-batches, GPipe all m") {
  for (int p : {2, 3, 4}) {
    for (int m : {1, 2, 4, 8}) {
      const CheckResult one = check_schedule(make(ScheduleKind::k1F1B, p, m));
      const CheckResult gpipe = check_schedule(make(ScheduleKind::kGPipe, p, m));
      for (int r = 0; r < p; ++r) {
        CHECK(one.peak_in_flight[r] == std::min(p - r, m));
        CHECK(gpipe.peak_in_flight[r] == m);
      }
    }
  }
}

TEST_CASE("interleaved and zero-bubble schedules have smaller bubbles than 1F1B") {
  for (int p : {2, 3, 4}) {
    for (int m : {1, 2, 4, 8}) {
      const double one = check_schedule(make(ScheduleKind::k1F1B, p, m)).bubble;
      INFO("p " << p << " m " << m);
      // Zero bubble: the same work (B and W together cost 1F1B's backward).
      const CheckResult zb = check_schedule(make(ScheduleKind::kZeroBubble, p, m));
      REQUIRE(zb.ok);
      CHECK(zb.bubble < one);
      // ZB-H1 keeps 1F1B's activation memory.
      for (int r = 0; r < p; ++r) CHECK(zb.peak_in_flight[r] <= std::min(p - r, m));
      // Interleaved: with full groups of p micro-batches it reaches its analytic value.
      if (m % p == 0) {
        for (int v : {2, 3, 4}) {
          INFO("v " << v);
          const CheckResult il = check_schedule(make(ScheduleKind::kInterleaved, p, m, v));
          REQUIRE(il.ok);
          CHECK(il.bubble < one);
          CHECK(il.bubble == Approx(analytic_bubble_interleaved(p, m, v)).epsilon(1e-9));
        }
      }
    }
  }
}

TEST_CASE("the checker finds deadlocks and malformed schedules") {
  SECTION("a rank waits for a backward that waits for it") {
    // The last stage runs B1 before F1: B1 waits for F1, which is queued behind it.
    Schedule s = make(ScheduleKind::k1F1B, 2, 4);
    auto& last = s.ranks[1];  // F0 B0 F1 B1 ...
    REQUIRE(action_str(last[2], false) == "F1");
    std::swap(last[2], last[3]);
    const CheckResult r = check_schedule(s);
    CHECK_FALSE(r.ok);
    CHECK(r.deadlock);
    CHECK(r.error.find("rank 1 waits at B1") != std::string::npos);
  }
  SECTION("a cycle across ranks") {
    // Both ranks start with a backward: rank 0's B0 needs rank 1's B0, which needs F0 on rank 1,
    // which needs rank 0's F0, queued behind rank 0's B0.
    Schedule s = make(ScheduleKind::kGPipe, 2, 2);
    for (auto& list : s.ranks) std::rotate(list.begin(), list.begin() + 2, list.end());
    const CheckResult r = check_schedule(s);
    CHECK(r.deadlock);
    CHECK(r.error.find("rank 0") != std::string::npos);
  }
  SECTION("weight gradient before its backward") {
    Schedule s = make(ScheduleKind::kZeroBubble, 2, 2);
    auto& list = s.ranks[1];
    auto b = std::find(list.begin(), list.end(), Action{ActionType::kBackward, 0, 0});
    auto w = std::find(list.begin(), list.end(), Action{ActionType::kWeight, 0, 0});
    std::iter_swap(b, w);
    CHECK(check_schedule(s).deadlock);
  }
  SECTION("missing and duplicated actions") {
    Schedule s = make(ScheduleKind::k1F1B, 3, 4);
    s.ranks[2].pop_back();
    CheckResult r = check_schedule(s);
    CHECK_FALSE(r.ok);
    CHECK_FALSE(r.deadlock);
    CHECK(r.error.find("rank 2 runs B3.0 0 times") != std::string::npos);
    s = make(ScheduleKind::k1F1B, 3, 4);
    s.ranks[0].push_back(s.ranks[0].front());
    CHECK(check_schedule(s).error.find("2 times") != std::string::npos);
    s = make(ScheduleKind::k1F1B, 3, 4);
    s.ranks[0].push_back({ActionType::kWeight, 0, 0});
    CHECK(check_schedule(s).error.find("outside the schedule") != std::string::npos);
  }
}

TEST_CASE("schedule options and names") {
  CHECK(schedule_kind_from_name("zb") == ScheduleKind::kZeroBubble);
  CHECK(schedule_kind_from_name("interleaved") == ScheduleKind::kInterleaved);
  CHECK_THROWS_WITH(schedule_kind_from_name("2f2b"), Catch::Contains("2f2b"));
  CHECK_THROWS_WITH(
      make_schedule(ScheduleKind::k1F1B, {.stages = 2, .micro_batches = 2, .virtual_stages = 2}),
      Catch::Contains("virtual_stages"));
  CHECK_THROWS_WITH(make_schedule(ScheduleKind::kGPipe, {.stages = 0}), Catch::Contains("stages"));
}

TEST_CASE("timeline text and chrome trace") {
  const Schedule s = make(ScheduleKind::k1F1B, 2, 2);
  const CheckResult r = check_schedule(s, {1.0, 1.0, 0.0});
  const std::string text = timeline_text(s, r);
  // F=1, B=1: rank 0 runs F0 F1, then each backward as soon as rank 1 has sent its gradient.
  CHECK(text.find("rank 0  | F0 F1 .  B0 .  B1") != std::string::npos);
  CHECK(text.find("rank 1  | .  F0 B0 F1 B1") != std::string::npos);
  CHECK(text.find("bubble 0.3333") != std::string::npos);
  const std::string json = chrome_trace_json(s, r);
  CHECK(json.find("\"traceEvents\"") == 1);
  CHECK(json.find("{\"name\":\"F1\",\"cat\":\"forward\",\"ph\":\"X\",\"pid\":0,\"tid\":0,"
                  "\"ts\":1000,\"dur\":1000") != std::string::npos);
  // Every trace event of a rank: 2 m actions + its thread name.
  size_t events = 0;
  for (size_t at = json.find("\"ph\":"); at != std::string::npos; at = json.find("\"ph\":", at + 1))
    ++events;
  CHECK(events == 2 * (2 * 2 + 1));
  // An invalid schedule prints why.
  Schedule bad = s;
  bad.ranks[0].clear();
  CHECK(timeline_text(bad, check_schedule(bad)).find("INVALID") != std::string::npos);
}
