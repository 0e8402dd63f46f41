// Autograd mechanics: accumulation into .grad, shared subgraphs, no-grad mode, the error for a
// second backward through a freed graph, and gradients written over dead incoming ones.
#include "engine/autograd.h"

#include <catch2/catch.hpp>
#include <utility>

#include "engine/ops.h"
#include "engine/ops/common.h"
#include "memory/allocator.h"

using namespace mammoth;
using engine::Tensor;

TEST_CASE("gradients accumulate across backward calls and through shared nodes") {
  Tensor x = Tensor::from_vector({1, 2, 3}, {3}, DType::kF64).requires_grad_();
  Tensor y = engine::mul(x, x);         // used twice below
  Tensor z = engine::sum(y + y * 3.0);  // dz/dx = 8x
  z.backward();
  CHECK(x.grad().to_vector() == std::vector<double>{8, 16, 24});
  engine::sum(x * 2.0).backward();  // accumulates
  CHECK(x.grad().to_vector() == std::vector<double>{10, 18, 26});
  x.zero_grad();
  CHECK(!x.grad().defined());
}

TEST_CASE("a second backward through the same graph is a clear error") {
  Tensor x = Tensor::from_vector({1, 2}, {2}).requires_grad_();
  Tensor loss = engine::sum(engine::exp(x));
  loss.backward();
  try {
    loss.backward();
    FAIL("expected an error");
  } catch (const Error& e) {
    CHECK(std::string(e.message()).find("second time") != std::string::npos);
  }
}

TEST_CASE("no-grad mode records nothing") {
  Tensor x = Tensor::from_vector({1, 2}, {2}).requires_grad_();
  Tensor y;
  {
    engine::NoGradGuard ng;
    y = engine::mul(x, x);
  }
  CHECK(!y.requires_grad());
  CHECK(!y.grad_fn());
  Tensor z = engine::mul(x, x);
  CHECK(z.requires_grad());
  CHECK(z.grad_fn()->name() == "mul");
}

TEST_CASE("backward needs a gradient for non-scalar roots") {
  Tensor x = Tensor::from_vector({1, 2}, {2}).requires_grad_();
  Tensor y = x * 3.0;
  CHECK_THROWS_AS(y.backward(), Error);
  y.backward(Tensor::from_vector({1, 10}, {2}));
  CHECK(x.grad().to_vector() == std::vector<double>{3, 30});
}

TEST_CASE("gradients of broadcast inputs are summed to their shape") {
  Tensor a = Tensor::from_vector({1, 2, 3}, {1, 3}).requires_grad_();
  Tensor b = Tensor::from_vector({1, 1}, {2, 1}).requires_grad_();
  engine::sum(engine::mul(a, b)).backward();
  CHECK(a.grad().shape() == engine::Shape{1, 3});
  CHECK(a.grad().to_vector() == std::vector<double>{2, 2, 2});
  CHECK(b.grad().to_vector() == std::vector<double>{6, 6});
}

TEST_CASE("gradient-ready hooks fire once, after the last contribution") {
  Tensor w = Tensor::from_vector({1, 2}, {2}, DType::kF64).requires_grad_();
  Tensor unused = Tensor::from_vector({5}, {1}, DType::kF64).requires_grad_();
  std::vector<double> seen_at_hook;
  int calls = 0, unused_calls = 0;
  engine::set_grad_ready_hook(w, [&] {
    ++calls;
    seen_at_hook = w.grad().to_vector();
  });
  engine::set_grad_ready_hook(unused, [&] { ++unused_calls; });
  // w is used three times; the hook must see the full gradient 1 + 2*w + 3 = (6, 8).
  Tensor loss = engine::sum(w + w * w + w * 3.0);
  loss.backward();
  CHECK(calls == 1);
  CHECK(seen_at_hook == std::vector<double>{6, 8});
  CHECK(unused_calls == 0);
  engine::set_grad_ready_hook(w, nullptr);
  engine::sum(w).backward();
  CHECK(calls == 1);
}

TEST_CASE("linear's weight gradient can be deferred to a queue and run later") {
  // x [3, 4] -> linear(w [5, 4], b [5]) -> sum: the input gradient is computed during
  // backward, the weight's GEMM waits in the queue; running it gives the same gradient, added
  // to what the weight already had.
  auto make = [](double scale) {
    std::vector<double> v(20);
    for (int i = 0; i < 20; ++i) v[i] = scale * (i % 7 - 3);
    return Tensor::from_vector(v, {5, 4}, DType::kF64);
  };
  Tensor x0 = Tensor::from_vector({1, 2, 3, 4, -1, 0, 2, 1, 0.5, -2, 1, 3}, {3, 4}, DType::kF64);
  Tensor w_ref = make(0.25), w = make(0.25);
  Tensor b_ref = Tensor::zeros({5}, DType::kF64), b = Tensor::zeros({5}, DType::kF64);
  Tensor x_ref = x0.clone(), x = x0.clone();
  for (Tensor* t : {&w_ref, &w, &b_ref, &b, &x_ref, &x}) t->requires_grad_();
  engine::sum(engine::linear(x_ref, w_ref, b_ref)).backward();

  engine::accumulate_grad(w, Tensor::ones({5, 4}, DType::kF64));  // an earlier contribution
  engine::WeightGradQueue queue;
  {
    engine::DeferWeightGradsGuard defer(&queue);
    engine::sum(engine::linear(x, w, b)).backward();
  }
  REQUIRE(queue.size() == 1);
  CHECK(x.grad().to_vector() == x_ref.grad().to_vector());      // input gradient: now
  CHECK(b.grad().to_vector() == b_ref.grad().to_vector());      // bias: not a GEMM of saved tensors
  CHECK(w.grad().to_vector() == std::vector<double>(20, 1.0));  // weight: not yet
  queue.run();
  CHECK(queue.empty());
  const std::vector<double> want = w_ref.grad().to_vector();
  const std::vector<double> got = w.grad().to_vector();
  for (size_t i = 0; i < want.size(); ++i) CHECK(got[i] == Approx(want[i] + 1.0));
  // Outside a guard nothing is deferred.
  CHECK(engine::deferred_weight_grads() == nullptr);
}

// ---- gradients written over dead incoming gradients (engine/ops/common.h, grad_buffer) -------

TEST_CASE("grad_buffer reuses only a contiguous CPU gradient no other handle can reach") {
  const Tensor like = Tensor::zeros({4, 8});
  auto reused = [&](const Tensor& dy) {
    return engine::detail::grad_buffer(dy, like).storage() == dy.storage();
  };
  Tensor dy = Tensor::randn({4, 8}, 1);
  CHECK(reused(dy));
  Tensor copy = dy;  // a second handle to the same TensorImpl
  CHECK_FALSE(reused(dy));
  copy = Tensor();
  Tensor view = dy.view({32});  // a second TensorImpl on the same storage
  CHECK_FALSE(reused(dy));
  view = Tensor();
  CHECK(reused(dy));
  CHECK_FALSE(reused(Tensor::randn({8, 4}, 1).transpose(0, 1)));         // not contiguous
  CHECK_FALSE(reused(Tensor::randn({4, 8}, 1, 0.0, 1.0, DType::kF64)));  // another dtype
  CHECK_FALSE(reused(Tensor::randn({32}, 1)));                           // another shape
  const Tensor fresh = engine::detail::grad_buffer(Tensor(), like);      // no gradient at all
  CHECK(fresh.shape() == like.shape());
}

namespace {
// The CPU allocations loss.backward() makes.
int64_t backward_allocs(const Tensor& loss) {
  memory::Allocator& cpu = memory::allocator_for(Device::cpu());
  const int64_t before = cpu.stats().num_allocs;
  loss.backward();
  return cpu.stats().num_allocs - before;
}

// x -> [layer_norm -> softmax -> rms_norm -> log_softmax -> gelu -> silu] * reps, with weights
// that need no gradient; loss = sum(y * c). Returns the CPU allocations backward made.
int64_t chain_backward_allocs(int reps) {
  Tensor x = Tensor::randn({6, 40}, 2).requires_grad_();
  const Tensor w = Tensor::rand({40}, 3, 0.5, 1.5), b = Tensor::randn({40}, 4);
  Tensor y = x;
  for (int r = 0; r < reps; ++r) {
    y = engine::silu(engine::gelu(
        engine::log_softmax(engine::rms_norm(engine::softmax(engine::layer_norm(y, w, b)), w))));
  }
  return backward_allocs(engine::sum(engine::mul(y, Tensor::randn({6, 40}, 5))));
}
}  // namespace

// Each op of the chain writes its input gradient over its output gradient, which nothing else
// reads: one more repetition costs backward only layer_norm's dw and db and rms_norm's dw (three
// allocations), not also a dx for each of the six ops.
TEST_CASE("backward writes each op's input gradient over its dead output gradient") {
  const int64_t one = chain_backward_allocs(1), three = chain_backward_allocs(3);
  CHECK(three - one == 2 * 3);
}

// A gradient two ops read (add passes its incoming gradient to both inputs) must not be written
// over by the first of them; nor may a gradient the caller passed to backward.
TEST_CASE("gradients still read elsewhere are never written over") {
  const Tensor w = Tensor::rand({40}, 3, 0.5, 1.5), b = Tensor::randn({40}, 4);
  const Tensor c = Tensor::randn({6, 40}, 5);
  auto grads = [&](bool together) {
    Tensor x1 = Tensor::randn({6, 40}, 6).requires_grad_();
    Tensor x2 = Tensor::randn({6, 40}, 7).requires_grad_();
    auto branch = [&](const Tensor& x) { return engine::gelu(engine::layer_norm(x, w, b)); };
    if (together) {
      engine::sum(engine::mul(engine::add(branch(x1), branch(x2)), c)).backward();
    } else {
      engine::sum(engine::mul(branch(x1), c)).backward();
      engine::sum(engine::mul(branch(x2), c)).backward();
    }
    return std::make_pair(x1.grad().to_vector(), x2.grad().to_vector());
  };
  CHECK(grads(true) == grads(false));

  Tensor x = Tensor::randn({6, 40}, 8).requires_grad_();
  const Tensor seed = Tensor::randn({6, 40}, 9);
  const std::vector<double> kept = seed.to_vector();
  engine::softmax(engine::layer_norm(x, w, b)).backward(seed);
  CHECK(seed.to_vector() == kept);
}

namespace {
// x -> [y = y + gelu(y)] * reps; loss = sum(y * c). Returns the CPU allocations backward made,
// and x's gradient.
std::pair<int64_t, std::vector<double>> residual_backward(int reps) {
  Tensor x = Tensor::randn({6, 40}, 2).requires_grad_();
  Tensor y = x;
  for (int r = 0; r < reps; ++r) y = engine::add(y, engine::gelu(y));
  const int64_t allocs = backward_allocs(engine::sum(engine::mul(y, Tensor::randn({6, 40}, 5))));
  return {allocs, x.grad().to_vector()};
}
}  // namespace

// add passes its gradient g to both inputs, so gelu (which sees g shared) needs a new dx; where
// the two meet again (y's gradient = g + dx), the sum goes over one of them instead of a third
// tensor: one allocation per residual block, not two.
TEST_CASE("autograd sums two gradients over one of them when nothing else reads it") {
  const auto one = residual_backward(1), three = residual_backward(3);
  CHECK(three.first - one.first == 2 * 1);
  // And the sums are right: d/dx of x + gelu(x), three times over, against the chain rule by hand
  // (the engine's own ops, evaluated without autograd).
  Tensor x = Tensor::randn({6, 40}, 2);
  const Tensor c = Tensor::randn({6, 40}, 5);
  std::vector<Tensor> ys{x};
  for (int r = 0; r < 3; ++r) ys.push_back(engine::add(ys.back(), engine::gelu(ys.back())));
  Tensor g = c;
  for (int r = 2; r >= 0; --r) {
    Tensor gelu_grad = Tensor::empty({6, 40});
    engine::detail::launch(kernels::Kernel::gelu_backward, {g, ys[r]}, {gelu_grad});
    g = engine::add(g, gelu_grad);
  }
  CHECK(three.second == g.to_vector());
}

// A leaf's first gradient from backward is kept as its .grad when nothing else reads it: k
// leaves cost backward one allocation each (mul's gradient g * c), not two (and a copy).
TEST_CASE("backward keeps a leaf's first gradient as its .grad instead of copying it") {
  auto allocs = [](int k) {
    std::vector<Tensor> leaves;
    const Tensor c = Tensor::randn({4, 8}, 3);
    Tensor loss;
    for (int i = 0; i < k; ++i) {
      leaves.push_back(Tensor::randn({4, 8}, 10 + i).requires_grad_());
      Tensor term = engine::mul(leaves.back(), c);
      loss = loss.defined() ? engine::add(loss, term) : term;
    }
    const int64_t n = backward_allocs(engine::sum(loss));
    for (const Tensor& p : leaves) CHECK(p.grad().to_vector() == c.to_vector());
    return n;
  };
  CHECK(allocs(4) - allocs(1) == 3 * 1);
}

// accumulate_grad (the deferred weight gradients' way in) never keeps the caller's tensor; it
// adds over the .grad where the leaf alone holds it, else into a new tensor.
TEST_CASE("accumulate_grad sums in place only where nothing else reads the .grad") {
  Tensor p = Tensor::zeros({4, 8}).requires_grad_();
  const Tensor g1 = Tensor::randn({4, 8}, 1), g2 = Tensor::randn({4, 8}, 2);
  const std::vector<double> v1 = g1.to_vector(), v2 = g2.to_vector();
  engine::accumulate_grad(p, g1);
  CHECK(p.grad().raw_data() != g1.raw_data());  // copied: the caller still holds g1
  const void* first = p.grad().raw_data();
  engine::accumulate_grad(p, g2);
  CHECK(p.grad().raw_data() == first);  // summed over the .grad
  CHECK(g1.to_vector() == v1);
  CHECK(g2.to_vector() == v2);
  const std::vector<double> sum12 = p.grad().to_vector();
  for (size_t i = 0; i < sum12.size(); ++i) {
    CHECK(sum12[i] == static_cast<double>(static_cast<float>(v1[i]) + static_cast<float>(v2[i])));
  }
  const Tensor held = p.grad();  // someone reads the .grad: the next sum goes to a new tensor
  engine::accumulate_grad(p, g2);
  CHECK(held.to_vector() == sum12);
  CHECK(p.grad().raw_data() != held.raw_data());
}

// cross_entropy's backward writes dlogits over its saved logits when nothing else holds them
// (one allocation fewer), and never when the caller keeps its logits (they come back unchanged).
TEST_CASE("cross_entropy's backward writes over the logits only when nothing else holds them") {
  const Tensor targets = Tensor::from_ints({1, 4, 0}, {3});
  const Tensor w = Tensor::randn({7, 7}, 2);
  auto run = [&](bool keep) {
    Tensor x = Tensor::randn({3, 7}, 1).requires_grad_();
    Tensor logits = engine::matmul(x, w);
    const std::vector<double> before = logits.to_vector();
    Tensor loss = engine::cross_entropy(logits, targets);
    if (!keep) logits = Tensor();
    const int64_t allocs = backward_allocs(loss);
    if (keep) CHECK(logits.to_vector() == before);
    return std::make_pair(allocs, x.grad().to_vector());
  };
  const auto kept = run(true), dropped = run(false);
  CHECK(kept.second == dropped.second);
  CHECK(dropped.first == kept.first - 1);
}

// Bytes backward allocated at its peak, beyond what was live before it.
int64_t backward_peak_bytes(const Tensor& loss) {
  memory::Allocator& cpu = memory::allocator_for(Device::cpu());
  const int64_t before = cpu.stats().allocated_bytes;
  cpu.reset_peak();
  loss.backward();
  return cpu.stats().peak_bytes - before;
}

// A tied embedding (the LM head's weight is the token table): the embedding's backward adds its
// rows into the .grad the head's backward left, instead of building a zero table and adding it
// (backward's peak is then the batch's rows, not a table), and only where nothing else holds
// that .grad. Gradient accumulation over two backwards takes the same path. The sums are
// bitwise those of the dense formulation.
TEST_CASE("a tied embedding adds its rows into the weight's .grad in place") {
  const int64_t V = 1000, C = 64;  // a 256 KB table; the batch is 5 rows
  const Tensor ids = Tensor::from_ints({3, 1, 3, 0, 999}, {5});
  const Tensor c = Tensor::randn({5, V}, 7);
  const Tensor w0 = Tensor::randn({V, C}, 8);
  auto loss_of = [&](const Tensor& table, const Tensor& head) {
    return engine::sum(
        engine::mul(engine::matmul(engine::embedding(ids, table), head.transpose(0, 1)), c));
  };
  // Dense reference: the two uses of W through separate leaves, summed by hand.
  Tensor we = w0.clone().requires_grad_(), wh = w0.clone().requires_grad_();
  loss_of(we, wh).backward();
  const std::vector<double> ge = we.grad().to_vector(), gh = wh.grad().to_vector();
  std::vector<double> want(ge.size());
  for (size_t i = 0; i < want.size(); ++i) {
    want[i] = static_cast<float>(static_cast<float>(gh[i]) + static_cast<float>(ge[i]));
  }
  auto run = [&](bool hold_grad, int backwards) {
    Tensor w = w0.clone().requires_grad_();
    Tensor held;
    for (int b = 0; b < backwards; ++b) {
      Tensor loss = loss_of(w, w);
      if (hold_grad && w.grad().defined()) held = w.grad();
      loss.backward();
    }
    return w.grad().to_vector();
  };
  // A repeated id's rows are summed before they meet the head's gradient, as through a zero
  // table: bitwise the dense sums.
  const auto once = run(false, 1);
  CHECK(once == want);
  // The embedding's backward alone, onto a .grad that exists: its peak is the batch's rows, not
  // a table; with the .grad held elsewhere, a table.
  const int64_t table = V * C * 4;
  for (bool hold : {false, true}) {
    Tensor w = w0.clone().requires_grad_();
    engine::accumulate_grad(w, Tensor::ones({V, C}));
    const Tensor held = hold ? w.grad() : Tensor();
    const Tensor rows = Tensor::randn({5, C}, 9);
    const int64_t peak =
        backward_peak_bytes(engine::sum(engine::mul(engine::embedding(ids, w), rows)));
    INFO("held " << hold << ", peak " << peak << " bytes");
    CHECK((hold ? peak >= table : peak < table / 8));
    const std::vector<double> g = w.grad().to_vector(), r = rows.to_vector();
    CHECK(g[3 * C] == static_cast<float>(1.0f + static_cast<float>(static_cast<float>(r[0]) +
                                                                   static_cast<float>(r[2 * C]))));
    CHECK(g[2 * C] == 1.0);
  }
  // Twice: the second backward's rows go into the accumulated .grad, also where a handle held
  // the first (the head's sum then makes a new .grad, which the rows go into).
  const auto twice = run(false, 2), twice_held = run(true, 2);
  for (size_t i = 0; i < want.size(); ++i) CHECK(twice[i] == Approx(2 * want[i]));
  CHECK(twice == twice_held);
}
