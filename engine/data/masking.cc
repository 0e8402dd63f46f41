#include "engine/data/masking.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "base/error.h"
#include "base/philox.h"
#include "engine/data/sampler.h"

namespace mammoth::data {
namespace {

// A probability as a threshold on a uniform 32-bit draw: P(draw < t) = t / 2^32.
uint64_t threshold_32(double p) { return static_cast<uint64_t>(std::llround(p * 4294967296.0)); }

}  // namespace

MaskingRule::MaskingRule(MaskingOptions options) : options_(std::move(options)) {
  const MaskingOptions& o = options_;
  MAMMOTH_CHECK(o.vocab_size >= 2)
      << "[MaskingRule] vocabulary size " << o.vocab_size << " is too small for masked-LM training";
  MAMMOTH_CHECK(o.mask_token >= 0 && o.mask_token < o.vocab_size)
      << "[MaskingRule] mask token id " << o.mask_token << " is outside the vocabulary [0, "
      << o.vocab_size << ") (--mask-token; the model defines no [MASK] token when it is -1)";
  MAMMOTH_CHECK(o.mask_prob > 0 && o.mask_prob <= 1)
      << "[MaskingRule] --mask-prob must be in (0, 1], got " << o.mask_prob;
  MAMMOTH_CHECK(o.mask_fraction >= 0 && o.random_fraction >= 0 &&
                o.mask_fraction + o.random_fraction <= 1)
      << "[MaskingRule] the [MASK] fraction " << o.mask_fraction << " and the random fraction "
      << o.random_fraction << " must be >= 0 and sum to at most 1";
  specials_ = o.special_tokens;
  specials_.push_back(o.mask_token);
  std::sort(specials_.begin(), specials_.end());
  specials_.erase(std::unique(specials_.begin(), specials_.end()), specials_.end());
  for (int64_t s : specials_) {
    MAMMOTH_CHECK(s >= 0 && s < o.vocab_size)
        << "[MaskingRule] special token id " << s << " is outside the vocabulary [0, "
        << o.vocab_size << ")";
  }
  MAMMOTH_CHECK(static_cast<int64_t>(specials_.size()) < o.vocab_size)
      << "[MaskingRule] every id of the vocabulary of " << o.vocab_size
      << " is a special token: no random replacement can be drawn";
  // Masking draws its own stream: a key unrelated to dropout's and initialisation's Philox
  // streams, which are keyed by the seed itself.
  uint64_t state = o.seed ^ 0x6D61736B65644C4Dull;  // "maskedLM"
  key_ = splitmix64(&state);
  mask_below_ = threshold_32(o.mask_fraction);
  random_below_ = threshold_32(o.mask_fraction + o.random_fraction);
}

bool MaskingRule::is_special(int64_t token) const {
  return std::binary_search(specials_.begin(), specials_.end(), token);
}

PhiloxOut MaskingRule::draw(uint64_t window, uint64_t epoch, int64_t position) const {
  return philox4x32((epoch << 32) | static_cast<uint64_t>(position), window, key_);
}

int32_t MaskingRule::random_token(uint64_t window, uint64_t epoch, int64_t position) const {
  const PhiloxOut r = draw(window, epoch, position);
  const uint64_t bits = (static_cast<uint64_t>(r.v[2]) << 32) | r.v[3];
  const uint64_t ordinary = static_cast<uint64_t>(options_.vocab_size) - specials_.size();
  // Multiply-shift onto [0, ordinary): the bias is below ordinary / 2^64.
  int64_t id = static_cast<int64_t>((static_cast<unsigned __int128>(bits) * ordinary) >> 64);
  // The id-th ordinary token: step over the special ids at or below it.
  for (int64_t s : specials_) {
    if (s > id) break;
    ++id;
  }
  return static_cast<int32_t>(id);
}

std::vector<MaskingRule::Action> MaskingRule::actions(uint64_t window, uint64_t epoch,
                                                      const int32_t* tokens, int64_t n) const {
  MAMMOTH_CHECK(n >= 0 && n < (int64_t{1} << 32) && epoch < (uint64_t{1} << 32))
      << "[MaskingRule] window of " << n << " tokens in epoch " << epoch
      << ": both must be below 2^32";
  std::vector<Action> out(static_cast<size_t>(n), Action::kNone);
  // (selection draw, position) of every position that may be chosen.
  std::vector<std::pair<uint32_t, int64_t>> candidates;
  candidates.reserve(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    MAMMOTH_CHECK(tokens[i] >= 0 && tokens[i] < options_.vocab_size)
        << "[MaskingRule] token " << tokens[i] << " at position " << i << " of window " << window
        << " is outside the model's vocabulary of " << options_.vocab_size;
    if (is_special(tokens[i])) continue;
    candidates.emplace_back(draw(window, epoch, i).v[0], i);
  }
  if (candidates.empty()) return out;
  const int64_t m = static_cast<int64_t>(candidates.size());
  const int64_t k = std::min(
      m, std::max<int64_t>(
             1, static_cast<int64_t>(std::llround(options_.mask_prob * static_cast<double>(n)))));
  std::nth_element(candidates.begin(), candidates.begin() + (k - 1), candidates.end());
  for (int64_t c = 0; c < k; ++c) {
    const int64_t i = candidates[static_cast<size_t>(c)].second;
    const uint32_t how = draw(window, epoch, i).v[1];
    out[static_cast<size_t>(i)] = how < mask_below_     ? Action::kMask
                                  : how < random_below_ ? Action::kRandom
                                                        : Action::kKeep;
  }
  return out;
}

int64_t MaskingRule::apply(uint64_t window, uint64_t epoch, int32_t* tokens, int32_t* labels,
                           int64_t n) const {
  const std::vector<Action> what = actions(window, epoch, tokens, n);
  int64_t chosen = 0;
  for (int64_t i = 0; i < n; ++i) {
    const Action a = what[static_cast<size_t>(i)];
    labels[i] = a == Action::kNone ? kIgnoreIndex : tokens[i];
    if (a == Action::kNone) continue;
    ++chosen;
    if (a == Action::kMask) tokens[i] = static_cast<int32_t>(options_.mask_token);
    if (a == Action::kRandom) tokens[i] = random_token(window, epoch, i);
  }
  return chosen;
}

}  // namespace mammoth::data
