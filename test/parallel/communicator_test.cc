// Tests of the MPI Communicator, run under mpirun with 2 and 4 ranks (and 1). Every rank fills
// its buffers with values that depend on (rank, index) through a formula every rank can
// evaluate, so each checks the collective's result on its own. Values are small integers,
// exact in every dtype, so sums and maxima compare exactly; avg compares within the dtype's
// rounding.
#include <atomic>
#include <catch2/catch.hpp>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <string>
#include <thread>
#include <vector>

#include "base/error.h"
#include "engine/tensor.h"
#include "parallel/comm/flight_recorder.h"
#include "parallel/comm/mpi_communicator.h"

namespace mammoth::parallel {
namespace {

using engine::Tensor;

MpiCommunicator& world() {
  // A short deadline: a test that leaves the ranks out of step aborts instead of hanging CI.
  static std::unique_ptr<MpiCommunicator> w = mpi_world(CommOptions{.timeout_s = 60});
  return *w;
}

const DType kReduceTypes[] = {DType::kF32, DType::kF64, DType::kBF16, DType::kF16,
                              DType::kI32, DType::kI64, DType::kU8};
const int64_t kSizes[] = {0, 1, 7, 1000, 65537};

// In 0..30: sums over up to 8 ranks fit u8 and are exact in bf16 (<= 256).
double value(int rank, int64_t i, DType dtype) {
  const double v = static_cast<double>((i * 7 + rank * 13 + 3) % 31);
  return dtype == DType::kBool ? std::fmod(v, 2.0) : v;
}

Tensor filled(int rank, int64_t n, DType dtype, int64_t index_offset = 0) {
  std::vector<double> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[i] = value(rank, i + index_offset, dtype);
  return Tensor::from_vector(v, {n}, dtype);
}

double reduce_expected(ReduceOp op, int64_t i, int size, DType dtype) {
  double sum = 0, mx = -1e30;
  for (int r = 0; r < size; ++r) {
    sum += value(r, i, dtype);
    mx = std::max(mx, value(r, i, dtype));
  }
  if (op == ReduceOp::kMax) return mx;
  if (op == ReduceOp::kAvg) return sum / size;
  return sum;
}

double tolerance(DType dtype, double v) {
  switch (dtype) {
    case DType::kBF16:
      return std::fabs(v) * 1.0 / 128 + 1e-6;
    case DType::kF16:
      return std::fabs(v) * 1.0 / 1024 + 1e-6;
    case DType::kF32:
      return std::fabs(v) * 1e-6 + 1e-9;
    default:
      return 1e-12;
  }
}

// Checks out[i] == expected(i) for every i; reports the first few mismatches with context.
template <typename Expected>
void check_values(const Tensor& out, Expected expected, const std::string& what) {
  const std::vector<double> got = out.to_vector();
  int bad = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double e = expected(static_cast<int64_t>(i));
    if (std::fabs(got[i] - e) > tolerance(out.dtype(), e)) {
      if (++bad <= 3) {
        FAIL_CHECK(what << " rank " << world().rank() << " index " << i << ": got " << got[i]
                        << ", expected " << e);
      }
    }
  }
  CHECK(bad == 0);
}

std::vector<ReduceOp> ops_for(DType dtype) {
  if (is_floating(dtype)) return {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kMax};
  return {ReduceOp::kSum, ReduceOp::kMax};
}

TEST_CASE("all_reduce sum/avg/max, in place and out of place, every reducible dtype") {
  MpiCommunicator& w = world();
  for (DType dtype : kReduceTypes) {
    for (int64_t n : kSizes) {
      for (ReduceOp op : ops_for(dtype)) {
        const std::string what = std::string("all_reduce ") + reduce_op_name(op) + " " +
                                 dtype_name(dtype) + " n=" + std::to_string(n);
        auto expected = [&](int64_t i) { return reduce_expected(op, i, w.size(), dtype); };
        Tensor t = filled(w.rank(), n, dtype);
        w.all_reduce(t, op);
        check_values(t, expected, what + " in place");

        Tensor in = filled(w.rank(), n, dtype);
        Tensor out = Tensor::zeros({n}, dtype);
        w.all_reduce(in, out, op);
        check_values(out, expected, what + " out of place");
        check_values(
            in, [&](int64_t i) { return value(w.rank(), i, dtype); }, what + " input untouched");
      }
    }
  }
}

TEST_CASE("waits on an oversubscribed machine: the load is seen, and collectives complete") {
  // More spinning threads than this process has cores: the running count must exceed them.
  const int cores = static_cast<int>(std::thread::hardware_concurrency());
  std::atomic<bool> stop{false};
  std::vector<std::thread> spinners;
  for (int i = 0; i < cores + 2; ++i) {
    spinners.emplace_back([&stop] {
      while (!stop.load(std::memory_order_relaxed)) {
      }
    });
  }
  bool seen = false;
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (!seen && std::chrono::steady_clock::now() < until) {
    seen = cores_oversubscribed();
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  CHECK(seen);
  // Waits now nap between polls once past a millisecond; the results must be unchanged.
  const int64_t n = 1 << 16;
  for (int round = 0; round < 2; ++round) {
    Tensor t = filled(world().rank(), n, DType::kF32);
    world().all_reduce(t, ReduceOp::kSum);
    check_values(
        t,
        [&](int64_t i) { return reduce_expected(ReduceOp::kSum, i, world().size(), DType::kF32); },
        "all_reduce beside spinning threads");
  }
  stop = true;
  for (std::thread& t : spinners) t.join();
}

TEST_CASE("reduce_scatter sum/avg/max, in place and out of place") {
  MpiCommunicator& w = world();
  const int s = w.size(), r = w.rank();
  for (DType dtype : kReduceTypes) {
    for (int64_t n : {int64_t{0}, int64_t{1}, int64_t{5}, int64_t{4099}}) {
      for (ReduceOp op : ops_for(dtype)) {
        const std::string what = std::string("reduce_scatter ") + reduce_op_name(op) + " " +
                                 dtype_name(dtype) + " shard=" + std::to_string(n);
        // Element j of my shard is element r*n + j of the full buffer.
        auto expected = [&](int64_t j) { return reduce_expected(op, r * n + j, s, dtype); };
        Tensor in = filled(r, n * s, dtype);
        Tensor out = Tensor::zeros({n}, dtype);
        w.reduce_scatter(in, out, op);
        check_values(out, expected, what + " out of place");

        Tensor buf = filled(r, n * s, dtype);
        Tensor shard = buf.slice(0, r * n, (r + 1) * n);
        w.reduce_scatter(buf, shard, op);
        check_values(shard, expected, what + " in place");
      }
    }
  }
}

TEST_CASE("all_gather, in place and out of place, every dtype") {
  MpiCommunicator& w = world();
  const int s = w.size(), r = w.rank();
  for (DType dtype : kAllDTypes) {
    for (int64_t n : kSizes) {
      const std::string what =
          std::string("all_gather ") + dtype_name(dtype) + " n=" + std::to_string(n);
      // Rank q's block holds value(q, j).
      auto expected = [&](int64_t i) { return value(static_cast<int>(i / n), i % n, dtype); };
      Tensor in = filled(r, n, dtype);
      Tensor out = Tensor::zeros({n * s}, dtype);
      w.all_gather(in, out);
      check_values(out, expected, what + " out of place");

      Tensor buf = Tensor::zeros({n * s}, dtype);
      Tensor mine = buf.slice(0, r * n, (r + 1) * n);
      if (n > 0) std::memcpy(mine.raw_data(), in.raw_data(), in.nbytes());
      w.all_gather(mine, buf);
      check_values(buf, expected, what + " in place");
    }
  }
}

TEST_CASE("several all_gathers in flight with point-to-point traffic between them") {
  // The MPI backend builds all_gather from point-to-point messages on kReservedTag: blocks of
  // consecutive gathers must not be mixed up, nor with user messages posted in between.
  MpiCommunicator& w = world();
  const int s = w.size(), r = w.rank();
  constexpr int kGathers = 3;
  constexpr int64_t n = 1000;
  std::vector<Tensor> ins, outs;
  std::vector<std::unique_ptr<Work>> works;
  const int next = (r + 1) % s, prev = (r - 1 + s) % s;
  Tensor sent = filled(r, 7, DType::kF32), got = Tensor::zeros({7}, DType::kF32);
  auto recv = w.irecv(got, prev, 5);
  for (int g = 0; g < kGathers; ++g) {
    ins.push_back(filled(r + 10 * g, n, DType::kF32));
    outs.push_back(Tensor::zeros({n * s}, DType::kF32));
    works.push_back(w.iall_gather(ins.back(), outs.back()));
    if (g == 0) works.push_back(w.isend(sent, next, 5));
  }
  for (int g = kGathers - 1; g >= 0; --g) works[g]->wait();  // waited out of order
  for (auto& work : works) work->wait();
  recv->wait();
  for (int g = 0; g < kGathers; ++g) {
    check_values(
        outs[g],
        [&](int64_t i) { return value(static_cast<int>(i / n) + 10 * g, i % n, DType::kF32); },
        "gather " + std::to_string(g));
  }
  check_values(
      got, [&](int64_t i) { return value(prev, i, DType::kF32); }, "user message");
}

TEST_CASE("broadcast from every root, every dtype") {
  MpiCommunicator& w = world();
  for (DType dtype : kAllDTypes) {
    for (int64_t n : {int64_t{0}, int64_t{3}, int64_t{1001}}) {
      for (int root = 0; root < w.size(); ++root) {
        const std::string what = std::string("broadcast ") + dtype_name(dtype) +
                                 " n=" + std::to_string(n) + " root=" + std::to_string(root);
        auto expected = [&](int64_t i) { return value(root, i, dtype); };
        Tensor t = filled(w.rank(), n, dtype);
        w.broadcast(t, root);
        check_values(t, expected, what + " in place");

        Tensor in = filled(w.rank(), n, dtype);
        Tensor out = Tensor::zeros({n}, dtype);
        w.broadcast(in, out, root);
        check_values(out, expected, what + " out of place");
      }
    }
  }
}

TEST_CASE("all_to_all, in place and out of place, every dtype") {
  MpiCommunicator& w = world();
  const int s = w.size(), r = w.rank();
  for (DType dtype : kAllDTypes) {
    for (int64_t n : {int64_t{0}, int64_t{1}, int64_t{3}, int64_t{2049}}) {
      const std::string what =
          std::string("all_to_all ") + dtype_name(dtype) + " block=" + std::to_string(n);
      // My block j is addressed to rank j: value(my rank, j*n + k). I receive block i from rank
      // i, which it filled with value(i, r*n + k).
      auto expected = [&](int64_t idx) {
        const int64_t i = idx / n, k = idx % n;
        return value(static_cast<int>(i), r * n + k, dtype);
      };
      Tensor in = filled(r, n * s, dtype);
      Tensor out = Tensor::zeros({n * s}, dtype);
      w.all_to_all(in, out);
      check_values(out, expected, what + " out of place");

      Tensor buf = filled(r, n * s, dtype);
      w.all_to_all(buf, buf);
      check_values(buf, expected, what + " in place");
    }
  }
}

// Elements rank `src` sends to rank `dst` in pattern `p`: 0 has zeros scattered over the pairs,
// 1 has the last rank send nothing at all (it still receives), 2 is all zeros everywhere.
int64_t v_count(int p, int src, int dst, int size) {
  if (p == 2) return 0;
  if (p == 1 && src == size - 1) return 0;
  return (src * 3 + dst * 5 + p) % 4 * (1 + src);
}

TEST_CASE("all_to_all_v with per-peer counts, zeros, and a rank that sends nothing") {
  MpiCommunicator& w = world();
  const int s = w.size(), r = w.rank();
  for (DType dtype : kAllDTypes) {
    for (int p : {0, 1, 2}) {
      const std::string what =
          std::string("all_to_all_v ") + dtype_name(dtype) + " pattern " + std::to_string(p);
      // Block src->dst holds value(src, dst * 1000 + k) for its k-th element.
      std::vector<int64_t> send_counts(s), recv_counts(s);
      std::vector<double> send;
      for (int dst = 0; dst < s; ++dst) {
        send_counts[dst] = v_count(p, r, dst, s);
        for (int64_t k = 0; k < send_counts[dst]; ++k)
          send.push_back(value(r, dst * 1000 + k, dtype));
      }
      std::vector<double> expect;
      for (int src = 0; src < s; ++src) {
        recv_counts[src] = v_count(p, src, r, s);
        for (int64_t k = 0; k < recv_counts[src]; ++k)
          expect.push_back(value(src, r * 1000 + k, dtype));
      }
      const auto n_send = static_cast<int64_t>(send.size());
      const auto n_recv = static_cast<int64_t>(expect.size());
      Tensor in = Tensor::from_vector(send, {n_send}, dtype);
      Tensor out = Tensor::full({n_recv}, 99.0, dtype);
      w.all_to_all_v(in, send_counts, out, recv_counts);
      check_values(
          out, [&](int64_t i) { return expect[static_cast<size_t>(i)]; }, what);
      // Recorded like every collective (flight recorder, and the profiler from it).
      CHECK_THAT(flight::tail_text(1), Catch::Contains("all_to_all_v("));
      // The async form, two in flight at once with the counts reversed in the second.
      Tensor out2 = Tensor::full({n_send}, 99.0, dtype);
      Tensor in2 = Tensor::from_vector(expect, {n_recv}, dtype);
      Tensor out1 = Tensor::full({n_recv}, 99.0, dtype);
      auto a = w.iall_to_all_v(in, send_counts, out1, recv_counts);
      auto b = w.iall_to_all_v(in2, recv_counts, out2, send_counts);
      b->wait();
      a->wait();
      check_values(
          out1, [&](int64_t i) { return expect[static_cast<size_t>(i)]; }, what + " async");
      // Sending back what was received returns each rank its own buffer.
      check_values(
          out2, [&](int64_t i) { return send[static_cast<size_t>(i)]; }, what + " round trip");
    }
  }
}

TEST_CASE("send/recv around a ring with tags, and async handles") {
  MpiCommunicator& w = world();
  const int s = w.size(), r = w.rank();
  const int next = (r + 1) % s, prev = (r + s - 1) % s;
  for (DType dtype : {DType::kF32, DType::kI64, DType::kBF16}) {
    for (int64_t n : {int64_t{0}, int64_t{1}, int64_t{777}}) {
      // Two messages with different tags, posted in the opposite order on the receiver.
      Tensor a = filled(r, n, dtype, 0), b = filled(r, n, dtype, 100);
      Tensor ra = Tensor::zeros({n}, dtype), rb = Tensor::zeros({n}, dtype);
      auto recv_b = w.irecv(rb, prev, 2);
      auto recv_a = w.irecv(ra, prev, 1);
      auto send_a = w.isend(a, next, 1);
      auto send_b = w.isend(b, next, 2);
      recv_a->wait();
      recv_b->wait();
      send_a->wait();
      send_b->wait();
      CHECK(recv_a->test());
      recv_a->wait();  // idempotent
      const std::string what = std::string("ring ") + dtype_name(dtype) + " n=" + std::to_string(n);
      check_values(
          ra, [&](int64_t i) { return value(prev, i, dtype); }, what + " tag 1");
      check_values(
          rb, [&](int64_t i) { return value(prev, i + 100, dtype); }, what + " tag 2");
    }
  }
}

TEST_CASE("several async all_reduces in flight complete independently") {
  MpiCommunicator& w = world();
  std::vector<Tensor> bufs;
  std::vector<std::unique_ptr<Work>> works;
  for (int k = 0; k < 6; ++k) {
    bufs.push_back(filled(w.rank(), 10000 + k, DType::kF32, k));
    works.push_back(w.iall_reduce(bufs.back(), bufs.back(), ReduceOp::kSum));
  }
  // Complete them out of order, partly by test() polling.
  for (int k = 5; k >= 0; --k) {
    if (k % 2 == 0) {
      while (!works[k]->test()) {
      }
    } else {
      works[k]->wait();
    }
    check_values(
        bufs[k],
        [&](int64_t i) { return reduce_expected(ReduceOp::kSum, i + k, w.size(), DType::kF32); },
        "async #" + std::to_string(k));
  }
  // A Work destroyed unfinished waits for its operation.
  Tensor t = filled(w.rank(), 50000, DType::kF64);
  w.iall_reduce(t, t, ReduceOp::kMax).reset();
  check_values(
      t, [&](int64_t i) { return reduce_expected(ReduceOp::kMax, i, w.size(), DType::kF64); },
      "destroyed unfinished");
  w.barrier();
}

TEST_CASE("split into sub-communicators by color and key") {
  MpiCommunicator& w = world();
  const int s = w.size(), r = w.rank();
  // Even and odd ranks, each ordered by descending world rank (key = -rank).
  const int color = r % 2;
  auto sub = w.split(color, -r, "parity" + std::to_string(color));
  REQUIRE(sub != nullptr);
  std::vector<int> members;
  for (int q = s - 1; q >= 0; --q) {
    if (q % 2 == color) members.push_back(q);
  }
  CHECK(sub->size() == static_cast<int>(members.size()));
  const int expected_rank =
      static_cast<int>(std::find(members.begin(), members.end(), r) - members.begin());
  CHECK(sub->rank() == expected_rank);
  CHECK(sub->name() == "parity" + std::to_string(color));
  CHECK(std::string(sub->backend()) == "mpi");

  // all_gather of world ranks over the sub-group lists its members in sub-rank order.
  Tensor mine = Tensor::from_ints({r}, {1}, DType::kI32);
  Tensor all = Tensor::zeros({sub->size()}, DType::kI32);
  sub->all_gather(mine, all);
  std::vector<int64_t> got = all.to_int_vector();
  CHECK(got == std::vector<int64_t>(members.begin(), members.end()));

  // A sub-group's all_reduce involves only its members.
  Tensor x = Tensor::from_vector({static_cast<double>(r + 1)}, {1}, DType::kF64);
  sub->all_reduce(x, ReduceOp::kSum);
  double sum = 0;
  for (int q : members) sum += q + 1;
  CHECK(x.item() == sum);

  // Splits of splits, and ranks that opt out (color < 0) get no communicator.
  auto firsts = sub->split(sub->rank() == 0 ? 0 : -1, 0, "first");
  CHECK((firsts != nullptr) == (sub->rank() == 0));
  if (firsts) CHECK(firsts->size() == 1);
  w.barrier();
}

TEST_CASE("bad arguments throw naming the operation and group, before any communication") {
  MpiCommunicator& w = world();
  auto message = [](auto fn) {
    try {
      fn();
    } catch (const Error& e) {
      return e.message();
    }
    return std::string("no error");
  };
  Tensor f = Tensor::zeros({4 * w.size()}, DType::kF32);
  Tensor d = Tensor::zeros({4 * w.size()}, DType::kF64);
  Tensor i = Tensor::zeros({4}, DType::kI32);
  Tensor b = Tensor::zeros({4}, DType::kBool);
  CHECK_THAT(message([&] { w.all_reduce(f, d); }),
             Catch::Contains("[all_reduce] group 'world' (mpi)") && Catch::Contains("f64"));
  CHECK_THAT(message([&] { w.all_reduce(i, ReduceOp::kAvg); }),
             Catch::Contains("avg needs a floating dtype"));
  CHECK_THAT(message([&] { w.all_reduce(b, ReduceOp::kSum); }), Catch::Contains("bool"));
  Tensor m = Tensor::zeros({4, 6}, DType::kF32).transpose(0, 1);
  CHECK_THAT(message([&] { w.all_reduce(m); }), Catch::Contains("must be contiguous"));
  CHECK_THAT(message([&] { w.reduce_scatter(f, f.slice(0, 0, 3)); }),
             Catch::Contains("[reduce_scatter]"));
  if (w.size() > 1) {
    CHECK_THAT(message([&] { w.all_gather(f, f); }), Catch::Contains("[all_gather]"));
  }
  CHECK_THAT(message([&] { w.send(f, w.size()); }),
             Catch::Contains("peer " + std::to_string(w.size())));
  CHECK_THAT(message([&] { w.send(f, 0, kReservedTag); }),
             Catch::Contains("[send]") && Catch::Contains("reserved"));
  CHECK_THAT(message([&] { w.irecv(f, 0, -1); }), Catch::Contains("[recv]"));
  CHECK_THAT(message([&] { w.broadcast(f, -1); }), Catch::Contains("root -1"));
  CHECK_THAT(message([&] { w.all_to_all(Tensor::zeros({4 * w.size() + 1}), f); }),
             Catch::Contains("[all_to_all]"));
  {
    std::vector<int64_t> fours(w.size(), 4), short_counts(w.size() + 1, 0);
    Tensor g = Tensor::zeros({4 * w.size()}, DType::kF32);
    CHECK_THAT(message([&] { w.all_to_all_v(f, fours, g, short_counts); }),
               Catch::Contains("[all_to_all_v]") && Catch::Contains("recv_counts has"));
    std::vector<int64_t> negative = fours;
    negative[0] = -1;
    CHECK_THAT(message([&] { w.all_to_all_v(f, negative, g, fours); }),
               Catch::Contains("send_counts[0] is -1"));
    std::vector<int64_t> bigger = fours;
    bigger[0] = 5;
    CHECK_THAT(message([&] { w.all_to_all_v(f, bigger, g, fours); }),
               Catch::Contains("send_counts sum to"));
    CHECK_THAT(message([&] { w.all_to_all_v(f, fours, f, fours); }),
               Catch::Contains("no in-place form"));
  }
  w.barrier();
}

}  // namespace
}  // namespace mammoth::parallel
