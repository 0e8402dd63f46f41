// Tests for engine/data/masking: BERT's masked-LM rule. How many positions are chosen and how
// (statistically, with binomial tolerances), what the labels hold, special tokens, and that
// the rule is a pure function of (seed, window, epoch, position).
#include "engine/data/masking.h"

#include <catch2/catch.hpp>
#include <cmath>
#include <string>
#include <vector>

#include "base/error.h"

namespace mammoth::data {
namespace {

using Action = MaskingRule::Action;

MaskingOptions options(uint64_t seed = 7) {
  MaskingOptions o;
  o.seed = seed;
  o.vocab_size = 64;
  o.mask_token = 4;
  o.special_tokens = {0, 1, 2, 3};
  return o;
}

// Window w's tokens: ordinary ids in [5, 64), a different mix per window.
std::vector<int32_t> window_tokens(int64_t w, int64_t n) {
  std::vector<int32_t> t(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) t[static_cast<size_t>(i)] = 5 + (w * 13 + i * 7 + i / 5) % 59;
  return t;
}

// |observed - n p| within 5 standard deviations of Binomial(n, p): a false failure has
// probability below 1e-6 per check.
void check_binomial(int64_t observed, int64_t n, double p, const char* what) {
  const double mean = static_cast<double>(n) * p;
  const double sd = std::sqrt(static_cast<double>(n) * p * (1 - p));
  INFO(what << ": " << observed << " of " << n << ", expected " << mean << " +- 5 * " << sd);
  CHECK(std::abs(static_cast<double>(observed) - mean) <= 5 * sd);
}

TEST_CASE("the 15% / 80-10-10 rule, labels at the chosen positions") {
  const MaskingRule rule(options());
  const int64_t windows = 20000, n = 64;
  // round(0.15 * 64) = 10 positions of every window.
  int64_t chosen = 0, masked = 0, randomised = 0, kept = 0;
  std::vector<int64_t> per_position(n, 0), random_counts(64, 0);
  for (int64_t w = 0; w < windows; ++w) {
    const std::vector<int32_t> original = window_tokens(w, n);
    std::vector<int32_t> in = original, labels(n, 0);
    const std::vector<Action> what = rule.actions(static_cast<uint64_t>(w), 0, in.data(), n);
    const int64_t k = rule.apply(static_cast<uint64_t>(w), 0, in.data(), labels.data(), n);
    REQUIRE(k == 10);
    chosen += k;
    for (int64_t i = 0; i < n; ++i) {
      const size_t s = static_cast<size_t>(i);
      if (what[s] == Action::kNone) {
        REQUIRE(labels[s] == kIgnoreIndex);
        REQUIRE(in[s] == original[s]);
        continue;
      }
      ++per_position[s];
      REQUIRE(labels[s] == original[s]);  // the token at this position, not the next one
      switch (what[s]) {
        case Action::kMask:
          REQUIRE(in[s] == 4);
          ++masked;
          break;
        case Action::kRandom:
          REQUIRE(!rule.is_special(in[s]));
          ++random_counts[static_cast<size_t>(in[s])];
          ++randomised;
          break;
        case Action::kKeep:
          REQUIRE(in[s] == original[s]);
          ++kept;
          break;
        case Action::kNone:
          break;
      }
    }
  }
  REQUIRE(chosen == windows * 10);
  check_binomial(masked, chosen, 0.8, "[MASK]");
  check_binomial(randomised, chosen, 0.1, "random");
  check_binomial(kept, chosen, 0.1, "unchanged");
  // Every position is equally likely to be chosen: 10 / 64.
  for (int64_t i = 0; i < n; ++i) check_binomial(per_position[i], windows, 10.0 / 64, "position");
  // Random replacements are uniform over the 59 ordinary ids (chi-square, 58 degrees of
  // freedom: 100 has p < 0.001).
  double chi2 = 0;
  const double expect = static_cast<double>(randomised) / 59;
  for (int64_t id = 0; id < 64; ++id) {
    if (id < 5) {
      REQUIRE(random_counts[static_cast<size_t>(id)] == 0);
      continue;
    }
    const double d = static_cast<double>(random_counts[static_cast<size_t>(id)]) - expect;
    chi2 += d * d / expect;
  }
  CHECK(chi2 < 100);
}

TEST_CASE("special tokens are never chosen and do not count") {
  const MaskingRule rule(options());
  int64_t total = 0;
  for (int64_t w = 0; w < 2000; ++w) {
    std::vector<int32_t> in = window_tokens(w, 40);
    // Positions 0, 10, 20, 30 hold [CLS], [SEP], [PAD], [MASK]: 36 ordinary positions remain,
    // and round(0.15 * 40) = 6 of them are chosen (the whole window counts, as in BERT).
    in[0] = 2;
    in[10] = 3;
    in[20] = 0;
    in[30] = 4;
    const std::vector<int32_t> original = in;
    std::vector<int32_t> labels(40);
    const int64_t k = rule.apply(static_cast<uint64_t>(w), 0, in.data(), labels.data(), 40);
    REQUIRE(k == 6);
    for (int i : {0, 10, 20, 30}) {
      REQUIRE(labels[i] == kIgnoreIndex);
      REQUIRE(in[i] == original[i]);
    }
    total += k;
  }
  CHECK(total == 2000 * 6);
  // A window of special tokens only has nothing to predict; a short window still predicts one;
  // a window with fewer ordinary tokens than round(0.15 n) predicts them all.
  std::vector<int32_t> specials = {0, 1, 2, 3, 4}, labels(64);
  CHECK(rule.apply(3, 0, specials.data(), labels.data(), 5) == 0);
  for (int i = 0; i < 5; ++i) CHECK(labels[i] == kIgnoreIndex);
  std::vector<int32_t> two = {9, 10};
  CHECK(rule.apply(3, 0, two.data(), labels.data(), 2) == 1);
  std::vector<int32_t> few(64, 0);
  few[7] = 9;
  few[40] = 11;
  CHECK(rule.apply(3, 0, few.data(), labels.data(), 64) == 2);
  CHECK(labels[7] == 9);
  CHECK(labels[40] == 11);
}

TEST_CASE("the rule is a pure function of seed, window, epoch and position") {
  const MaskingRule a(options(7)), b(options(7)), other_seed(options(8));
  auto masked = [](const MaskingRule& r, int64_t w, int64_t n, uint64_t epoch = 0) {
    std::vector<int32_t> in = window_tokens(w, n), labels(static_cast<size_t>(n));
    r.apply(static_cast<uint64_t>(w), epoch, in.data(), labels.data(), n);
    in.insert(in.end(), labels.begin(), labels.end());
    return in;
  };
  // Any order of windows, any instance: the same result.
  for (int64_t w : {5, 0, 3, 5, 1000000007}) CHECK(masked(a, w, 64) == masked(b, w, 64));
  CHECK(masked(a, 1, 64) != masked(a, 2, 64));
  CHECK(masked(a, 1, 64) != masked(other_seed, 1, 64));
  // The same window in the same epoch is masked the same way every time; another epoch draws
  // new masks (dynamic masking), with the same number chosen.
  CHECK(masked(a, 11, 64, 3) == masked(b, 11, 64, 3));
  CHECK(masked(a, 11, 64, 0) != masked(a, 11, 64, 1));
  CHECK(masked(a, 11, 64, 1) != masked(a, 11, 64, 2));
  auto chosen = [](const std::vector<int32_t>& v) {
    int64_t c = 0;
    for (size_t i = v.size() / 2; i < v.size(); ++i) c += v[i] != kIgnoreIndex ? 1 : 0;
    return c;
  };
  CHECK(chosen(masked(a, 11, 64, 0)) == 10);
  CHECK(chosen(masked(a, 11, 64, 7)) == 10);
}

TEST_CASE("bad options and tokens are errors naming them") {
  MaskingOptions o = options();
  o.mask_token = -1;
  CHECK_THROWS_WITH(MaskingRule(o), Catch::Contains("mask token id -1"));
  o = options();
  o.mask_prob = 0;
  CHECK_THROWS_WITH(MaskingRule(o), Catch::Contains("--mask-prob"));
  o = options();
  o.special_tokens = {70};
  CHECK_THROWS_WITH(MaskingRule(o), Catch::Contains("special token id 70"));
  o = options();
  o.mask_fraction = 0.95;
  CHECK_THROWS_WITH(MaskingRule(o), Catch::Contains("sum to at most 1"));
  const MaskingRule rule(options());
  std::vector<int32_t> in = {5, 64, 6}, labels(3);
  CHECK_THROWS_WITH(rule.apply(9, 0, in.data(), labels.data(), 3),
                    Catch::Contains("token 64 at position 1 of window 9"));
}

}  // namespace
}  // namespace mammoth::data
