#include "serve/tp.h"

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <thread>

#include "base/error.h"
#include "engine/autograd.h"
#include "models/layers.h"
#include "parallel/comm/mpi_communicator.h"

namespace mammoth::serve {

using engine::Tensor;

namespace {

// The message rank 0 broadcasts: a header i64 [4] = {kind, N, S, B}, then for a step a payload
// i64 [N + 3 S + B] = the N token ids, (start, count, blocks) of each of the S sequences, and
// their B block ids, table after table.
enum Kind : int64_t { kStep = 1, kIdle = 2, kStop = 3 };
constexpr int64_t kHeader = 4;

void send_header(parallel::Communicator& group, int64_t kind, int64_t n = 0, int64_t s = 0,
                 int64_t b = 0) {
  Tensor header = Tensor::from_ints({kind, n, s, b}, {kHeader});
  group.broadcast(header, 0);
}

// Waits for `work` without spinning (a follower idles here between requests, beside rank 0's
// busy threads on the same machine); past the group's timeout the job is aborted naming it.
void wait_quietly(parallel::Work& work, const parallel::Communicator& group) {
  using Clock = std::chrono::steady_clock;
  const double limit = group.options().timeout_s;
  const Clock::time_point start = Clock::now();
  while (!work.test()) {
    std::this_thread::sleep_for(std::chrono::microseconds(200));
    if (limit > 0 && std::chrono::duration<double>(Clock::now() - start).count() > limit) {
      parallel::abort_job_on_timeout("[serve] rank " + std::to_string(group.rank()) + " of " +
                                     group.name() + ": no step or heartbeat from rank 0 for " +
                                     std::to_string(limit) + " s (--comm-timeout)");
    }
  }
}

}  // namespace

TpLeader::TpLeader(parallel::Communicator& group) : group_(group) {
  MAMMOTH_CHECK(group_.rank() == 0)
      << "[serve] the tensor-parallel leader is tp rank 0, not " << group_.rank();
}

void TpLeader::before_step(const std::vector<int64_t>& ids,
                           const std::vector<models::PagedSequence>& seqs) {
  std::vector<int64_t> payload(ids);
  int64_t blocks = 0;
  for (const models::PagedSequence& s : seqs) {
    payload.insert(payload.end(), {s.start, s.count, static_cast<int64_t>(s.blocks->size())});
    blocks += static_cast<int64_t>(s.blocks->size());
  }
  for (const models::PagedSequence& s : seqs) {
    payload.insert(payload.end(), s.blocks->begin(), s.blocks->end());
  }
  send_header(group_, kStep, static_cast<int64_t>(ids.size()), static_cast<int64_t>(seqs.size()),
              blocks);
  Tensor body = Tensor::from_ints(payload, {static_cast<int64_t>(payload.size())});
  group_.broadcast(body, 0);
}

void TpLeader::idle() { send_header(group_, kIdle); }

void TpLeader::stopped() {
  if (stopped_) return;
  stopped_ = true;
  send_header(group_, kStop);
}

void TpLeader::step_failed(const std::string& what) {
  std::fprintf(stderr,
               "[serve] rank 0: a tensor-parallel step failed (%s); ending every rank, since the "
               "others may wait inside its collectives\n",
               what.c_str());
  std::fflush(stderr);
  parallel::abort_job_if_distributed(1);
  std::abort();
}

FollowStats follow_steps(models::LanguageModel& model, models::PagedKVCache* cache,
                         parallel::Communicator& group) {
  MAMMOTH_CHECK(group.rank() != 0) << "[serve] tp rank 0 leads; it does not follow";
  MAMMOTH_CHECK(cache != nullptr) << "[serve] follow_steps needs a KV cache";
  model.eval();
  const Device device = models::module_device(model);
  FollowStats stats;
  while (true) {
    Tensor header = Tensor::zeros({kHeader}, DType::kI64);
    wait_quietly(*group.ibroadcast(header, header, 0), group);
    const std::vector<int64_t> h = header.to_int_vector();
    if (h[0] == kStop) return stats;
    if (h[0] == kIdle) {
      ++stats.heartbeats;
      continue;
    }
    const int64_t n = h[1], s = h[2], b = h[3];
    MAMMOTH_CHECK(h[0] == kStep && n > 0 && s > 0 && b >= s)
        << "[serve] rank " << group.rank() << ": malformed step header {" << h[0] << ", " << n
        << ", " << s << ", " << b << "} from rank 0";
    Tensor body = Tensor::zeros({n + 3 * s + b}, DType::kI64);
    group.broadcast(body, 0);
    const std::vector<int64_t> p = body.to_int_vector();
    std::vector<std::vector<int64_t>> tables(static_cast<size_t>(s));
    std::vector<models::PagedSequence> seqs(static_cast<size_t>(s));
    int64_t at = n + 3 * s, count = 0;
    for (int64_t i = 0; i < s; ++i) {
      const int64_t start = p[n + 3 * i], len = p[n + 3 * i + 1], nb = p[n + 3 * i + 2];
      MAMMOTH_CHECK(nb >= 0 && at + nb <= n + 3 * s + b)
          << "[serve] rank " << group.rank() << ": malformed block table in a step from rank 0";
      tables[i].assign(p.begin() + at, p.begin() + at + nb);
      at += nb;
      seqs[i] = {.blocks = &tables[i], .start = start, .count = len};
      count += len;
    }
    MAMMOTH_CHECK(count == n && at == n + 3 * s + b)
        << "[serve] rank " << group.rank() << ": a step from rank 0 has " << n
        << " tokens but its sequences count " << count;
    engine::NoGradGuard ng;
    const std::vector<int64_t> ids(p.begin(), p.begin() + n);
    model.forward_paged(Tensor::from_ints(ids, {n}).to(device), seqs, cache);
    ++stats.steps;
    stats.tokens += n;
  }
}

}  // namespace mammoth::serve
