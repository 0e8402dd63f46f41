// Tests of DeviceMesh under mpirun (1, 2 and 4 ranks): every factorisation of the world and
// several orders, checked against the mixed-radix rank formula written out here again, and by
// gathering world ranks over each group.
#include "parallel/mesh.h"

#include <catch2/catch.hpp>
#include <cstdlib>
#include <string>
#include <vector>

#include "base/error.h"
#include "engine/tensor.h"

namespace mammoth::parallel {
namespace {

using engine::Tensor;

std::shared_ptr<MpiCommunicator> world() {
  static std::shared_ptr<MpiCommunicator> w = mpi_world(CommOptions{.timeout_s = 60});
  return w;
}

// Every (dp, pp, tp, sp) whose product is n.
std::vector<MeshShape> factorisations(int n) {
  std::vector<MeshShape> out;
  for (int dp = 1; dp <= n; ++dp)
    for (int pp = 1; pp <= n; ++pp)
      for (int tp = 1; tp <= n; ++tp)
        for (int sp = 1; sp <= n; ++sp)
          if (dp * pp * tp * sp == n) out.push_back({dp, pp, tp, sp});
  return out;
}

// Independent restatement of the formula in mesh.h: the order's first axis is the least
// significant digit of the rank.
std::vector<int> group_by_formula(const MeshShape& shape, const std::vector<Axis>& order, int rank,
                                  Axis axis) {
  // Digits of `rank` in the mixed radix given by the order.
  std::vector<int> digits;
  int rest = rank;
  for (Axis a : order) {
    digits.push_back(rest % shape.size(a));
    rest /= shape.size(a);
  }
  std::vector<int> members;
  for (int c = 0; c < shape.size(axis); ++c) {
    int value = 0, weight = 1;
    for (size_t k = 0; k < order.size(); ++k) {
      value += (order[k] == axis ? c : digits[k]) * weight;
      weight *= shape.size(order[k]);
    }
    members.push_back(value);
  }
  return members;
}

std::vector<Axis> parse_order(const std::string& s) {
  std::vector<Axis> order;
  for (size_t i = 0; i < s.size(); i += 3) order.push_back(axis_from_name(s.substr(i, 2)));
  return order;
}

TEST_CASE("every factorisation of the world in several orders matches the rank formula") {
  auto w = world();
  const int n = w->size(), r = w->rank();
  for (const std::string order : {"tp-sp-dp-pp", "dp-tp-pp-sp", "pp-dp-sp-tp", "sp-pp-tp-dp"}) {
    const std::vector<Axis> axes = parse_order(order);
    for (const MeshShape& shape : factorisations(n)) {
      INFO("world " << n << " rank " << r << " " << shape.str() << " order " << order);
      DeviceMesh mesh(w, shape, MeshOptions{.order = order});
      CHECK(mesh.layout().order() == order);
      CHECK(mesh.rank() == r);
      CHECK(mesh.world_size() == n);
      std::array<int, kNumAxes> coords{};
      for (Axis a : kAllAxes) {
        const std::vector<int> members = group_by_formula(shape, axes, r, a);
        const int c = mesh.coord(a);
        coords[static_cast<int>(a)] = c;
        // This rank sits at its coordinate within its group.
        CHECK(members[c] == r);
        CHECK(mesh.layout().group_ranks(r, a) == members);
        Communicator& g = mesh.group(a);
        CHECK(g.size() == shape.size(a));
        CHECK(g.rank() == c);
        CHECK(g.name() == axis_name(a));
        // The group really contains those world ranks, in coordinate order.
        Tensor mine = Tensor::from_ints({r}, {1}, DType::kI64);
        Tensor all = Tensor::zeros({g.size()}, DType::kI64);
        g.all_gather(mine, all);
        const std::vector<int64_t> got = all.to_int_vector();
        CHECK(got == std::vector<int64_t>(members.begin(), members.end()));
      }
      CHECK(mesh.layout().rank_of(coords) == r);
    }
  }
}

TEST_CASE("dp2 x tp2 on four ranks: the worked example of mesh.h") {
  auto w = world();
  if (w->size() != 4) return;
  DeviceMesh mesh(w, MeshShape{.dp = 2, .tp = 2});
  const int r = w->rank();
  // order tp-sp-dp-pp: tp groups {0,1} {2,3}; dp groups {0,2} {1,3}.
  CHECK(mesh.coord(Axis::kTp) == r % 2);
  CHECK(mesh.coord(Axis::kDp) == r / 2);
  CHECK(mesh.layout().group_ranks(r, Axis::kTp) == std::vector<int>{r / 2 * 2, r / 2 * 2 + 1});
  CHECK(mesh.layout().group_ranks(r, Axis::kDp) == std::vector<int>{r % 2, r % 2 + 2});
  CHECK(mesh.size(Axis::kPp) == 1);
  CHECK(mesh.group(Axis::kPp).size() == 1);
  // A dp all-reduce sums over the two ranks with the same tp coordinate.
  Tensor x = Tensor::from_vector({static_cast<double>(r)}, {1}, DType::kF32);
  mesh.group(Axis::kDp).all_reduce(x, ReduceOp::kSum);
  CHECK(x.item() == (r % 2) + (r % 2 + 2));
  CHECK_THAT(mesh.describe(), Catch::Contains("dp " + std::to_string(r / 2) + "/2"));
}

TEST_CASE("sizes whose product is not the world size are an error naming the sizes") {
  auto w = world();
  const int n = w->size();
  try {
    DeviceMesh mesh(w, MeshShape{.dp = n + 1});
    FAIL("expected an error");
  } catch (const Error& e) {
    CHECK_THAT(e.message(), Catch::Contains("dp=" + std::to_string(n + 1)) &&
                                Catch::Contains("pp=1 tp=1 sp=1") &&
                                Catch::Contains(std::to_string(n) + " ranks"));
  }
  CHECK_THROWS_WITH(MeshLayout(MeshShape{.dp = 0}, "tp-sp-dp-pp", 1),
                    Catch::Contains("dp has size 0"));
  CHECK_THROWS_WITH(MeshLayout(MeshShape{}, "tp-xx-dp", 1), Catch::Contains("unknown axis 'xx'"));
  CHECK_THROWS_WITH(MeshLayout(MeshShape{}, "tp-tp", 1), Catch::Contains("names tp twice"));
  CHECK_THROWS_WITH(MeshLayout(MeshShape{.pp = 2}, "tp-dp", 2), Catch::Contains("leaves out pp"));
  // Axes of size 1 may be left out of the order.
  CHECK(MeshLayout(MeshShape{.dp = 2}, "dp", 2).order() == "dp-tp-sp-pp");
  w->barrier();
}

TEST_CASE("process_info agrees with Open MPI's environment and with MPI") {
  const ProcessInfo info = process_info();
  auto w = world();
  CHECK(info.rank == mpi_runtime().world_rank());
  CHECK(info.world_size == mpi_runtime().world_size());
  CHECK(info.rank == w->rank());
  if (const char* v = std::getenv("OMPI_COMM_WORLD_LOCAL_RANK")) {
    CHECK(info.local_rank == std::atoi(v));
  }
  // All ranks of these tests run on one host: local ranks are the world ranks.
  CHECK(info.local_rank == info.rank);
}

}  // namespace
}  // namespace mammoth::parallel
