// Sequence parallelism: how a sequence is laid out over a group, DeepSpeed-Ulysses attention
// (all-to-all between the sequence and head dims) and ring attention (K/V blocks passed
// around the ring, partial results merged by their log-sum-exp).
//
// Megatron's split_gather mode needs no attention of its own: its LayerNorm/dropout regions
// are sharded along the sequence and the tp layers all-gather / reduce-scatter at their edges
// (ColumnParallelLinear / RowParallelLinear with sequence_parallel in
// parallel/tensor_parallel/layers.h).
//
// Lengths that do not divide are padded at the end: a SequenceLayout of `length` tokens over
// p ranks has `padded` >= length positions; positions >= length are keys nobody attends to
// and queries whose outputs are dropped.
#pragma once

#include <cstdint>
#include <vector>

#include "engine/ops.h"
#include "engine/tensor.h"
#include "parallel/comm/communicator.h"

namespace mammoth::parallel {

enum class SeqSplit {
  // Rank r holds positions [r*n, (r+1)*n): split_gather and Ulysses.
  kContiguous,
  // The sequence is cut into 2p chunks and rank r holds chunks r and 2p-1-r: under a causal
  // mask every rank then has the same amount of attention work (ring attention's load
  // balancing: an early chunk, which sees few keys, paired with a late one, which sees many).
  kZigzag,
};

class SequenceLayout {
 public:
  SequenceLayout(int64_t length, int parts, SeqSplit split);
  int64_t length() const { return length_; }
  int64_t padded() const { return padded_; }
  int parts() const { return parts_; }
  SeqSplit split() const { return split_; }
  int64_t chunk_size() const { return chunk_; }
  int64_t local_length() const { return padded_ / parts_; }
  // Chunk indices held by `rank`, in local order; chunk c covers [c*chunk, (c+1)*chunk).
  std::vector<int64_t> chunks(int rank) const;
  // Global positions held by `rank`, in local order (values >= length() are padding).
  std::vector<int64_t> positions(int rank) const;

 private:
  int64_t length_, padded_, chunk_;
  int parts_;
  SeqSplit split_;
};

// Rank `rank`'s part of x along `dim` (padded with zeros to layout.padded()); differentiable.
engine::Tensor shard_sequence(const engine::Tensor& x, int64_t dim, const SequenceLayout& layout,
                              int rank);
// The inverse: gathers every rank's part along `dim` (differentiable, all-gather forward /
// slice backward) and returns the unpadded full sequence in global order.
engine::Tensor gather_sequence(const engine::Tensor& x, int64_t dim, const SequenceLayout& layout,
                               Communicator& group);

// Both attentions take an optional padding mask, `key_mask`: bool [B, layout.padded()] over
// global positions (the whole sequence, the same on every rank), true = attend to that key;
// the layout's own padding is hidden whatever it says. An encoder's batch of sequences of
// different lengths passes its attention mask this way.
//
// Ulysses: q [B, H, T/p, D], k and v [B, Hk, T/p, D] sharded along the sequence (contiguous
// layout) -> all-to-all to [B, H/p, T, D] (heads sharded), full attention, all-to-all back.
// H must divide by p; kv heads that do not divide are replicated to H first (GQA).
engine::Tensor ulysses_attention(const engine::Tensor& q, const engine::Tensor& k,
                                 const engine::Tensor& v, Communicator& group,
                                 const SequenceLayout& layout, bool causal, double scale = 0.0,
                                 int64_t window = 0,
                                 const engine::Tensor& key_mask = engine::Tensor());

// Ring attention: q, k, v [B, H(k), T_local, D] in `layout` (zigzag or contiguous). Each of
// p steps attends to the K/V block currently held and passes it to the next rank
// (ring_shift); block results (o, lse) are merged with the online-softmax rule
//   lse = log(e^lse1 + e^lse2),  o = o1 e^(lse1 - lse) + o2 e^(lse2 - lse).
// Chunk pairs wholly in the causal future (or, with a sliding window, wholly slid out of it)
// are skipped. `window` > 0 (causal only): query position i sees keys (i - window, i], as
// engine::AttentionOptions::window. Equal to full attention over the
// sequence; backward flows through the same ring in reverse.
engine::Tensor ring_attention(const engine::Tensor& q, const engine::Tensor& k,
                              const engine::Tensor& v, Communicator& group,
                              const SequenceLayout& layout, bool causal, double scale = 0.0,
                              int64_t window = 0,
                              const engine::Tensor& key_mask = engine::Tensor());

}  // namespace mammoth::parallel
