// BERT's masked-LM rule: which positions of a token window are predicted, and what the model
// sees there. One rule for `mammoth train` (engine/train/trainer.cc builds every masked-LM
// batch through it) and `mammoth eval` (BERT's masked-LM loss), so a figure from eval is the
// objective train minimised.
//
// For a window of n tokens, m of which are not special tokens:
//   - k = min(m, max(1, round(mask_prob * n))) of the m positions are chosen, as in Google's
//     create_pretraining_data.py (which counts the whole sequence, [CLS] and [SEP] included):
//     the k non-special positions whose Philox draw is smallest (ties: the lower position).
//     k depends on n only (unless the window is nearly all special tokens), so every
//     micro-batch of a step has the same number of predictions and the mean loss of a step
//     does not depend on how it is split over micro-batches and dp ranks;
//   - each chosen position independently becomes [MASK] with probability mask_fraction (0.8), a
//     token drawn uniformly from the non-special ids with probability random_fraction (0.1),
//     and stays unchanged otherwise (0.1);
//   - its label is the original token at that position; every other label is kIgnoreIndex.
// Every draw is Philox 4x32-10 keyed by the seed, at a counter of (window, epoch, position): a
// pure function of (seed, window index, epoch, position in the window). The rule therefore
// gives the same inputs and labels whatever the dp/tp/sp layout, micro-batching, batch order or
// resumed step, and no state needs checkpointing. Training masks dynamically (RoBERTa's choice):
// the epoch in which the sampler reads a window is part of the key, so each pass over the data
// sees new masks; static masks let a small model memorise (window, mask) pairs instead of
// learning from context. Evaluation (validation batches, `mammoth eval`) uses epoch 0: one
// fixed set of masks, comparable from run to run.
#pragma once

#include <cstdint>
#include <vector>

#include "base/philox.h"

namespace mammoth::data {

// The label of a position that carries no loss (PyTorch's and Hugging Face's -100).
inline constexpr int32_t kIgnoreIndex = -100;

struct MaskingOptions {
  uint64_t seed = 0;
  double mask_prob = 0.15;              // positions chosen per window, as a fraction of its length
  double mask_fraction = 0.8;           // of the chosen: replaced by mask_token
  double random_fraction = 0.1;         // of the chosen: replaced by a random non-special token
  int64_t mask_token = -1;              // [MASK]; required (>= 0)
  int64_t vocab_size = 0;               // tokens are in [0, vocab_size)
  std::vector<int64_t> special_tokens;  // never chosen, never drawn ([MASK] is always one)
};

class MaskingRule {
 public:
  // What happens at a position.
  enum class Action { kNone, kMask, kRandom, kKeep };

  // Throws naming the option when it is out of range (mask token outside the vocabulary,
  // probabilities outside [0, 1], fractions summing over 1, no ordinary token left).
  explicit MaskingRule(MaskingOptions options);

  const MaskingOptions& options() const { return options_; }
  bool is_special(int64_t token) const;

  // Masks window `window`, as read in `epoch`, in place: tokens[0, n) become the model's input,
  // labels[0, n) the targets (the original token at chosen positions, kIgnoreIndex elsewhere).
  // Returns the number of chosen positions. Throws naming the window and position for a token
  // outside [0, vocab_size).
  int64_t apply(uint64_t window, uint64_t epoch, int32_t* tokens, int32_t* labels, int64_t n) const;

  // The actions apply() takes on a window of these tokens (for tests and tools).
  std::vector<Action> actions(uint64_t window, uint64_t epoch, const int32_t* tokens,
                              int64_t n) const;

 private:
  // The four 32-bit draws at (window, epoch, position): lane 0 ranks the position for
  // choosing, lane 1 picks the action, lanes 2-3 the random replacement.
  PhiloxOut draw(uint64_t window, uint64_t epoch, int64_t position) const;
  // The random replacement at (window, epoch, position): a non-special id, uniform.
  int32_t random_token(uint64_t window, uint64_t epoch, int64_t position) const;

  MaskingOptions options_;
  uint64_t key_;                   // Philox key derived from the seed
  uint32_t mask_below_;            // lane 1 below this: [MASK]
  uint32_t random_below_;          // lane 1 in [mask_below_, random_below_): random token
  std::vector<int64_t> specials_;  // sorted, unique, with mask_token
};

}  // namespace mammoth::data
