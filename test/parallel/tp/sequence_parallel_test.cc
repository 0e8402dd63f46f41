// Ulysses and ring attention against full single-process attention, forward and backward, for
// causal and non-causal masks and sequence lengths that do not divide by ring size x chunks
// (padding), with MHA and GQA heads and sliding windows. Every rank computes the reference on
// the whole sequence.
#include "parallel/sequence_parallel/sequence_parallel.h"

#include <catch2/catch.hpp>
#include <cmath>

#include "engine/autograd.h"
#include "engine/ops.h"
#include "parallel/comm/mpi_communicator.h"

using namespace mammoth;
using engine::Tensor;

namespace {

parallel::Communicator& world() {
  static std::shared_ptr<parallel::MpiCommunicator> w = parallel::mpi_world({.timeout_s = 60});
  return *w;
}

struct Qkv {
  Tensor q, k, v, g;  // g: the upstream gradient of the output
};

Qkv make(int64_t B, int64_t H, int64_t Hk, int64_t T, int64_t D) {
  return {Tensor::randn({B, H, T, D}, 11, 0, 1, DType::kF64),
          Tensor::randn({B, Hk, T, D}, 12, 0, 1, DType::kF64),
          Tensor::randn({B, Hk, T, D}, 13, 0, 1, DType::kF64),
          Tensor::randn({B, H, T, D}, 14, 0, 1, DType::kF64)};
}

// Attention from matmul/softmax (the engine's fused attention is the forward reference too,
// but its backward is only accurate to ~1e-7 in f64, too loose to see a wrong merge).
Tensor plain_attention(const Tensor& q, const Tensor& k, const Tensor& v, bool causal,
                       int64_t window = 0, const Tensor& hidden_keys = Tensor()) {
  const int64_t H = q.size(1), Hk = k.size(1), T = q.size(2), D = q.size(3), B = q.size(0);
  Tensor kk = k.unsqueeze(2).expand({B, Hk, H / Hk, T, D}).reshape({B, H, T, D});
  Tensor vv = v.unsqueeze(2).expand({B, Hk, H / Hk, T, D}).reshape({B, H, T, D});
  Tensor s = engine::matmul(q, kk.transpose(2, 3)) * (1.0 / std::sqrt(double(D)));
  if (causal) {
    std::vector<double> future(static_cast<size_t>(T * T));
    for (int64_t i = 0; i < T; ++i)
      for (int64_t j = 0; j < T; ++j)
        future[i * T + j] = j > i || (window > 0 && j <= i - window) ? 1.0 : 0.0;
    s = engine::masked_fill(s, Tensor::from_vector(future, {T, T}, DType::kBool), -1e30);
  }
  if (hidden_keys.defined()) s = engine::masked_fill(s, hidden_keys.reshape({B, 1, 1, T}), -1e30);
  return engine::matmul(engine::softmax(s, -1), vv);
}

double diff(const Tensor& a, const Tensor& b) {
  REQUIRE(a.shape() == b.shape());
  return engine::max_abs(engine::sub(a.detach(), b.detach()));
}

using AttnFn = Tensor (*)(const Tensor&, const Tensor&, const Tensor&, parallel::Communicator&,
                          const parallel::SequenceLayout&, bool, double, int64_t, const Tensor&);

// fused_reference: compare with engine::attention (what Ulysses runs per head group) instead
// of the matmul/softmax composition. padding_mask: each sequence of the batch of 2 ends early
// (at T - 1 and T / 2) and hides one more key in its middle, given as the key mask.
void check(AttnFn fn, parallel::SeqSplit split, int64_t H, int64_t Hk, int64_t T, bool causal,
           bool fused_reference = false, int64_t window = 0, bool padding_mask = false) {
  auto& w = world();
  const int r = w.rank();
  CAPTURE(H, Hk, T, causal, window, padding_mask, w.size());
  const Qkv d = make(2, H, Hk, T, 4);
  parallel::SequenceLayout layout(T, w.size(), split);
  Tensor hidden, kept, key_mask;  // [2, T] true = hidden, the same true = attend; [2, padded]
  if (padding_mask) {
    std::vector<double> h(static_cast<size_t>(2 * T), 0.0), keep(2 * layout.padded(), 0.0);
    for (int64_t b = 0; b < 2; ++b) {
      const int64_t end = b == 0 ? T - 1 : T / 2;
      for (int64_t t = 0; t < T; ++t) {
        const bool hide = t >= end || t == end / 2;
        h[b * T + t] = hide ? 1.0 : 0.0;
        keep[b * layout.padded() + t] = hide ? 0.0 : 1.0;
      }
    }
    hidden = Tensor::from_vector(h, {2, T}, DType::kBool);
    for (double& x : h) x = 1.0 - x;
    kept = Tensor::from_vector(h, {2, T}, DType::kBool);
    key_mask = Tensor::from_vector(keep, {2, layout.padded()}, DType::kBool);
  }
  // Reference: the whole sequence in one process.
  Tensor q = d.q.clone().requires_grad_(), k = d.k.clone().requires_grad_(),
         v = d.v.clone().requires_grad_();
  engine::AttentionOptions opt;
  opt.causal = causal;
  opt.window = window;
  opt.key_mask = kept;
  REQUIRE(diff(plain_attention(d.q, d.k, d.v, causal, window, hidden),
               engine::attention(d.q, d.k, d.v, opt)) < 1e-10);
  Tensor ref = fused_reference ? engine::attention(q, k, v, opt)
                               : plain_attention(q, k, v, causal, window, hidden);
  engine::sum(ref * d.g).backward();
  // Sharded: each rank takes its positions (zero padding beyond T).
  Tensor ql = parallel::shard_sequence(d.q, 2, layout, r).contiguous().requires_grad_();
  Tensor kl = parallel::shard_sequence(d.k, 2, layout, r).contiguous().requires_grad_();
  Tensor vl = parallel::shard_sequence(d.v, 2, layout, r).contiguous().requires_grad_();
  Tensor gl = parallel::shard_sequence(d.g, 2, layout, r);
  Tensor out = fn(ql, kl, vl, w, layout, causal, 0.0, window, key_mask);
  engine::sum(out * gl).backward();
  // Outputs at real positions match; gathering them gives the whole reference.
  REQUIRE(diff(parallel::gather_sequence(out, 2, layout, w), ref) < 1e-10);
  REQUIRE(diff(ql.grad(), parallel::shard_sequence(q.grad(), 2, layout, r)) < 1e-10);
  REQUIRE(diff(kl.grad(), parallel::shard_sequence(k.grad(), 2, layout, r)) < 1e-10);
  REQUIRE(diff(vl.grad(), parallel::shard_sequence(v.grad(), 2, layout, r)) < 1e-10);
}

}  // namespace

TEST_CASE("SequenceLayout: zigzag pairs chunk r with chunk 2p-1-r and pads the tail") {
  parallel::SequenceLayout z(13, 2, parallel::SeqSplit::kZigzag);
  REQUIRE(z.padded() == 16);
  REQUIRE(z.chunk_size() == 4);
  REQUIRE(z.positions(0) == std::vector<int64_t>{0, 1, 2, 3, 12, 13, 14, 15});
  REQUIRE(z.positions(1) == std::vector<int64_t>{4, 5, 6, 7, 8, 9, 10, 11});
  parallel::SequenceLayout c(13, 4, parallel::SeqSplit::kContiguous);
  REQUIRE(c.padded() == 16);
  REQUIRE(c.positions(3) == std::vector<int64_t>{12, 13, 14, 15});
}

TEST_CASE("ring attention equals full attention (zigzag and contiguous, padded lengths)") {
  for (bool causal : {true, false}) {
    for (int64_t T : {13, 16, 7}) {
      check(parallel::ring_attention, parallel::SeqSplit::kZigzag, 4, 4, T, causal);
      check(parallel::ring_attention, parallel::SeqSplit::kZigzag, 4, 2, T, causal);  // GQA
      check(parallel::ring_attention, parallel::SeqSplit::kContiguous, 4, 4, T, causal);
    }
  }
}

// Mistral's sliding window: key chunks wholly slid out are skipped, the others masked by
// global position.
TEST_CASE("ring and Ulysses attention with a sliding window equal full windowed attention") {
  const int p = world().size();
  for (int64_t T : {13, 16}) {
    for (int64_t window : {1, 3}) {
      check(parallel::ring_attention, parallel::SeqSplit::kZigzag, 4, 2, T, true, false, window);
      check(parallel::ring_attention, parallel::SeqSplit::kContiguous, 4, 4, T, true, false,
            window);
      if (4 % p == 0)
        check(parallel::ulysses_attention, parallel::SeqSplit::kContiguous, 4, 1, T, true, true,
              window);
    }
  }
}

TEST_CASE("Ulysses attention equals full attention") {
  const int p = world().size();
  if (4 % p != 0) return;  // heads must divide by the group size
  for (bool causal : {true, false}) {
    for (int64_t T : {13, 16}) {
      check(parallel::ulysses_attention, parallel::SeqSplit::kContiguous, 4, 4, T, causal, true);
      check(parallel::ulysses_attention, parallel::SeqSplit::kContiguous, 4, 1, T, causal,
            true);  // GQA
    }
  }
}

TEST_CASE("ring and Ulysses attention with a padding mask equal full masked attention") {
  // Lengths that divide and that pad; bidirectional (an encoder's batch) and causal.
  for (int64_t T : {8, 13}) {
    for (bool causal : {false, true}) {
      check(parallel::ring_attention, parallel::SeqSplit::kZigzag, 4, 2, T, causal, false, 0, true);
      check(parallel::ring_attention, parallel::SeqSplit::kContiguous, 4, 4, T, causal, false, 0,
            true);
      if (4 % world().size() == 0) {
        check(parallel::ulysses_attention, parallel::SeqSplit::kContiguous, 4, 4, T, causal, true,
              0, true);
      }
    }
  }
}

TEST_CASE("Ulysses rejects heads that do not divide") {
  auto& w = world();
  if (w.size() < 2) return;
  parallel::SequenceLayout layout(8, w.size(), parallel::SeqSplit::kContiguous);
  Tensor q = Tensor::zeros({1, 2 * w.size() + 1, layout.local_length(), 4}, DType::kF64);
  REQUIRE_THROWS_WITH(parallel::ulysses_attention(q, q, q, w, layout, true),
                      Catch::Contains("do not divide by sp size"));
}
