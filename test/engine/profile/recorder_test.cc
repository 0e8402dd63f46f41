// The recorder (engine/profile/profile.h): nothing is kept while off; events from several
// threads; a full buffer drops and counts; long args are cut at a whole member; the Chrome trace
// and the merge parse; the summary's exposed communication and op classes; the memory tracer's
// peak and tags.
#include <catch2/catch.hpp>
#include <string>
#include <thread>

#include "base/json.h"
#include "engine/profile/profile.h"

using namespace mammoth;
using profile::Lane;

TEST_CASE("off records nothing; on keeps every thread's events") {
  profile::start(64);
  profile::stop();
  profile::complete(Lane::kCompute, "ignored", 0, 10);
  profile::counter("ignored", 1);
  { profile::Scope s(Lane::kCompute, "ignored"); }
  CHECK(profile::events().empty());

  profile::start(64);
  { profile::Scope s(Lane::kCompute, "main"); }
  std::thread([] { profile::complete(Lane::kComm, "worker", 5, 9, "\"bytes\":4"); }).join();
  profile::stop();
  const std::vector<profile::Event> evs = profile::events();
  REQUIRE(evs.size() == 2);
  int main = 0, worker = 0;
  for (const profile::Event& e : evs) {
    main += std::string(e.name) == "main";
    worker += std::string(e.name) == "worker" && e.dur_ns == 4 && e.lane == Lane::kComm;
  }
  CHECK((main == 1 && worker == 1));
}

TEST_CASE("a full buffer drops and counts; long args keep whole members") {
  profile::start(3);
  for (int i = 0; i < 5; ++i) profile::complete(Lane::kCompute, "op", i, i + 1);
  profile::stop();
  int64_t dropped = 0;
  CHECK(profile::events(&dropped).size() == 3);
  CHECK(dropped == 2);

  profile::start(4);
  std::string args =
      "\"a\":\"" + std::string(100, 'x') + "\",\"b\":\"" + std::string(100, 'y') + "\"";
  profile::complete(Lane::kIo, "long", 0, 1, args.c_str());
  profile::stop();
  const std::vector<profile::Event> evs = profile::events();
  REQUIRE(evs.size() == 1);
  CHECK(std::string(evs[0].args) == "\"a\":\"" + std::string(100, 'x') + "\"");
  const json::Value t = json::parse(profile::chrome_trace(evs, 3, 0, 0));
  bool found = false;
  for (const json::Value& e : t.at("traceEvents"))
    if (e.at("ph").as_string() == "X") {
      found = true;
      CHECK(e.at("pid").as_int() == 3);
      CHECK(e.at("cat").as_string() == "io");
      CHECK(e.at("args").at("a").as_string().size() == 100);
    }
  CHECK(found);
  const json::Value merged = json::parse(profile::merge_traces(
      {profile::chrome_trace(evs, 0, 0, 1), profile::chrome_trace(evs, 1, 0, 2)}));
  CHECK(merged.at("otherData").at("dropped_events").as_int() == 3);
}

TEST_CASE("exposed communication is what no compute event covers") {
  profile::start(16);
  profile::complete(Lane::kCompute, "step", 0, 100);  // encloses all: never counts as compute
  profile::complete(Lane::kCompute, "matmul", 0, 40);
  profile::complete(Lane::kCompute, "add", 30, 50);
  profile::complete(Lane::kComm, "all_reduce", 45, 70);  // 5 ns under compute, 20 exposed
  profile::stop();
  const profile::Summary s = profile::summarize(profile::events());
  CHECK(s.steps == 1);
  CHECK(s.compute_ns == 50);
  CHECK(s.comm_ns == 25);
  CHECK(s.exposed_comm_ns == 20);
  REQUIRE(s.top_ops.size() == 2);
  CHECK(s.top_ops[0].name == "matmul");
}

TEST_CASE("the summary's op classes, their FLOPs and bytes, and the time outside ops") {
  profile::start(16);
  profile::complete(Lane::kCompute, "step", 0, 1000);
  profile::complete(Lane::kCompute, "matmul", 0, 100, "\"bytes\":400,\"flops\":2000");
  profile::complete(Lane::kCompute, "matmul", 100, 300,
                    "\"bytes\":800,\"flops\":6000,\"backward\":true");
  profile::complete(Lane::kCompute, "gelu_tanh_backward", 300, 350, "\"bytes\":1200");
  profile::complete(Lane::kCompute, "layer_norm", 350, 380, "\"bytes\":100");
  profile::complete(Lane::kCompute, "optimizer", 900, 1000, "\"bytes\":3000");
  profile::complete(Lane::kComm, "all_reduce", 350, 500);  // covers 120 ns no op does
  profile::stop();
  const profile::Summary s = profile::summarize(profile::events());
  REQUIRE(s.classes.size() == 5);
  CHECK(s.classes[0].name == "gemm backward");  // longest first
  CHECK(s.classes[0].flops == 6000);
  CHECK(s.classes[0].bytes == 800);
  CHECK(s.classes[1].name == "gemm forward");
  CHECK(s.classes[1].total_ns == 100);
  CHECK(s.classes[2].name == "optimizer");
  CHECK(s.classes[3].name == "activations");
  CHECK(s.classes[4].name == "norms");
  // 1000 ns of step; events cover [0, 500) and [900, 1000).
  CHECK(s.outside_ops_ns == 400);
  CHECK(s.exposed_comm_ns == 120);
  // The bound is the slower of compute and memory; a missing peak leaves its term out.
  CHECK(s.classes[1].bound_s(1e12, 1e10) == Approx(4e-8));  // 400 B at 10 GB/s > 2 ns
  CHECK(s.classes[0].bound_s(1e9, 1e12) == Approx(6e-6));   // 6000 FLOP at 1 GFLOP/s
  CHECK(s.classes[0].bound_s(0, 1e12) == Approx(8e-10));
  CHECK(s.classes[0].bound_s(0, 0) == 0);
  CHECK(std::string(profile::op_class("attention_backward", true)) == "attention");
  CHECK(std::string(profile::op_class("cross_entropy", false)) == "softmax / cross-entropy");
  CHECK(std::string(profile::op_class("sum_sq_last", false)) == "reductions");
  CHECK(std::string(profile::op_class("index_select", false)) == "embedding / indexing");
  CHECK(std::string(profile::op_class("add", true)) == "elementwise / copies");
}

TEST_CASE("the memory tracer's peak and its split by tag") {
  profile::start(64);
  profile::memory_begin(1000);  // live before the session
  int a = 0, b = 0, c = 0;
  profile::note_alloc(&b, 200);  // temporaries by default
  profile::retag(&b, profile::MemTag::kGradients);
  {
    profile::MemTagScope tag(profile::MemTag::kActivations);
    profile::note_alloc(&a, 300);
  }
  profile::note_free(&c, 100);  // a baseline block
  profile::note_free(&a, 300);
  profile::stop();
  const profile::MemoryPeak p = profile::memory_peak();
  CHECK(p.peak == 1500);
  CHECK(p.baseline_at_peak == 1000);
  CHECK(p.by_tag[static_cast<int>(profile::MemTag::kActivations)] == 300);
  CHECK(p.by_tag[static_cast<int>(profile::MemTag::kGradients)] == 200);
  CHECK(p.by_tag[static_cast<int>(profile::MemTag::kTemporaries)] == 0);
}

TEST_CASE("the merge splits a collective into waiting for the last member and transfer") {
  // Rank 0 posts an all_reduce at 10 us, rank 1 at 30 us; both complete at 50 us. A second
  // all_reduce only rank 0 recorded, and a send, are left as they are.
  auto ev = [](const char* name, int64_t begin_us, int64_t end_us, const std::string& args) {
    profile::Event e;
    e.ts_ns = begin_us * 1000;
    e.dur_ns = (end_us - begin_us) * 1000;
    e.lane = Lane::kComm;
    std::snprintf(e.name, sizeof(e.name), "%s", name);
    std::snprintf(e.args, sizeof(e.args), "%s", args.c_str());
    return e;
  };
  const std::string group = "\"group\":\"dp\",\"group_first\":0,\"group_size\":2,";
  const std::vector<profile::Event> r0 = {ev("all_reduce", 10, 50, group + "\"seq\":0,\"peer\":-1"),
                                          ev("all_reduce", 60, 70, group + "\"seq\":1,\"peer\":-1"),
                                          ev("send", 80, 90, group + "\"seq\":0,\"peer\":1")};
  const std::vector<profile::Event> r1 = {ev("all_reduce", 30, 50, group + "\"seq\":0,\"peer\":-1"),
                                          ev("recv", 80, 95, group + "\"seq\":0,\"peer\":0")};
  profile::CollectiveSplit split;
  const json::Value merged = json::parse(profile::merge_traces(
      {profile::chrome_trace(r0, 0, 0, 0), profile::chrome_trace(r1, 1, 0, 0)}, &split));
  CHECK(split.matched == 1);
  CHECK(split.unmatched == 1);
  REQUIRE(split.wait_ns.size() == 2);
  CHECK(split.wait_ns[0] == 20000);
  CHECK(split.transfer_ns[0] == 20000);
  CHECK(split.wait_ns[1] == 0);
  CHECK(split.transfer_ns[1] == 20000);
  int with_split = 0;
  for (const json::Value& e : merged.at("traceEvents")) {
    const json::Value* args = e.find("args");
    if (!args || !args->find("wait_us")) continue;
    ++with_split;
    CHECK(e.at("name").as_string() == "all_reduce");
    CHECK(args->at("seq").as_int() == 0);
    const double wait = args->at("wait_us").as_double(),
                 transfer = args->at("transfer_us").as_double();
    CHECK(wait + transfer == Approx(e.at("dur").as_double()));
    CHECK(wait == Approx(e.at("pid").as_int() == 0 ? 20.0 : 0.0));
  }
  CHECK(with_split == 2);
}
