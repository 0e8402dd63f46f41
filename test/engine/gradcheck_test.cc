// Gradient checks for every differentiable op in engine/op_list.h (central differences, f64).
// The first test fails when an op in the inventory has no case here.
#include "test/testing/gradcheck.h"

#include <catch2/catch.hpp>
#include <functional>
#include <map>
#include <string>

#include "engine/nn/checkpoint.h"
#include "engine/op_list.h"
#include "engine/ops.h"

using namespace mammoth;
using engine::Tensor;
using Inputs = std::vector<Tensor>;
using testing::gradcheck;
using testing::leaf;
using testing::leaf_uniform;

namespace {

struct Case {
  std::function<Tensor(const Inputs&)> f;
  std::function<Inputs()> inputs;
  testing::GradcheckOptions options = {};
};

// Values bounded away from the kinks of relu / max so finite differences are valid.
Tensor away_from_zero(const engine::Shape& shape, uint64_t seed) {
  std::vector<double> v = Tensor::randn(shape, seed, 0.0, 1.0, DType::kF64).to_vector();
  for (double& x : v) x = x >= 0 ? x + 0.1 : x - 0.1;
  Tensor t = Tensor::from_vector(v, shape, DType::kF64);
  t.requires_grad_();
  return t;
}

Tensor ids(const std::vector<int64_t>& v, const engine::Shape& shape) {
  return Tensor::from_ints(v, shape);
}

std::map<std::string, std::vector<Case>> cases() {
  using namespace engine;
  std::map<std::string, std::vector<Case>> c;
  c["add"] = {{[](const Inputs& x) { return add(x[0], x[1]); },
               [] {
                 return Inputs{leaf({2, 3}, 1), leaf({3}, 2)};
               }},
              {[](const Inputs& x) { return x[0] + x[1]; },
               [] {
                 return Inputs{leaf({2, 1, 4}, 1), leaf({3, 1}, 2)};
               }}};
  c["sub"] = {{[](const Inputs& x) { return sub(x[0], x[1]); },
               [] {
                 return Inputs{leaf({2, 1}, 3), leaf({2, 3}, 4)};
               }}};
  c["mul"] = {{[](const Inputs& x) { return mul(x[0], x[1]); },
               [] {
                 return Inputs{leaf({2, 3}, 5), leaf({1, 3}, 6)};
               }}};
  c["div"] = {{[](const Inputs& x) { return div(x[0], x[1]); },
               [] {
                 return Inputs{leaf({2, 3}, 7), leaf_uniform({2, 3}, 8, 0.5, 2.0)};
               }}};
  c["neg"] = {{[](const Inputs& x) { return neg(x[0]); }, [] { return Inputs{leaf({4}, 9)}; }}};
  c["exp"] = {{[](const Inputs& x) { return exp(x[0]); }, [] { return Inputs{leaf({4}, 10)}; }}};
  c["log"] = {{[](const Inputs& x) { return log(x[0]); },
               [] { return Inputs{leaf_uniform({4}, 11, 0.5, 2.0)}; }}};
  c["sqrt"] = {{[](const Inputs& x) { return sqrt(x[0]); },
                [] { return Inputs{leaf_uniform({4}, 12, 0.5, 2.0)}; }}};
  c["rsqrt"] = {{[](const Inputs& x) { return rsqrt(x[0]); },
                 [] { return Inputs{leaf_uniform({4}, 13, 0.5, 2.0)}; }}};
  c["tanh"] = {{[](const Inputs& x) { return tanh(x[0]); }, [] { return Inputs{leaf({5}, 14)}; }}};
  c["relu"] = {
      {[](const Inputs& x) { return relu(x[0]); }, [] { return Inputs{away_from_zero({6}, 15)}; }}};
  c["gelu"] = {{[](const Inputs& x) { return gelu(x[0]); }, [] { return Inputs{leaf({6}, 16)}; }}};
  c["gelu_tanh"] = {
      {[](const Inputs& x) { return gelu_tanh(x[0]); }, [] { return Inputs{leaf({6}, 17)}; }}};
  c["silu"] = {{[](const Inputs& x) { return silu(x[0]); }, [] { return Inputs{leaf({6}, 18)}; }}};
  c["add_scalar"] = {
      {[](const Inputs& x) { return x[0] + 2.5; }, [] { return Inputs{leaf({3}, 19)}; }}};
  c["mul_scalar"] = {
      {[](const Inputs& x) { return x[0] * -1.5; }, [] { return Inputs{leaf({3}, 20)}; }}};
  c["pow_scalar"] = {{[](const Inputs& x) { return pow_scalar(x[0], 2.5); },
                      [] { return Inputs{leaf_uniform({3}, 21, 0.5, 2.0)}; }}};
  c["sum"] = {{[](const Inputs& x) { return sum(x[0], {1}); },
               [] {
                 return Inputs{leaf({2, 3, 4}, 22)};
               }},
              {[](const Inputs& x) {
                 return sum(x[0], {0, 2}, true);
               },
               [] {
                 return Inputs{leaf({2, 3, 4}, 23)};
               }},
              {[](const Inputs& x) { return sum(x[0]); },
               [] {
                 return Inputs{leaf({2, 3}, 24)};
               }}};
  c["sum_squares"] = {{[](const Inputs& x) { return sum_squares(x[0]); },
                       [] {
                         return Inputs{leaf({3, 4}, 76)};
                       }},
                      {[](const Inputs& x) { return sum_squares(x[0].transpose(0, 1)); },
                       [] {
                         return Inputs{leaf({2, 5}, 77)};
                       }}};
  c["mean"] = {{[](const Inputs& x) { return mean(x[0], {-1}, true); },
                [] {
                  return Inputs{leaf({2, 5}, 25)};
                }}};
  c["max"] = {{[](const Inputs& x) { return max(x[0], 1); },
               [] {
                 return Inputs{leaf({3, 4, 2}, 26)};
               }},
              {[](const Inputs& x) { return max(x[0], -1, true); },
               [] {
                 return Inputs{leaf({3, 5}, 27)};
               }}};
  c["matmul"] = {
      {[](const Inputs& x) { return matmul(x[0], x[1]); },
       [] {
         return Inputs{leaf({3, 4}, 28), leaf({4, 2}, 29)};
       }},
      {[](const Inputs& x) { return matmul(x[0], x[1]); },  // [B,M,K] @ [K,N] folds the batch
       [] {
         return Inputs{leaf({2, 3, 4}, 30), leaf({4, 5}, 31)};
       }},
      {[](const Inputs& x) { return matmul(x[0], x[1].transpose(-1, -2)); },  // transposed view
       [] {
         return Inputs{leaf({2, 3, 4}, 32), leaf({2, 5, 4}, 33)};
       }},
      {[](const Inputs& x) { return matmul(x[0].transpose(-1, -2), x[1]); },  // broadcast batch
       [] {
         return Inputs{leaf({1, 4, 3}, 34), leaf({2, 4, 2}, 35)};
       }}};
  c["linear"] = {{[](const Inputs& x) { return linear(x[0], x[1], x[2]); },
                  [] {
                    return Inputs{leaf({2, 3, 4}, 76), leaf({5, 4}, 77), leaf({5}, 78)};
                  }},
                 {[](const Inputs& x) { return linear(x[0].transpose(0, 1), x[1]); },  // strided x
                  [] {
                    return Inputs{leaf({4, 3}, 79), leaf({2, 4}, 80)};
                  }}};
  c["softmax"] = {{[](const Inputs& x) { return softmax(x[0], -1); },
                   [] {
                     return Inputs{leaf({3, 5}, 36)};
                   }},
                  {[](const Inputs& x) { return softmax(x[0], 0); },
                   [] {
                     return Inputs{leaf({3, 4}, 37)};
                   }}};
  c["log_softmax"] = {{[](const Inputs& x) { return log_softmax(x[0], -1); },
                       [] {
                         return Inputs{leaf({2, 3, 5}, 38)};
                       }}};
  c["layer_norm"] = {{[](const Inputs& x) { return layer_norm(x[0], x[1], x[2], 1e-5); },
                      [] {
                        return Inputs{leaf({3, 2, 6}, 39), leaf({6}, 40), leaf({6}, 41)};
                      }}};
  c["rms_norm"] = {{[](const Inputs& x) { return rms_norm(x[0], x[1], 1e-6); },
                    [] {
                      return Inputs{leaf({4, 5}, 42), leaf({5}, 43)};
                    }}};
  c["embedding"] = {{[](const Inputs& x) {
                       return embedding(ids({1, 3, 1, 0, 4, 3}, {2, 3}), x[0]);
                     },
                     [] {
                       return Inputs{leaf({5, 4}, 44)};
                     }}};
  c["cross_entropy"] = {{[](const Inputs& x) {
                           return cross_entropy(x[0], ids({1, 0, 4, 2, 3, 1}, {2, 3}));
                         },
                         [] {
                           return Inputs{leaf({2, 3, 5}, 45)};
                         }},
                        {[](const Inputs& x) {
                           return cross_entropy(x[0], ids({1, -100, 4, 2}, {4}),
                                                {.ignore_index = -100, .label_smoothing = 0.1});
                         },
                         [] {
                           return Inputs{leaf({4, 5}, 46)};
                         }}};
  c["dropout"] = {{[](const Inputs& x) { return dropout(x[0], 0.3, 7, 0); },
                   [] {
                     return Inputs{leaf({4, 8}, 47)};
                   }}};
  c["attention"] = {
      {[](const Inputs& x) { return attention(x[0], x[1], x[2], {.causal = true}); },
       [] {
         return Inputs{leaf({1, 2, 4, 3}, 48), leaf({1, 2, 4, 3}, 49), leaf({1, 2, 4, 3}, 50)};
       }},
      {[](const Inputs& x) {  // grouped-query, Tq != Tk, padding mask, custom scale
         Tensor mask = Tensor::from_ints({1, 1, 0, 1, 1, 0, 1, 1, 1, 1}, {2, 5}).to(DType::kBool);
         return attention(x[0], x[1], x[2], {.causal = false, .scale = 0.7, .key_mask = mask});
       },
       [] {
         return Inputs{leaf({2, 4, 3, 2}, 51), leaf({2, 2, 5, 2}, 52), leaf({2, 2, 5, 2}, 53)};
       }},
      {[](const Inputs& x) { return attention(x[0], x[1], x[2], {.causal = true}); },
       [] {
         return Inputs{leaf({1, 1, 2, 3}, 54), leaf({1, 1, 4, 3}, 55), leaf({1, 1, 4, 3}, 56)};
       }},
      {[](const Inputs& x) {  // sliding window (Mistral), grouped-query
         return attention(x[0], x[1], x[2], {.causal = true, .window = 2});
       },
       [] {
         return Inputs{leaf({1, 2, 5, 3}, 154), leaf({1, 1, 5, 3}, 155), leaf({1, 1, 5, 3}, 156)};
       }}};
  c["rope"] = {{[](const Inputs& x) { return rope(x[0], 10000.0, 3); },
                [] {
                  return Inputs{leaf({2, 3, 2, 4}, 57)};
                }},
               {[](const Inputs& x) { return rope(x[0], 100.0, 0, 2); },  // partial rotary dim
                [] {
                  return Inputs{leaf({1, 4, 1, 6}, 58)};
                }},
               // An explicit inv_freq table (scaled rope); the table itself takes no gradient.
               {[](const Inputs& x) {
                  return rope(x[0], 10000.0, 2, 0, Tensor::from_vector({0.7, 0.02}, {2}));
                },
                [] {
                  return Inputs{leaf({1, 3, 2, 4}, 59)};
                }}};
  c["concat"] = {{[](const Inputs& x) {
                    return concat({x[0], x[1]}, 1);
                  },
                  [] {
                    return Inputs{leaf({2, 3}, 59), leaf({2, 2}, 60)};
                  }}};
  c["split"] = {{[](const Inputs& x) {
                   auto parts = split(x[0], {1, 3}, 1);
                   return parts[0] * 2.0 + sum(parts[1], {1}, true);
                 },
                 [] {
                   return Inputs{leaf({2, 4}, 61)};
                 }}};
  c["index_select"] = {{[](const Inputs& x) {
                          return index_select(x[0], 1, ids({2, 0, 2}, {3}));
                        },
                        [] {
                          return Inputs{leaf({2, 3, 2}, 62)};
                        }}};
  c["gather"] = {{[](const Inputs& x) {
                    return gather(x[0], 1, ids({0, 2, 2, 1, 0, 0}, {2, 3}));
                  },
                  [] {
                    return Inputs{leaf({2, 3}, 63)};
                  }}};
  c["where"] = {{[](const Inputs& x) {
                   Tensor cond = Tensor::from_ints({1, 0, 1, 0, 0, 1}, {2, 3}).to(DType::kBool);
                   return where(cond, x[0], x[1]);
                 },
                 [] {
                   return Inputs{leaf({2, 3}, 64), leaf({3}, 65)};
                 }}};
  c["masked_fill"] = {{[](const Inputs& x) {
                         Tensor m = Tensor::from_ints({1, 0, 0}, {3}).to(DType::kBool);
                         return masked_fill(x[0], m, -5.0);
                       },
                       [] {
                         return Inputs{leaf({2, 3}, 66)};
                       }}};
  c["cast"] = {{[](const Inputs& x) { return cast(x[0], DType::kF32).to(DType::kF64) * 3.0; },
                [] { return Inputs{leaf({4}, 67)}; },
                {.eps = 1e-2, .atol = 1e-4, .rtol = 1e-4}}};
  c["view"] = {{[](const Inputs& x) {
                  return x[0].view({3, 2}).unsqueeze(0) * x[0].reshape({3, 2});
                },
                [] {
                  return Inputs{leaf({2, 3}, 68)};
                }}};
  c["permute"] = {{[](const Inputs& x) {
                     return x[0].permute({2, 0, 1}).contiguous();
                   },
                   [] {
                     return Inputs{leaf({2, 3, 4}, 69)};
                   }}};
  c["slice"] = {{[](const Inputs& x) { return x[0].slice(1, 1, 5, 2) * 2.0; },
                 [] {
                   return Inputs{leaf({2, 5}, 70)};
                 }}};
  c["expand"] = {{[](const Inputs& x) {
                    return x[0].expand({3, 2, 4}) * x[1];
                  },
                  [] {
                    return Inputs{leaf({2, 1}, 71), leaf({3, 2, 4}, 72)};
                  }}};
  c["contiguous"] = {{[](const Inputs& x) { return x[0].transpose(0, 1).contiguous(); },
                      [] {
                        return Inputs{leaf({3, 2}, 73)};
                      }}};
  // Group 1 is empty (an expert that received no tokens): its weight gradient must be zero.
  c["grouped_matmul"] = {
      {[](const Inputs& x) {
         return grouped_matmul(x[0], {0, 2, 2, 5}, {x[1], x[2], x[3]});
       },
       [] {
         return Inputs{leaf({5, 3}, 76), leaf({2, 3}, 77), leaf({2, 3}, 78), leaf({2, 3}, 79)};
       }}};
  // Token 2 receives two rows, token 3 none.
  c["moe_combine"] = {{[](const Inputs& x) {
                         return moe_combine(x[0], ids({2, 0, 2, 1}, {4}), x[1], 4);
                       },
                       [] {
                         return Inputs{leaf({4, 3}, 80), leaf({4}, 81)};
                       }}};
  // Recomputed in backward, with dropout inside: the recomputation must draw the same mask.
  c["checkpoint"] = {{[](const Inputs& x) {
                        return engine::nn::checkpoint(
                            [](const Inputs& v) {
                              return Inputs{dropout(tanh(matmul(v[0], v[1])), 0.25, 3, 0) +
                                            v[0].slice(1, 0, 2)};
                            },
                            x)[0];
                      },
                      [] {
                        return Inputs{leaf({3, 4}, 74), leaf({4, 2}, 75)};
                      }}};
  return c;
}

}  // namespace

TEST_CASE("every engine op has a gradient check") {
  const auto all = cases();
  for (const char* op : engine::kEngineOps) {
    INFO("op: " << op);
    CHECK(all.count(op) == 1);
  }
  CHECK(all.size() == static_cast<size_t>(engine::kEngineOpCount));
}

TEST_CASE("gradient checks") {
  for (const auto& [name, list] : cases()) {
    for (size_t i = 0; i < list.size(); ++i) {
      DYNAMIC_SECTION(name << " case " << i) {
        const Case& cs = list[i];
        const std::string err = gradcheck(cs.f, cs.inputs(), cs.options);
        INFO(name << " case " << i << ": " << err);
        CHECK(err.empty());
      }
    }
  }
}
