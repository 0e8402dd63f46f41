#include "parallel/pipeline/stage.h"

#include <cmath>

#include "base/error.h"
#include "engine/autograd.h"
#include "engine/ops.h"
#include "models/gpt2/gpt2.h"
#include "models/layers.h"

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
  const auto& params = chunks_[a.chunk].params;
  std::vector<Tensor> saved;
  if (schedule_.split_backward) {
    // Set the accumulated gradients aside so this backward's weight gradients can be
    // deferred to W.
    for (const auto& [name, p] : params) {
      saved.push_back(p.grad());
      p.zero_grad();
    }
  }
  if (s == S - 1) {
    st.output.backward();
  } else {
    Tensor g = take(kGradient, s, a.micro_batch, schedule_.rank_of(s + 1), st.output.shape());
    st.output.backward(g);
  }
  if (s > 0) {
    Tensor g = st.input.grad();
    MAMMOTH_CHECK(g.defined()) << "[PipelineStage] virtual stage " << s
                               << "'s output does not depend on its input";
    send(g, kGradient, s - 1, a.micro_batch, schedule_.rank_of(s - 1));
  }
  if (schedule_.split_backward) {
    std::vector<Tensor> contrib;
    for (size_t i = 0; i < params.size(); ++i) {
      const Tensor& p = params[i].second;
      contrib.push_back(p.grad());
      if (saved[i].defined()) {
        p.set_grad(saved[i]);
      } else {
        p.zero_grad();
      }
    }
    deferred_[{a.micro_batch, a.chunk}] = std::move(contrib);
  }
}

void PipelineStage::weight(const Action& a) {
  auto it = deferred_.find({a.micro_batch, a.chunk});
  MAMMOTH_CHECK(it != deferred_.end()) << "[PipelineStage] W of micro-batch " << a.micro_batch
                                       << " chunk " << a.chunk << " before its B";
  engine::NoGradGuard ng;
  const auto& params = chunks_[a.chunk].params;
  for (size_t i = 0; i < params.size(); ++i) {
    const Tensor& c = it->second[i];
    if (!c.defined()) continue;
    const Tensor& p = params[i].second;
    p.set_grad(p.grad().defined() ? engine::add(p.grad(), c) : c);
  }
  deferred_.erase(it);
}

double PipelineStage::run() {
  loss_ = 0;
  stats_.sent = stats_.received = 0;
  const auto& list = schedule_.ranks[rank_];
  for (size_t i = 0; i < list.size(); ++i) {
    post_ahead(i);
    const Action& a = list[i];
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

// ---- GPT-2 ----

std::pair<int64_t, int64_t> Gpt2Pipeline::layer_range(int64_t n_layer, int num_stages, int s) {
  return {n_layer * s / num_stages, n_layer * (s + 1) / num_stages};
}

Gpt2Pipeline::Gpt2Pipeline(std::shared_ptr<models::Gpt2> model, const Schedule& schedule,
                           Communicator& pp)
    : model_(std::move(model)), pp_(pp) {
  MAMMOTH_CHECK(model_ != nullptr) << "[Gpt2Pipeline] model is null";
  const int S = schedule.num_virtual_stages();
  const int64_t L = static_cast<int64_t>(model_->h->size());
  MAMMOTH_CHECK(L >= S) << "[Gpt2Pipeline] " << L << " layers cannot fill " << S
                        << " virtual stages (pp " << schedule.stages << " x virtual stages "
                        << schedule.virtual_stages << ")";
  const int rank = pp.rank(), p = pp.size();
  const int M = schedule.micro_batches;
  const auto all = model_->named_parameters();
  auto params_with = [&](auto&& keep) {
    engine::nn::NamedTensors out;
    for (const auto& [name, t] : all) {
      if (keep(name)) out.emplace_back(name, t);
    }
    return out;
  };
  std::vector<StageChunk> chunks;
  for (int c = 0; c < schedule.virtual_stages; ++c) {
    const int s = schedule.virtual_stage(rank, c);
    const auto [first, last] = layer_range(L, S, s);
    const bool head = s == S - 1, embed = s == 0;
    StageChunk chunk;
    chunk.params = params_with([&](const std::string& name) {
      if (name.rfind("h.", 0) == 0) {
        const int64_t l = std::stoll(name.substr(2, name.find('.', 2) - 2));
        return l >= first && l < last;
      }
      if (name.rfind("wte.", 0) == 0) return embed || head;
      if (name.rfind("wpe.", 0) == 0) return embed;
      if (name.rfind("ln_f.", 0) == 0) return head;
      MAMMOTH_THROW() << "[Gpt2Pipeline] parameter '" << name << "' belongs to no stage";
    });
    for (const auto& np : chunk.params) params_.push_back(np);
    chunk.forward = [this, first, last, embed, head, M](const Tensor& input, int mb) {
      const Tensor& ids = batches_.at(mb);
      const int64_t T = ids.size(1);
      Tensor x = input;
      if (embed) x = model_->wte->forward(ids) + model_->wpe->forward(models::positions(0, T));
      for (int64_t l = first; l < last; ++l) x = (*model_->h)[l].forward(x, nullptr, l);
      if (!head) return x;
      Tensor logits = engine::linear(model_->ln_f->forward(x), model_->wte->weight);
      Tensor loss = engine::cross_entropy(logits.slice(1, 0, T - 1), ids.slice(1, 1, T));
      return engine::mul_scalar(loss, 1.0 / M);
    };
    chunks.push_back(std::move(chunk));
  }
  // A parameter can appear in two chunks of one rank only when p == 1 (wte); keep one entry.
  engine::nn::NamedTensors unique;
  for (const auto& np : params_) {
    bool seen = false;
    for (const auto& u : unique) seen = seen || u.second.impl() == np.second.impl();
    if (!seen) unique.push_back(np);
  }
  params_ = std::move(unique);
  const bool first_rank = rank == 0, last_rank = rank == p - 1;
  for (const auto& [name, t] : params_) {
    if (p > 1 && last_rank && name.rfind("wte.", 0) == 0) continue;
    norm_params_.push_back(t);
  }
  if (p > 1) tied_ = pp.split(first_rank || last_rank ? 0 : -1, rank, pp.name() + "/tied");
  stage_ = std::make_unique<PipelineStage>(schedule, std::move(chunks), pp);
}

Gpt2Pipeline::~Gpt2Pipeline() = default;

double Gpt2Pipeline::step(const std::vector<Tensor>& micro_batches) {
  const int M = stage_->schedule().micro_batches;
  MAMMOTH_CHECK(static_cast<int>(micro_batches.size()) == M)
      << "[Gpt2Pipeline::step] " << micro_batches.size() << " micro-batches for a schedule of "
      << M;
  batches_ = micro_batches;
  const double local = stage_->run();
  batches_.clear();
  if (tied_ != nullptr) {
    const Tensor& wte = model_->wte->weight;
    Tensor g = wte.grad();
    if (!g.defined()) g = Tensor::zeros(wte.shape(), wte.dtype());
    g = g.contiguous();
    tied_->all_reduce(g, ReduceOp::kSum);
    wte.set_grad(g);
  }
  Tensor l = Tensor::from_vector({pp_.rank() == pp_.size() - 1 ? local : 0.0}, {1}, DType::kF64);
  pp_.all_reduce(l, ReduceOp::kSum);
  return l.item();
}

double Gpt2Pipeline::grad_norm() {
  double sq = 0;
  for (const Tensor& t : norm_params_) {
    const Tensor g = t.grad();
    if (!g.defined()) continue;
    for (double v : g.to_vector()) sq += v * v;
  }
  Tensor s = Tensor::from_vector({sq}, {1}, DType::kF64);
  pp_.all_reduce(s, ReduceOp::kSum);
  return std::sqrt(s.item());
}

}  // namespace mammoth::parallel::pipeline
