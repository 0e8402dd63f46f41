#include "models/encoder.h"

namespace mammoth::models {

using engine::Tensor;

EncoderSelfAttention::EncoderSelfAttention(const ModelConfig& c, const Layers& L)
    : config_(c), layers_(L), heads_(L.split(c.n_head, "n_head")) {
  query = register_module("query", L.column(c.d_model, c.d_model, true, c.dtype));
  key = register_module("key", L.column(c.d_model, c.d_model, true, c.dtype));
  value = register_module("value", L.column(c.d_model, c.d_model, true, c.dtype));
}

Tensor EncoderSelfAttention::forward(const Tensor& x, const SeqContext& seq) const {
  const int64_t H = heads_;
  Tensor y = layers_.attention(split_heads(query->forward(x), H), split_heads(key->forward(x), H),
                               split_heads(value->forward(x), H), {}, config_.attn_dropout,
                               is_training(), seq);
  return merge_heads(y);
}

}  // namespace mammoth::models
