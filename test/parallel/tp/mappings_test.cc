// Differentiable collectives against single-process math: every rank can compute every rank's
// input (seeded by the rank), so each mapping's forward and backward are checked against the
// concatenations and sums they stand for. Run under mpirun with 1, 2, 3 and 4 ranks.
#include "parallel/tensor_parallel/mappings.h"

#include <catch2/catch.hpp>

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

// Rank i's input (stream 1) or upstream gradient (stream 2) of shape `shape`.
Tensor data(int i, const engine::Shape& shape, uint64_t stream) {
  return Tensor::randn(shape, 100 + i, 0.0, 1.0, DType::kF64, stream);
}

Tensor leaf(const Tensor& t) { return t.clone().requires_grad_(); }

Tensor cat(const std::vector<Tensor>& ts, int64_t dim) {
  engine::NoGradGuard ng;
  return engine::concat(ts, dim);
}

void require_close(const Tensor& a, const Tensor& b) {
  REQUIRE(a.shape() == b.shape());
  REQUIRE(engine::max_abs(engine::sub(a.detach(), b.detach())) < 1e-12);
}

// Runs backward of sum(y * g) and returns x's gradient.
Tensor grad_of(const Tensor& x, const Tensor& y, const Tensor& g) {
  engine::sum(engine::mul(y, g)).backward();
  return x.grad();
}

}  // namespace

TEST_CASE("copy_to_group / reduce_from_group") {
  auto& w = world();
  const int p = w.size(), r = w.rank();
  const engine::Shape s = {3, 5};
  // copy: identity forward, gradient summed over ranks.
  Tensor x = leaf(data(0, s, 1));
  Tensor y = parallel::copy_to_group(x, w);
  require_close(y, x);
  Tensor want = Tensor::zeros(s, DType::kF64);
  for (int i = 0; i < p; ++i) want = engine::add(want, data(i, s, 2));
  require_close(grad_of(x, y, data(r, s, 2)), want);
  // reduce: sum forward, gradient passed through.
  Tensor xr = leaf(data(r, s, 1));
  Tensor sum = Tensor::zeros(s, DType::kF64);
  for (int i = 0; i < p; ++i) sum = engine::add(sum, data(i, s, 1));
  Tensor yr = parallel::reduce_from_group(xr, w);
  require_close(yr, sum);
  require_close(grad_of(xr, yr, data(0, s, 2)), data(0, s, 2));
}

TEST_CASE("scatter_to_group / gather_from_group") {
  auto& w = world();
  const int p = w.size(), r = w.rank();
  for (int64_t dim : {0, 1, 2}) {
    engine::Shape full = {2, 3, 4};
    full[dim] *= p;
    engine::Shape part = {2, 3, 4};
    const int64_t n = part[dim];
    Tensor x = leaf(data(0, full, 1));
    Tensor y = parallel::scatter_to_group(x, w, dim);
    require_close(y, x.detach().slice(dim, r * n, (r + 1) * n).contiguous());
    std::vector<Tensor> gs;
    for (int i = 0; i < p; ++i) gs.push_back(data(i, part, 2));
    require_close(grad_of(x, y, data(r, part, 2)), cat(gs, dim));

    Tensor xr = leaf(data(r, part, 1));
    Tensor yg = parallel::gather_from_group(xr, w, dim);
    std::vector<Tensor> xs;
    for (int i = 0; i < p; ++i) xs.push_back(data(i, part, 1));
    require_close(yg, cat(xs, dim));
    Tensor g = data(0, full, 2);
    require_close(grad_of(xr, yg, g), g.slice(dim, r * n, (r + 1) * n).contiguous());
  }
}

TEST_CASE("reduce_scatter_to_group / all_gather_from_group along the sequence") {
  auto& w = world();
  const int p = w.size(), r = w.rank();
  const engine::Shape full = {2, 3 * p, 4}, part = {2, 3, 4};
  Tensor x = leaf(data(r, full, 1));
  Tensor y = parallel::reduce_scatter_to_group(x, w, 1);
  Tensor sum = Tensor::zeros(full, DType::kF64);
  for (int i = 0; i < p; ++i) sum = engine::add(sum, data(i, full, 1));
  require_close(y, sum.slice(1, r * 3, (r + 1) * 3).contiguous());
  std::vector<Tensor> gs;
  for (int i = 0; i < p; ++i) gs.push_back(data(i, part, 2));
  require_close(grad_of(x, y, data(r, part, 2)), cat(gs, 1));

  Tensor xr = leaf(data(r, part, 1));
  Tensor yg = parallel::all_gather_from_group(xr, w, 1);
  std::vector<Tensor> xs;
  for (int i = 0; i < p; ++i) xs.push_back(data(i, part, 1));
  require_close(yg, cat(xs, 1));
  Tensor gsum = Tensor::zeros(full, DType::kF64);
  for (int i = 0; i < p; ++i) gsum = engine::add(gsum, data(i, full, 2));
  require_close(grad_of(xr, yg, data(r, full, 2)), gsum.slice(1, r * 3, (r + 1) * 3).contiguous());
}

TEST_CASE("all_to_all_group between head and sequence dims") {
  auto& w = world();
  const int p = w.size(), r = w.rank();
  for (auto [s, g] : {std::pair<int64_t, int64_t>{1, 2}, {2, 1}}) {
    engine::Shape shape = {2, 2 * p, 3 * p, 2};  // [B, H, T_local, D]-like
    Tensor x = leaf(data(r, shape, 1));
    Tensor y = parallel::all_to_all_group(x, w, s, g);
    const int64_t ns = shape[s] / p, ng = shape[g];
    std::vector<Tensor> blocks;  // y_r = concat_i (x_i's r-th block along s) along g
    for (int i = 0; i < p; ++i) blocks.push_back(data(i, shape, 1).slice(s, r * ns, (r + 1) * ns));
    require_close(y, cat(blocks, g).contiguous());
    // x_r's block j went to rank j at position r along g.
    std::vector<Tensor> gb;
    for (int j = 0; j < p; ++j) {
      engine::Shape ys = shape;
      ys[s] = ns;
      ys[g] = ng * p;
      gb.push_back(data(j, ys, 2).slice(g, r * ng, (r + 1) * ng));
    }
    engine::Shape ys = shape;
    ys[s] = ns;
    ys[g] = ng * p;
    require_close(grad_of(x, y, data(r, ys, 2)), cat(gb, s).contiguous());
  }
}

TEST_CASE("ring_shift") {
  auto& w = world();
  const int p = w.size(), r = w.rank();
  const engine::Shape s = {4, 3};
  Tensor x = leaf(data(r, s, 1));
  Tensor y = parallel::ring_shift(x, w, 1);
  require_close(y, data((r - 1 + p) % p, s, 1));
  require_close(grad_of(x, y, data(r, s, 2)), data((r + 1) % p, s, 2));
}

TEST_CASE("a split size that does not divide is an error naming the group") {
  auto& w = world();
  if (w.size() == 1) return;
  Tensor x = Tensor::zeros({w.size() + 1, 2}, DType::kF64);
  REQUIRE_THROWS_WITH(parallel::scatter_to_group(x, w, 0),
                      Catch::Contains("does not divide by group"));
}
