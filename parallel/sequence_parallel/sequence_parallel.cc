#include "parallel/sequence_parallel/sequence_parallel.h"

#include <cmath>

#include "engine/autograd.h"
#include "parallel/tensor_parallel/mappings.h"

namespace mammoth::parallel {

using engine::Tensor;

SequenceLayout::SequenceLayout(int64_t length, int parts, SeqSplit split)
    : length_(length), parts_(parts), split_(split) {
  MAMMOTH_CHECK(length > 0 && parts > 0)
      << "[SequenceLayout] length " << length << " and parts " << parts << " must be positive";
  const int64_t nchunks = split == SeqSplit::kZigzag ? 2 * parts : parts;
  chunk_ = (length + nchunks - 1) / nchunks;
  padded_ = chunk_ * nchunks;
}

std::vector<int64_t> SequenceLayout::chunks(int rank) const {
  if (split_ == SeqSplit::kZigzag) return {rank, 2 * parts_ - 1 - rank};
  return {rank};
}

std::vector<int64_t> SequenceLayout::positions(int rank) const {
  std::vector<int64_t> pos;
  for (int64_t c : chunks(rank)) {
    for (int64_t i = 0; i < chunk_; ++i) pos.push_back(c * chunk_ + i);
  }
  return pos;
}

Tensor shard_sequence(const Tensor& x, int64_t dim, const SequenceLayout& layout, int rank) {
  dim = engine::normalize_dim(dim, x.dim(), "shard_sequence");
  MAMMOTH_CHECK(x.size(dim) == layout.length())
      << "[shard_sequence] dim " << dim << " of " << engine::shape_str(x.shape())
      << " is not the layout's length " << layout.length();
  Tensor xp = x;
  if (layout.padded() > layout.length()) {
    engine::Shape pad = x.shape();
    pad[dim] = layout.padded() - layout.length();
    xp = engine::concat({x, Tensor::zeros(pad, x.dtype(), x.device())}, dim);
  }
  if (layout.split() == SeqSplit::kContiguous) {
    const int64_t n = layout.local_length();
    return xp.slice(dim, rank * n, (rank + 1) * n);
  }
  std::vector<int64_t> pos = layout.positions(rank);
  return engine::index_select(xp, dim, Tensor::from_ints(pos, {static_cast<int64_t>(pos.size())}));
}

Tensor gather_sequence(const Tensor& x, int64_t dim, const SequenceLayout& layout,
                       Communicator& group) {
  dim = engine::normalize_dim(dim, x.dim(), "gather_sequence");
  Tensor all = gather_from_group(x, group, dim);  // rank-major local orders
  if (layout.split() == SeqSplit::kZigzag) {
    // Global position -> index in the rank-major concatenation.
    std::vector<int64_t> where(static_cast<size_t>(layout.padded()));
    int64_t at = 0;
    for (int r = 0; r < layout.parts(); ++r) {
      for (int64_t p : layout.positions(r)) where[p] = at++;
    }
    all = engine::index_select(all, dim, Tensor::from_ints(where, {layout.padded()}));
  }
  return all.slice(dim, 0, layout.length());
}

namespace {

// Repeats each of Hk key/value heads H/Hk times: [B, Hk, T, D] -> [B, H, T, D].
Tensor repeat_kv(const Tensor& k, int64_t heads) {
  const int64_t B = k.size(0), Hk = k.size(1), T = k.size(2), D = k.size(3);
  if (Hk == heads) return k;
  MAMMOTH_CHECK(heads % Hk == 0) << "[repeat_kv] query heads " << heads
                                 << " are not a multiple of key heads " << Hk;
  return k.unsqueeze(2).expand({B, Hk, heads / Hk, T, D}).reshape({B, heads, T, D});
}

struct Partial {
  Tensor o;    // [B, H, tq, D]
  Tensor lse;  // [B, H, tq, 1]
};

// Softmax attention of q against one K/V block with an optional mask (true = hidden).
Partial attend_block(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& mask,
                     double scale) {
  Tensor s = engine::matmul(q, k.transpose(2, 3)) * scale;  // [B, H, tq, tk]
  if (mask.defined()) s = engine::masked_fill(s, mask, -1e30);
  Tensor m;
  {
    engine::NoGradGuard ng;  // the shift cancels out of o and lse
    m = engine::max(s.detach(), -1, true);
  }
  Tensor e = engine::exp(s - m);
  Tensor l = engine::sum(e, {-1}, true);
  return {engine::matmul(e, v) / l, engine::log(l) + m};
}

// key_mask (see the header) as B * padded values, 1 = attend, with the layout's padding
// hidden; every key attended when it is undefined.
std::vector<double> keys_kept(const Tensor& key_mask, const SequenceLayout& layout, int64_t B) {
  const int64_t P = layout.padded();
  std::vector<double> keep(static_cast<size_t>(B * P), 1.0);
  if (key_mask.defined()) {
    MAMMOTH_CHECK(key_mask.dtype() == DType::kBool && key_mask.shape() == engine::Shape({B, P}))
        << "[sequence_parallel] key_mask must be bool [" << B << ", " << P << "], got "
        << dtype_name(key_mask.dtype()) << " " << engine::shape_str(key_mask.shape());
    keep = engine::cast(key_mask, DType::kF64).to_vector();
  }
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t t = layout.length(); t < P; ++t) keep[b * P + t] = 0.0;
  }
  return keep;
}

Partial merge(const Partial& a, const Partial& b) {
  if (!a.o.defined()) return b;
  Tensor mx;
  {
    engine::NoGradGuard ng;
    mx = engine::max(engine::concat({a.lse.detach(), b.lse.detach()}, -1), -1, true);
  }
  Tensor wa = engine::exp(a.lse - mx), wb = engine::exp(b.lse - mx);
  Tensor z = wa + wb;
  return {(a.o * wa + b.o * wb) / z, engine::log(z) + mx};
}

}  // namespace

Tensor ulysses_attention(const Tensor& q, const Tensor& k, const Tensor& v, Communicator& group,
                         const SequenceLayout& layout, bool causal, double scale, int64_t window,
                         const Tensor& key_mask) {
  const int p = group.size();
  MAMMOTH_CHECK(layout.split() == SeqSplit::kContiguous && layout.parts() == p)
      << "[ulysses_attention] needs a contiguous layout over the group's " << p << " ranks";
  const int64_t H = q.size(1);
  MAMMOTH_CHECK(H % p == 0) << "[ulysses_attention] " << H
                            << " attention heads (on this tp rank) do not divide by sp size " << p;
  Tensor kk = k, vv = v;
  if (k.size(1) % p != 0) {
    kk = repeat_kv(k, H);
    vv = repeat_kv(v, H);
  }
  // [B, H, T/p, D] -> [B, H/p, T, D]: scatter heads (dim 1), gather the sequence (dim 2).
  Tensor qa = all_to_all_group(q, group, 1, 2);
  Tensor ka = all_to_all_group(kk, group, 1, 2);
  Tensor va = all_to_all_group(vv, group, 1, 2);
  engine::AttentionOptions opt;
  opt.causal = causal;
  opt.scale = scale;
  opt.window = window;  // every position is present after the all-to-all
  // Causal attention never looks at the trailing padding; full attention must be told.
  if (key_mask.defined() || (!causal && layout.padded() > layout.length())) {
    opt.key_mask = Tensor::from_vector(keys_kept(key_mask, layout, q.size(0)),
                                       {q.size(0), layout.padded()}, DType::kBool)
                       .to(q.device());
  }
  Tensor y = engine::attention(qa, ka, va, opt);  // [B, H/p, T, D]
  return all_to_all_group(y, group, 2, 1);        // back to [B, H, T/p, D]
}

Tensor ring_attention(const Tensor& q, const Tensor& k, const Tensor& v, Communicator& group,
                      const SequenceLayout& layout, bool causal, double scale, int64_t window,
                      const Tensor& key_mask) {
  MAMMOTH_CHECK(window >= 0 && (window == 0 || causal))
      << "[ring_attention] a sliding window (" << window << ") needs causal attention";
  const int p = group.size(), r = group.rank();
  MAMMOTH_CHECK(layout.parts() == p && q.size(2) == layout.local_length())
      << "[ring_attention] q " << engine::shape_str(q.shape()) << " does not hold a local part of "
      << layout.local_length() << " positions over " << p << " ranks";
  const int64_t B = q.size(0), H = q.size(1), D = q.size(3), c = layout.chunk_size(),
                T = layout.length(), P = layout.padded();
  if (scale == 0.0) scale = 1.0 / std::sqrt(static_cast<double>(D));
  // With a padding mask each block's mask is per sequence: [B, 1, c, c] instead of [c, c].
  const bool per_sequence = key_mask.defined();
  const std::vector<double> kept =
      per_sequence ? keys_kept(key_mask, layout, B) : std::vector<double>();
  const int64_t rows = per_sequence ? B : 1;
  const std::vector<int64_t> mine = layout.chunks(r);
  std::vector<Tensor> qc;
  for (size_t i = 0; i < mine.size(); ++i) {
    qc.push_back(q.slice(2, static_cast<int64_t>(i) * c, static_cast<int64_t>(i + 1) * c));
  }
  std::vector<Partial> acc(mine.size());
  // K and V travel as one tensor, so each step is one node of a single chain: every rank's
  // backward then runs the ring's (collective) nodes in the same order.
  const int64_t Hk = k.size(1);
  Tensor kv = engine::concat({k, v}, 1);  // [B, 2 Hk, T_local, D]
  for (int s = 0; s < p; ++s) {
    if (s > 0) kv = ring_shift(kv, group, 1);  // K/V of rank r-s arrive from the left
    Tensor kk = kv.slice(1, 0, Hk), vv = kv.slice(1, Hk, 2 * Hk);
    const std::vector<int64_t> theirs = layout.chunks((r - s + p) % p);
    const Tensor ke = repeat_kv(kk, H), ve = repeat_kv(vv, H);
    for (size_t i = 0; i < mine.size(); ++i) {
      for (size_t j = 0; j < theirs.size(); ++j) {
        const int64_t qi = mine[i], kj = theirs[j];
        if (causal && kj > qi) continue;  // wholly in the future
        if (kj * c >= T) continue;        // wholly padding
        // wholly slid out: the chunk's last key is at or before its first query - window
        if (window > 0 && (kj + 1) * c - 1 <= qi * c - window) continue;
        bool any = false;
        std::vector<double> hide(static_cast<size_t>(rows * c * c));
        for (int64_t n = 0; n < rows; ++n) {
          for (int64_t a = 0; a < c; ++a) {
            for (int64_t b = 0; b < c; ++b) {
              const int64_t qp = qi * c + a, kp = kj * c + b;
              const bool h = kp >= T || (causal && kp > qp) || (window > 0 && kp <= qp - window) ||
                             (per_sequence && kept[n * P + kp] == 0.0);
              hide[(n * c + a) * c + b] = h ? 1.0 : 0.0;
              any = any || h;
            }
          }
        }
        Tensor mask;
        if (any) {
          mask = Tensor::from_vector(hide,
                                     per_sequence ? engine::Shape{B, 1, c, c} : engine::Shape{c, c},
                                     DType::kBool)
                     .to(q.device());
        }
        const int64_t j0 = static_cast<int64_t>(j) * c;
        acc[i] = merge(acc[i], attend_block(qc[i], ke.slice(2, j0, j0 + c), ve.slice(2, j0, j0 + c),
                                            mask, scale));
      }
    }
  }
  std::vector<Tensor> outs;
  for (size_t i = 0; i < mine.size(); ++i) {
    // A chunk of pure padding attended to nothing: its output is dropped anyway.
    outs.push_back(acc[i].o.defined() ? acc[i].o
                                      : Tensor::zeros(qc[i].shape(), q.dtype(), q.device()));
  }
  Tensor out = outs.size() == 1 ? outs[0] : engine::concat(outs, 2);
  // A rank whose queries all precede the last block it received (causal, contiguous layout)
  // never uses it; tie the chain's end to the output with a zero weight so its backward node
  // is still reached and this rank still passes the gradients of the other ranks along.
  if (p > 1) out = out + engine::sum(kv) * 0.0;
  return out;
}

}  // namespace mammoth::parallel
