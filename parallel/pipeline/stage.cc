#include "parallel/pipeline/stage.h"

#include <cmath>
#include <cstdio>
#include <optional>

#include "base/error.h"
#include "base/fault.h"
#include "engine/autograd.h"
#include "engine/ops.h"
#include "engine/profile/profile.h"

namespace mammoth::parallel::pipeline {

using engine::Shape;
using engine::Tensor;

namespace {

constexpr int kActivation = 0;  // direction: stage s -> s + 1
constexpr int kGradient = 1;    // direction: stage s + 1 -> s (gradient of s's output)
constexpr int kMaxDims = 8;
constexpr size_t kLookahead = 3;  // actions whose receives are posted ahead

}  // namespace

PipelineStage::PipelineStage(Schedule schedule, std::vector<StageChunk> chunks, Communicator& pp)
    : schedule_(std::move(schedule)), chunks_(std::move(chunks)), pp_(pp), rank_(pp.rank()) {
  MAMMOTH_CHECK(schedule_.stages == pp_.size())
      << "[PipelineStage] schedule has " << schedule_.stages << " stages but the pp group '"
      << pp_.name() << "' has " << pp_.size() << " ranks";
  MAMMOTH_CHECK(static_cast<int>(chunks_.size()) == schedule_.virtual_stages)
      << "[PipelineStage] rank " << rank_ << " has " << chunks_.size() << " chunks, schedule "
      << schedule_.name << " needs " << schedule_.virtual_stages;
  const CheckResult check = check_schedule(schedule_);
  MAMMOTH_CHECK(check.ok) << "[PipelineStage] schedule " << schedule_.name
                          << " is invalid: " << check.error;
  // Tags: 2 directions x S boundaries x m micro-batches, then S shape headers. MPI guarantees
  // tags up to 32767.
  const int64_t tags =
      static_cast<int64_t>(3) * schedule_.num_virtual_stages() * schedule_.micro_batches;
  MAMMOTH_CHECK(tags <= 32767) << "[PipelineStage] " << schedule_.micro_batches
                               << " micro-batches x " << schedule_.num_virtual_stages()
                               << " virtual stages need more message tags than MPI guarantees";
}

PipelineStage::~PipelineStage() = default;

int PipelineStage::tag(int direction, int boundary, int micro_batch) const {
  return (direction * schedule_.num_virtual_stages() + boundary) * schedule_.micro_batches +
         micro_batch;
}

// Posts the receive an action will need, when its shape is known; true if one is posted.
bool PipelineStage::try_post(const Action& a) {
  const int s = schedule_.virtual_stage(rank_, a.chunk);
  const int S = schedule_.num_virtual_stages();
  Key key;
  int peer;
  Shape shape;
  if (a.type == ActionType::kForward && s > 0) {
    auto it = shapes_.find(s - 1);
    if (it == shapes_.end()) return false;
    key = {kActivation, s - 1, a.micro_batch};
    peer = schedule_.rank_of(s - 1);
    shape = it->second;
  } else if (a.type == ActionType::kBackward && s + 1 < S) {
    auto it = stored_.find({a.micro_batch, a.chunk});
    if (it == stored_.end()) return false;
    key = {kGradient, s, a.micro_batch};
    peer = schedule_.rank_of(s + 1);
    shape = it->second.output.shape();
  } else {
    return false;
  }
  if (posted_.count(key)) return false;
  Posted p;
  p.buffer = Tensor::empty(shape);
  p.work = pp_.irecv(p.buffer, peer, tag(std::get<0>(key), std::get<1>(key), a.micro_batch));
  posted_.emplace(key, std::move(p));
  return true;
}

void PipelineStage::post_ahead(size_t from) {
  const auto& list = schedule_.ranks[rank_];
  for (size_t i = from; i < list.size() && i < from + kLookahead; ++i) try_post(list[i]);
}

Tensor PipelineStage::take(int direction, int boundary, int micro_batch, int peer,
                           const Shape& shape) {
  const Key key{direction, boundary, micro_batch};
  auto it = posted_.find(key);
  Tensor buffer;
  if (it != posted_.end()) {
    it->second.work->wait();
    buffer = it->second.buffer;
    posted_.erase(it);
  } else {
    buffer = Tensor::empty(shape);
    pp_.recv(buffer, peer, tag(direction, boundary, micro_batch));
  }
  ++stats_.received;
  return buffer;
}

void PipelineStage::send(const Tensor& t, int direction, int boundary, int micro_batch, int peer) {
  fault::point("send");
  Tensor c = t.detach().contiguous();
  if (direction == kActivation) {
    auto it = shapes_.find(boundary);
    if (it == shapes_.end()) {
      // First activation over this boundary: its shape goes first.
      MAMMOTH_CHECK(c.dim() <= kMaxDims)
          << "[PipelineStage] activation of " << c.dim() << " dimensions; at most " << kMaxDims;
      std::vector<int64_t> header(kMaxDims + 1, 0);
      header[0] = c.dim();
      for (int64_t d = 0; d < c.dim(); ++d) header[d + 1] = c.size(d);
      Tensor h = Tensor::from_ints(header, {kMaxDims + 1});
      const int header_tag =
          2 * schedule_.num_virtual_stages() * schedule_.micro_batches + boundary;
      sends_.emplace_back(h, pp_.isend(h, peer, header_tag));
      shapes_[boundary] = c.shape();
    } else {
      MAMMOTH_CHECK(it->second == c.shape())
          << "[PipelineStage] activation of virtual stage " << boundary << " micro-batch "
          << micro_batch << " has shape " << engine::shape_str(c.shape()) << ", but "
          << engine::shape_str(it->second) << " was exchanged; all micro-batches must match";
    }
  }
  sends_.emplace_back(c, pp_.isend(c, peer, tag(direction, boundary, micro_batch)));
  ++stats_.sent;
}

void PipelineStage::forward(const Action& a) {
  const int s = schedule_.virtual_stage(rank_, a.chunk);
  const int S = schedule_.num_virtual_stages();
  Tensor input;
  if (s > 0) {
    const int peer = schedule_.rank_of(s - 1);
    if (!shapes_.count(s - 1)) {
      Tensor h = Tensor::empty({kMaxDims + 1}, DType::kI64);
      pp_.recv(h, peer, 2 * S * schedule_.micro_batches + s - 1);
      const std::vector<int64_t> header = h.to_int_vector();
      shapes_[s - 1] = Shape(header.begin() + 1, header.begin() + 1 + header[0]);
    }
    input = take(kActivation, s - 1, a.micro_batch, peer, shapes_[s - 1]);
    input.requires_grad_(true);
  }
  Tensor out = chunks_[a.chunk].forward(input, a.micro_batch);
  if (s == S - 1) {
    MAMMOTH_CHECK(out.numel() == 1) << "[PipelineStage] the last stage must return a scalar "
                                       "loss, got "
                                    << engine::shape_str(out.shape());
    loss_ += out.item();
  } else {
    send(out, kActivation, s, a.micro_batch, schedule_.rank_of(s + 1));
  }
  stored_[{a.micro_batch, a.chunk}] = {input, out};
  stats_.stored = static_cast<int>(stored_.size());
  stats_.peak_stored = std::max(stats_.peak_stored, stats_.stored);
}

void PipelineStage::backward(const Action& a) {
  const int s = schedule_.virtual_stage(rank_, a.chunk);
  const int S = schedule_.num_virtual_stages();
  auto it = stored_.find({a.micro_batch, a.chunk});
  MAMMOTH_CHECK(it != stored_.end())
      << "[PipelineStage] backward of micro-batch " << a.micro_batch << " chunk " << a.chunk
      << " before its forward on rank " << rank_;
  Stored st = std::move(it->second);
  stored_.erase(it);
  stats_.stored = static_cast<int>(stored_.size());
  // Split backward: the weight-gradient GEMMs of this backward wait in a queue for W, so the
  // input gradient reaches the previous stage sooner (what zero-bubble schedules rely on).
  fault::point("backward");  // the pipeline's equivalent of a bucket reduction: its gradients
  engine::WeightGradQueue queue;
  {
    std::optional<engine::DeferWeightGradsGuard> defer;
    if (schedule_.split_backward) defer.emplace(&queue);
    if (s == S - 1) {
      st.output.backward();
    } else {
      Tensor g = take(kGradient, s, a.micro_batch, schedule_.rank_of(s + 1), st.output.shape());
      st.output.backward(g);
    }
  }
  if (s > 0) {
    Tensor g = st.input.grad();
    MAMMOTH_CHECK(g.defined()) << "[PipelineStage] virtual stage " << s
                               << "'s output does not depend on its input";
    send(g, kGradient, s - 1, a.micro_batch, schedule_.rank_of(s - 1));
  }
  if (schedule_.split_backward) {
    stats_.deferred_weight_grads += static_cast<int64_t>(queue.size());
    deferred_[{a.micro_batch, a.chunk}] = std::move(queue);
  }
}

void PipelineStage::weight(const Action& a) {
  auto it = deferred_.find({a.micro_batch, a.chunk});
  MAMMOTH_CHECK(it != deferred_.end()) << "[PipelineStage] W of micro-batch " << a.micro_batch
                                       << " chunk " << a.chunk << " before its B";
  it->second.run();
  deferred_.erase(it);
}

double PipelineStage::run() {
  loss_ = 0;
  stats_.sent = stats_.received = 0;
  const auto& list = schedule_.ranks[rank_];
  for (size_t i = 0; i < list.size(); ++i) {
    post_ahead(i);
    const Action& a = list[i];
    static constexpr const char* kActionNames[] = {"forward", "backward", "weight"};
    profile::Scope scope(profile::Lane::kPipeline, kActionNames[static_cast<int>(a.type)]);
    if (scope.active())
      std::snprintf(scope.args(), profile::Scope::kArgs,
                    "\"micro_batch\":%d,\"chunk\":%d,\"stage\":%d", a.micro_batch, a.chunk, rank_);
    switch (a.type) {
      case ActionType::kForward:
        forward(a);
        break;
      case ActionType::kBackward:
        backward(a);
        break;
      case ActionType::kWeight:
        weight(a);
        break;
    }
  }
  for (auto& [t, w] : sends_) w->wait();
  sends_.clear();
  MAMMOTH_CHECK(posted_.empty() && stored_.empty() && deferred_.empty())
      << "[PipelineStage] rank " << rank_ << " ended a step with " << posted_.size()
      << " receives, " << stored_.size() << " activations and " << deferred_.size()
      << " weight gradients left over";
  return loss_;
}

}  // namespace mammoth::parallel::pipeline
