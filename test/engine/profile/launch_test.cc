// Kernel events carry the FLOPs the kernel does: attention counts only the query-key pairs its
// causal mask and sliding window let through, counted here by brute force from the rule as
// kernels/params.h states it in words, forward and backward.
#include <catch2/catch.hpp>
#include <string>

#include "base/json.h"
#include "engine/ops.h"
#include "engine/profile/profile.h"
#include "engine/tensor.h"

using namespace mammoth;
using namespace mammoth::engine;

namespace {

// Pairs (i, j) with key j at or before query i's position (i + Tk - Tq) and, with a window,
// among the `window` keys ending there.
double pairs_by_hand(int64_t tq, int64_t tk, bool causal, int64_t window) {
  double n = 0;
  for (int64_t i = 0; i < tq; ++i)
    for (int64_t j = 0; j < tk; ++j) {
      const int64_t pos = i + (tk - tq);
      if (causal && j > pos) continue;
      if (window > 0 && j <= pos - window) continue;
      n += 1;
    }
  return n;
}

double event_flops(const char* name) {
  double flops = -1;
  int seen = 0;
  for (const profile::Event& e : profile::events()) {
    if (std::string(e.name) != name) continue;
    ++seen;
    const json::Value args = json::parse("{" + std::string(e.args) + "}");
    flops = args.at("flops").as_double();
  }
  REQUIRE(seen == 1);
  return flops;
}

}  // namespace

TEST_CASE("attention events count the visible query-key pairs") {
  struct Case {
    int64_t tq, tk;
    bool causal;
    int64_t window;
  };
  // Square, cached decoding (Tq < Tk), a window shorter than the queries, and one longer.
  for (const Case c : {Case{7, 7, false, 0}, Case{7, 7, true, 0}, Case{3, 10, true, 0},
                       Case{9, 9, true, 4}, Case{4, 11, true, 3}, Case{5, 5, true, 20}}) {
    CAPTURE(c.tq, c.tk, c.causal, c.window);
    const int64_t B = 2, H = 3, D = 8;
    Tensor q = Tensor::randn({B, H, c.tq, D}, 1).requires_grad_();
    Tensor k = Tensor::randn({B, H, c.tk, D}, 2).requires_grad_();
    Tensor v = Tensor::randn({B, H, c.tk, D}, 3).requires_grad_();
    profile::start(1024);
    Tensor out = attention(q, k, v, {.causal = c.causal, .window = c.window});
    sum(out).backward();
    profile::stop();
    const double pairs = pairs_by_hand(c.tq, c.tk, c.causal, c.window);
    REQUIRE(pairs > 0);
    // Two D-long products per pair forward (Q K^T, P V), five backward, 2 D FLOPs each.
    CHECK(event_flops("attention") == 2 * 2.0 * D * B * H * pairs);
    CHECK(event_flops("attention_backward") == 5 * 2.0 * D * B * H * pairs);
  }
}
