#include "plan/time_model.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <sstream>
#include <utility>
#include <vector>

#include "base/dtype.h"
#include "base/error.h"
#include "models/family.h"
#include "parallel/pipeline/partition.h"
#include "parallel/pipeline/schedule.h"
#include "plan/memory_model.h"
#include "plan/offload_traffic.h"

namespace mammoth::plan {
namespace {

namespace pl = parallel::pipeline;

// Ring collectives on n ranks, alpha-beta. `bytes` is the whole buffer one rank ends with
// (all-reduce, all-gather; reduce-scatter's input), or, for all-to-all, the buffer it holds.
double all_reduce(double bytes, int n, const Link& l) {
  if (n <= 1) return 0;
  return 2.0 * (n - 1) / n * bytes / l.bandwidth + 2.0 * (n - 1) * l.latency;
}
double all_gather(double bytes, int n, const Link& l) {
  if (n <= 1) return 0;
  return (n - 1.0) / n * bytes / l.bandwidth + (n - 1.0) * l.latency;
}
double reduce_scatter(double bytes, int n, const Link& l) { return all_gather(bytes, n, l); }
double all_to_all(double bytes, int n, const Link& l) { return all_gather(bytes, n, l); }
double send(double bytes, const Link& l) { return bytes / l.bandwidth + l.latency; }

int axis_size(const ParallelPlan& p, const std::string& axis) {
  if (axis == "dp") return p.dp;
  if (axis == "pp") return p.pp;
  if (axis == "tp") return p.tp;
  if (axis == "sp") return p.sp;
  MAMMOTH_THROW() << "[time_model] unknown mesh axis '" << axis << "' in order '" << p.order << "'";
}

// Ranks of one group of `axis` are `stride` apart, stride = the product of the axes that vary
// faster (parallel/mesh.h). The group stays on NVLink when it fits in an aligned span of a node;
// otherwise its ring crosses nodes and each GPU's inter-node link bounds it.
// `size` > 0: a group of that many consecutive ranks of the axis (an expert group of ep dp
// ranks) instead of the whole axis.
const Link& group_link(const ParallelPlan& p, const std::string& axis, const Cluster& c,
                       int size = 0) {
  int64_t stride = 1;
  std::stringstream order(p.order);
  std::string a;
  while (std::getline(order, a, '-')) {
    if (a == axis) break;
    stride *= axis_size(p, a);
  }
  const int64_t span = stride * (size > 0 ? size : axis_size(p, axis));
  return span <= c.devices_per_node && c.devices_per_node % span == 0 ? c.intra_node : c.inter_node;
}

double dtype_bytes(const std::string& amp) { return amp == "bf16" || amp == "fp16" ? 2.0 : 4.0; }

// Costs of one micro-batch through one piece of the model on one rank, seconds.
struct Piece {
  double f_compute = 0, b_compute = 0, w_compute = 0;  // GEMMs + memory-bound ops
  double f_comm = 0, b_comm = 0;                       // tp / sp collectives
};

Piece scaled(const Piece& p, double k) {
  return {p.f_compute * k, p.b_compute * k, p.w_compute * k, p.f_comm * k, p.b_comm * k};
}

Piece add(const Piece& a, const Piece& b) {
  return {a.f_compute + b.f_compute, a.b_compute + b.b_compute, a.w_compute + b.w_compute,
          a.f_comm + b.f_comm, a.b_comm + b.b_comm};
}

std::string percent(double part, double whole) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f%%", whole > 0 ? 100.0 * part / whole : 0.0);
  return buf;
}

std::string seconds(double s) {
  char buf[32];
  if (s >= 1)
    std::snprintf(buf, sizeof buf, "%.3f s", s);
  else if (s >= 1e-3)
    std::snprintf(buf, sizeof buf, "%.2f ms", s * 1e3);
  else
    std::snprintf(buf, sizeof buf, "%.1f us", s * 1e6);
  return buf;
}

const std::pair<const char*, double TimeBreakdown::*> kParts[] = {
    {"compute", &TimeBreakdown::compute},          {"tp communication", &TimeBreakdown::tp_comm},
    {"pipeline sends", &TimeBreakdown::pp_comm},   {"pipeline bubble", &TimeBreakdown::pp_bubble},
    {"dp communication", &TimeBreakdown::dp_comm}, {"offload traffic", &TimeBreakdown::offload},
    {"optimizer", &TimeBreakdown::optimizer},
};

// Ring attention on a calibrated machine (parallel/sequence_parallel ring_attention) calls no
// fused kernel: the sequence is cut into 2 sp chunks of c positions, a rank holds two, and each
// pair of a local query chunk and an arriving key chunk that is not wholly masked (causal:
// 2 sp + 1 of the 4 sp) is attended blockwise and merged into the running result by its
// log-sum-exp. Per pair: two batched c x c x d GEMMs forward and four backward, four ops over
// the [b, heads, c, c] scores, one broadcast divide of the [b, heads, c, d] output, three small
// ops on the [b, heads, c, 1] statistics and two slices; per merge (a chunk's pairs after its
// first), three broadcast multiplies / divides and an add of outputs and nine small ops. The
// two slices of the arrived K / V (the pair's key chunk) have backwards that write gradients of
// the whole arrived block; under grouped queries each of the sp ring steps also copies K and V
// out to every query head (repeat_kv) and sums them back. An op's forward and backward cost two
// call overheads and its traffic: 16 bytes per element at the op bandwidth, or the measured
// broadcast rate.
struct RingCost {
  double forward = 0, backward = 0;
};

RingCost ring_attention_cost(const Cluster& c, double batch_heads, double seq, int sp, double d,
                             bool causal, bool grouped_kv, const std::string& amp) {
  const double chunk = std::ceil(seq / (2.0 * sp));
  const double pairs = causal ? 2.0 * sp + 1 : 4.0 * sp;
  const double merges = pairs - 2;
  const double scores = batch_heads * chunk * chunk, out = batch_heads * chunk * d;
  const double arrived = 2 * out;  // one rank's K (or V): its two chunks, every query head
  const double op = c.op_overhead, plain = 16 / c.device_memory_bandwidth;
  const double bcast = c.broadcast_op_per_element > 0 ? c.broadcast_op_per_element : plain;
  const double ops =
      pairs * ((4 + 1 + 3 + 2) * 2 * op + 4 * scores * plain + out * bcast + 2 * arrived * plain) +
      merges * ((4 + 9) * 2 * op + 3 * out * bcast + out * plain) +
      (grouped_kv ? sp * 2 * (2 * op + arrived * plain) : 0.0);
  const double qk = batch_heads * c.gemm_time(chunk, chunk, d, amp);  // S = Q K^T, dS = dO V^T
  const double pv = batch_heads * c.gemm_time(chunk, d, chunk, amp);  // O = E V, dV, dQ, dK
  return {pairs * (qk + pv) + ops / 3, pairs * (qk + 3 * pv) + 2 * ops / 3};
}

constexpr double kHeadOps = 5;  // embedding (+ position add), final norm, head, cross-entropy

}  // namespace

json::Value TimePrediction::to_json() const {
  json::Value p = json::Value::object();
  for (const auto& [name, member] : kParts) p.set(name, parts.*member);
  return json::Value::object()
      .set("step_time_s", step_time)
      .set("tokens_per_s", tokens_per_s)
      .set("mfu", mfu)
      .set("hfu", hfu)
      .set("tflops_per_gpu", tflops_per_gpu)
      .set("bubble_fraction", bubble_fraction)
      .set("binding", binding)
      .set("parts_s", std::move(p));
}

std::string TimePrediction::explain() const {
  std::ostringstream os;
  char buf[160];
  std::snprintf(buf, sizeof buf,
                "step %s, %.4g tokens/s, MFU %.1f%%, %.1f TFLOP/s per GPU (recompute counted)",
                seconds(step_time).c_str(), tokens_per_s, 100 * mfu, tflops_per_gpu);
  os << buf << "\n  time:";
  bool first = true;
  for (const auto& [name, member] : kParts) {
    const double v = parts.*member;
    if (v <= 0) continue;
    os << (first ? " " : ", ") << name << " " << seconds(v) << " (" << percent(v, step_time) << ")";
    first = false;
  }
  // The binding part and the one after it: what to attack first, and what comes next.
  std::vector<std::pair<double, const char*>> ranked;
  for (const auto& [name, member] : kParts) ranked.push_back({parts.*member, name});
  std::stable_sort(ranked.begin(), ranked.end(),
                   [](const auto& a, const auto& b) { return a.first > b.first; });
  os << "\n  binds: " << binding << " (" << percent(ranked[0].first, step_time) << " of the step)";
  if (ranked.size() > 1 && ranked[1].first > 0)
    os << "; next: " << ranked[1].second << " (" << percent(ranked[1].first, step_time) << ")";
  return os.str();
}

TimeModel::TimeModel(const models::ModelConfig& config, const Cluster& cluster, TimeOptions options)
    : config_(config), cluster_(cluster), options_(options) {}

const models::ModelAnalysis& TimeModel::analysis(int64_t seq_len) {
  auto it = analyses_.find(seq_len);
  if (it == analyses_.end())
    it = analyses_.emplace(seq_len, models::analyze(config_, seq_len)).first;
  return it->second;
}

double TimeModel::makespan(const std::string& schedule, int p, int m, int v, double f, double b,
                           double w) {
  if (p <= 1) return m * (f + b + w);
  if (!options_.simulate_pipeline) {
    const double work = f + b + w;
    if (schedule == "zb") return m * work + (p - 1) * std::max(f + b - w, f);
    return (m + (p - 1.0) / v) * work;
  }
  // The simulator's makespan is linear in the costs: cache it per cost ratio for f = 1, the
  // ratios rounded to 1% (under 0.2% of a step), so that the cores of a search share
  // simulations. Only a split schedule (zb) runs B and W apart; the others see B + W.
  const bool split = schedule == "zb";
  const auto key = std::make_tuple(schedule, p, m, v, std::llround((split ? b : b + w) / f * 100),
                                   split ? std::llround(w / f * 100) : int64_t{0});
  auto it = schedules_.find(key);
  if (it == schedules_.end()) {
    const pl::Schedule s =
        pl::make_schedule(pl::schedule_kind_from_name(schedule),
                          {.stages = p, .micro_batches = m, .virtual_stages = v});
    const pl::CheckResult r =
        pl::check_schedule(s, {1.0, static_cast<double>(std::get<4>(key)) * 1e-2,
                               static_cast<double>(std::get<5>(key)) * 1e-2});
    MAMMOTH_CHECK(r.ok) << "[time_model] schedule " << schedule << " p " << p << " m " << m << " v "
                        << v << ": " << r.error;
    it = schedules_.emplace(key, r.makespan).first;
  }
  return it->second * f;
}

double TimeModel::compute_lower_bound(const ParallelPlan& plan) {
  return evaluate(plan, true).step_time;
}

TimePrediction TimeModel::predict(const ParallelPlan& plan) { return evaluate(plan, false); }

TimePrediction TimeModel::evaluate(const ParallelPlan& plan, bool bound_only) {
  const models::ModelAnalysis& a = analysis(plan.seq_len);
  const Cluster& c = cluster_;
  const models::ModelConfig& cfg = config_;
  const models::FamilySpec& family = models::family_spec(cfg.family);
  const models::TimeShape& shape = family.time_shape;
  const double peak_raw = c.peak_for(plan.amp);
  const double peak = peak_raw * c.matmul_efficiency;
  const double hbm = c.device_memory_bandwidth;
  const double elem = dtype_bytes(plan.amp);
  const double b = static_cast<double>(plan.micro_batch);
  const double s = static_cast<double>(plan.seq_len);
  const double h = static_cast<double>(cfg.d_model);
  const double L = static_cast<double>(cfg.n_layer);
  const int tp = plan.tp, sp = plan.sp, pp = plan.pp, dp = plan.dp;
  const bool split_gather = plan.sp_mode == "split_gather";
  const bool seq_on_sp = plan.sp_mode == "ulysses" || plan.sp_mode == "ring";
  const double seq_div = seq_on_sp ? sp : 1.0;  // the sequence split of every rank's tokens
  const double tokens = b * s;
  const double attn_dim = static_cast<double>(cfg.n_head * cfg.head_dim());
  const double kv_dim = static_cast<double>(cfg.n_kv_head * cfg.head_dim());
  const double shard = static_cast<double>(tp) * seq_div;
  const double rc =
      plan.recompute_blocks < 0 ? 1.0 : std::min<double>(plan.recompute_blocks, L) / L;

  // One block, one micro-batch, one rank.
  const double attn_core = 4.0 * s * attn_dim * tokens / shard;  // scores and weighted sum
  const double weights = a.block_flops_per_token_forward * tokens / shard - attn_core;
  // Memory-bound traffic (Korthikanti et al. 2022, eq. 1, in 16-bit units of s b h): 10 units
  // replicated over tp without a sequence split, 24 split (of which 16 the MLP's inner
  // activations, scaled here by the family's MLP width: SwiGLU keeps three d_ff tensors).
  const double mlp_inner =
      16.0 * static_cast<double>(cfg.d_ff) / (4 * h) * (shape.gated_mlp ? 1.5 : 1.0);
  const double sbh = tokens * h * elem / 2;
  double saved = sbh * (10.0 / (split_gather ? tp : 1) + (8.0 + mlp_inner) / tp);
  if (!options_.flash_attention)
    saved += 5.0 * static_cast<double>(cfg.n_head) * s * tokens * (elem / 2) / tp;
  saved /= seq_div;
  const double mem_f = 2 * saved / hbm;
  // The attention core runs in its own fused kernel; a calibrated machine says at what rate.
  const double attn_rate = c.attention_rate > 0 ? c.attention_rate : peak;
  // Per-call costs (calibrated machines; 0 for published clusters): every engine op of the
  // block once forward and once backward, every linear layer's GEMM once forward and twice
  // backward (input and weight gradient). Not divided by tp or sp: a shard makes the same calls.
  const models::BlockCalls& calls = shape.calls;
  const double op = c.op_overhead, gemm = c.gemm_call_overhead;
  Piece block;
  if (!c.gemm.calibrated()) {
    const double attn = attn_core / attn_rate;
    block.f_compute = weights / peak + attn + mem_f + calls.ops * op + calls.linears * gemm;
    block.b_compute = weights / peak + 2 * attn + 2 * mem_f + calls.ops * op + calls.linears * gemm;
    block.w_compute = weights / peak + calls.linears * gemm;
  } else {
    // A calibrated GEMM rate depends on the GEMM's shape, as engine::linear calls it: each
    // linear layer's forward (T x out x in), input gradient (T x in x out) and weight gradient
    // (out x in x T).
    const double t = tokens / seq_div, ff = static_cast<double>(cfg.d_ff);
    std::vector<std::pair<double, double>> linears;  // (in, out) on this rank
    if (shape.separate_qkv)
      linears = {{h, attn_dim / tp}, {h, kv_dim / tp}, {h, kv_dim / tp}};
    else
      linears = {{h, (attn_dim + 2 * kv_dim) / tp}};
    linears.push_back({attn_dim / tp, h});
    if (shape.gated_mlp)
      linears.insert(linears.end(), {{h, ff / tp}, {h, ff / tp}, {ff / tp, h}});
    else
      linears.insert(linears.end(), {{h, ff / tp}, {ff / tp, h}});
    const double attn = c.attention_time(attn_core, static_cast<double>(cfg.head_dim()), plan.amp);
    RingCost core{attn, 2 * attn};
    if (plan.sp_mode == "ring" && sp > 1) {
      core = ring_attention_cost(c, b * static_cast<double>(cfg.n_head) / tp, s, sp,
                                 static_cast<double>(cfg.head_dim()), family.causal,
                                 cfg.n_kv_head > 0 && cfg.n_kv_head < cfg.n_head, plan.amp);
    }
    block.f_compute = core.forward + mem_f + calls.ops * op;
    block.b_compute = core.backward + 2 * mem_f + calls.ops * op;
    for (const auto& [in, out] : linears) {
      block.f_compute += c.gemm_time(t, out, in, plan.amp);
      block.b_compute += c.gemm_time(t, in, out, plan.amp);
      block.w_compute += c.gemm_time(out, in, t, plan.amp);
    }
  }
  const double act_bytes = tokens * h * elem / seq_div;  // one activation on one rank
  if (tp > 1) {
    const Link& l = group_link(plan, "tp", c);
    // Two collectives per block each way: attention and MLP outputs forward (all-reduce, or
    // reduce-scatter + all-gather around them under split_gather), their input gradients back.
    const double one = split_gather
                           ? all_gather(act_bytes, tp, l) + reduce_scatter(act_bytes, tp, l)
                           : all_reduce(act_bytes, tp, l);
    block.f_comm += 2 * one;
    block.b_comm += 2 * one;
  }
  if (sp > 1 && seq_on_sp) {
    const Link& l = group_link(plan, "sp", c);
    if (plan.sp_mode == "ulysses") {
      // q, k, v and the attention output change between sequence and head splits.
      const double bytes = b * (s / sp) * (2 * attn_dim + 2 * kv_dim) / tp * elem;
      block.f_comm += all_to_all(bytes, sp, l) + 3 * (sp - 1.0) * l.latency;
      block.b_comm += all_to_all(bytes, sp, l) + 3 * (sp - 1.0) * l.latency;
    } else {
      // K and V go round the ring behind the attention of the block that arrived.
      const double kv = b * (s / sp) * 2 * kv_dim / tp * elem;
      const double ring = (sp - 1.0) * send(kv, l);
      block.f_comm += std::max(0.0, ring - attn_core / peak);
      block.b_comm += std::max(0.0, 2 * ring - 2 * attn_core / peak);
    }
  }
  // Expert parallelism: per MoE block and micro-batch the routed rows (b s k of d_model) go to
  // their experts' ranks and come back, forward and again backward (4 all_to_all_v, what
  // expert_exchange_bytes_per_step counts, there in the model's dtype: the CPU runtime's
  // autocast keeps activations f32), after an all_to_all of the row counts (latency); the
  // runtime waits for each, so none is hidden.
  const bool ep = plan.ep > 1 && cfg.moe_experts > 0;
  if (ep) {
    const Link& l = group_link(plan, "dp", c, plan.ep);
    const double rows = tokens * static_cast<double>(cfg.moe_top_k) * h * elem;
    block.f_comm += 2 * all_to_all(rows, plan.ep, l) + (plan.ep - 1.0) * l.latency;
    block.b_comm += 2 * all_to_all(rows, plan.ep, l);
  }
  // Recompute: the block's forward (and its collectives) again at the start of its backward.
  block.b_compute += rc * block.f_compute;
  block.b_comm += rc * block.f_comm;

  Piece head;
  {
    const double flops = a.head_flops_per_token_forward * tokens / shard;
    const double logits = 4.0 * tokens * static_cast<double>(cfg.vocab_size) / shard;  // fp32
    // Embedding, final norm, the LM head's GEMM and the cross-entropy.
    double f = flops / peak + gemm, dx = f, dw = f;
    if (c.gemm.calibrated()) {
      const double t = tokens / seq_div, v = static_cast<double>(cfg.vocab_size) / tp;
      f = c.gemm_time(t, v, h, plan.amp);
      dx = c.gemm_time(t, h, v, plan.amp);
      dw = c.gemm_time(v, h, t, plan.amp);
    }
    head.f_compute = f + 2 * logits / hbm + kHeadOps * op;
    head.b_compute = dx + 2 * logits / hbm + kHeadOps * op;
    head.w_compute = dw;
  }

  const Link& pp_link = group_link(plan, "pp", c);
  const double p2p =
      pp <= 1 ? 0.0
      : options_.scatter_gather_p2p && !split_gather && tp > 1
          ? send(act_bytes / tp, pp_link) + all_gather(act_bytes, tp, group_link(plan, "tp", c))
          : send(split_gather ? act_bytes / tp : act_bytes, pp_link);
  const int m = static_cast<int>(plan.grad_accum);
  if (bound_only) {
    // The average rank's work per micro-batch: the bottleneck rank, whatever the stage cut,
    // holds at least that, the schedule only adds idle time, and dp, ZeRO, offload and the
    // optimizer only add time.
    auto sum = [](const Piece& x) {
      return x.f_compute + x.b_compute + x.w_compute + x.f_comm + x.b_comm;
    };
    TimePrediction t;
    t.step_time = m * ((L * sum(block) + sum(head)) / pp + 2 * p2p);
    return t;
  }

  // Stage layout: layers per rank, the head on the rank holding the last virtual stage.
  const int stages = pp * plan.virtual_stages;
  pl::Partition cut;
  if (!plan.stage_cut.empty()) {
    cut = plan.stage_cut;
  } else if (stages == 1) {
    cut = {0, cfg.n_layer};
  } else if (plan.pp_partition == "count") {
    cut = pl::partition_by_count(cfg.n_layer, stages);
  } else {
    const auto key = std::make_pair(plan.seq_len, stages);
    auto it = partitions_.find(key);
    if (it == partitions_.end()) {
      it = partitions_
               .emplace(key,
                        pl::balanced_partition(std::vector<double>(static_cast<size_t>(cfg.n_layer),
                                                                   a.block_flops_per_token_forward),
                                               0.0, a.head_flops_per_token_forward, stages))
               .first;
    }
    cut = it->second;
  }
  const int64_t params_all = a.params;
  models::ModelConfig no_blocks = cfg;
  no_blocks.n_layer = 0;
  const double outside = static_cast<double>(models::count_parameters(no_blocks));
  const double block_params = (static_cast<double>(params_all) - outside) / L;
  // A MoE block's experts: under --ep a rank holds 1/ep of them, reduced over the ep-th of dp
  // that holds the same ones.
  const double expert_params =
      static_cast<double>(models::family_spec(cfg.family).cost.expert_params(cfg));
  const double held_expert_params = ep ? expert_params / plan.ep : expert_params;
  const double embed_params = static_cast<double>(a.embedding_params);
  // The last stage holds the head (and, tied, a copy of the embedding it shares) and final norm.
  const double last_params =
      outside - embed_params + (cfg.tie_embeddings && pp > 1 ? embed_params : 0.0);

  const double param_elem = static_cast<double>(dtype_size(cfg.dtype));
  const double grad_elem = param_elem;
  const Link& dp_link = group_link(plan, "dp", c);

  struct Rank {
    Piece piece;
    double params = 0;   // this rank's parameters (tp shard), before ZeRO
    double experts = 0;  // of which its experts' (whole on every tp rank)
  };
  std::vector<Rank> ranks(static_cast<size_t>(pp));
  for (int st = 0; st < stages; ++st) {
    Rank& r = ranks[static_cast<size_t>(st % pp)];
    const double layers = static_cast<double>(cut[st + 1] - cut[st]);
    r.piece = add(r.piece, scaled(block, layers));
    r.params += layers * ((block_params - expert_params) / tp + held_expert_params);
    r.experts += layers * held_expert_params;
    if (st == 0) r.params += embed_params / tp;
    if (st == stages - 1) {
      r.piece = add(r.piece, head);
      r.params += last_params / tp;
    }
  }
  // ZeRO-3 gathers each micro-batch's parameters before its forward and again before its
  // backward, prefetched behind the compute: only the excess shows.
  double f = 0, bw = 0, w = 0, comm_tp = 0, comm_pp = 0, zero3 = 0, compute = 0;
  double stage0_params = ranks[0].params, max_params = 0, max_local = 0, stage0_back = 0;
  // The optimizer's share of a rank: sharded by ZeRO >= 1 (and by chunk ownership under offload
  // with dp) over dp, its experts over dp / ep.
  const bool sharded_states = plan.zero >= 1 || plan.offloaded();
  const double shared_div = sharded_states ? dp : 1;
  const double expert_div = sharded_states ? (ep ? dp / plan.ep : dp) : 1;
  for (const Rank& r : ranks) {
    const Piece& x = r.piece;
    double z_f = 0, z_b = 0;
    if (plan.zero == 3 && dp > 1) {
      const double ag = all_gather((r.params - r.experts) * param_elem, dp, dp_link) +
                        all_gather(r.experts * param_elem, ep ? dp / plan.ep : dp, dp_link);
      z_f = c.overlaps_communication ? std::max(0.0, ag - x.f_compute) : ag;
      z_b = c.overlaps_communication ? std::max(0.0, ag - x.b_compute - x.w_compute) : ag;
    }
    const double pf = pp > 1 ? p2p : 0.0;
    const double rf = x.f_compute + x.f_comm + pf + z_f;
    const double rb = x.b_compute + x.b_comm + pf + z_b;
    const double rw = x.w_compute;
    if (rf + rb + rw > f + bw + w) {
      f = rf;
      bw = rb;
      w = rw;
      comm_tp = x.f_comm + x.b_comm;
      comm_pp = 2 * pf;
      zero3 = z_f + z_b;
      compute = x.f_compute + x.b_compute + x.w_compute;
    }
    max_params = std::max(max_params, r.params);
    max_local = std::max(max_local, (r.params - r.experts) / shared_div + r.experts / expert_div);
  }
  stage0_back = ranks[0].piece.b_compute + ranks[0].piece.w_compute;
  const double span = makespan(plan.pp_schedule, pp, m, plan.virtual_stages, f, bw, w);

  TimePrediction t;
  t.parts.compute = m * compute;
  t.parts.tp_comm = m * comm_tp;
  t.parts.pp_comm = m * comm_pp;
  t.parts.pp_bubble = std::max(0.0, span - m * (f + bw + w));
  t.bubble_fraction = span > 0 ? t.parts.pp_bubble / span : 0;

  // Gradients: summed over the sequence split (ulysses / ring replicate every parameter over
  // sp), then over dp. Stage 0 finishes the step last, so its reduction is what shows.
  // Under --ep the shared parameters reduce over dp and the experts over dp / ep.
  double dp_time = 0;
  const double grads = stage0_params * grad_elem;
  if (sp > 1 && seq_on_sp) dp_time += all_reduce(grads, sp, group_link(plan, "sp", c));
  const double stage0_experts = ranks[0].experts;
  for (const auto& [count, n] : {std::pair{stage0_params - (ep ? stage0_experts : 0.0), dp},
                                 std::pair{ep ? stage0_experts : 0.0, ep ? dp / plan.ep : 1}}) {
    if (n <= 1 || count <= 0) continue;
    if (plan.zero == 0 || plan.offloaded()) {
      dp_time += all_reduce(count * grad_elem, n, dp_link);
    } else {
      dp_time += reduce_scatter(count * grad_elem, n, dp_link);
      if (plan.zero < 3) dp_time += all_gather(count * param_elem, n, dp_link);
    }
  }
  // Buckets are reduced as they fill during the backward, so the last bucket's share of the
  // traffic starts only when the backward ends: that much is exposed whatever the overlap (all
  // of it when the gradients fit in one bucket, as a tiny model's do).
  const double last_bucket =
      grads > 0 ? dp_time * std::min(1.0, plan.bucket_mb * 1024 * 1024 / grads) : 0.0;
  t.parts.dp_comm = m * zero3 + (options_.overlap_dp && c.overlaps_communication
                                     ? std::max(last_bucket, dp_time - stage0_back)
                                     : dp_time);

  // The optimizer walks the largest rank's share of the parameters.
  const double local = max_local;
  constexpr double kAdamBytes = 32;  // read master, grad, m, v; write master, m, v, 16-bit copy
  if (plan.offload == "host" || plan.offload == "nvme") {
    t.parts.offload = local * kAdamBytes / (c.host_memory_bandwidth / c.devices_per_node);
  } else {
    t.parts.optimizer = local * kAdamBytes / hbm;
  }
  if (plan.offloaded() && !plan.zero3_shards_on_nvme()) t.parts.offload += paging(plan, t.parts);
  // Accumulation: every micro-batch after the first adds its weight gradients into the
  // parameters' (read both, write one: 3 elements of traffic), one kernel call per tensor.
  if (m > 1 && c.op_overhead > 0) {
    const double stage_layers = static_cast<double>(cfg.n_layer) / pp;
    t.parts.compute +=
        (m - 1) * (max_params * grad_elem * 3 / hbm +
                   op * (stage_layers * calls.param_tensors + calls.outside_tensors));
  }
  // Gradient norm, AdamW and zeroing walk the parameter tensors one kernel call each.
  {
    const double stage_layers = static_cast<double>(cfg.n_layer) / pp;
    t.parts.optimizer +=
        3 * op * (stage_layers * calls.param_tensors + calls.outside_tensors / (pp > 1 ? 2 : 1));
  }

  t.step_time = t.parts.total();
  const double global_tokens = static_cast<double>(plan.global_batch()) * s;
  t.tokens_per_s = global_tokens / t.step_time;
  t.model_flops = global_tokens * a.flops_per_token_train;
  t.hardware_flops = global_tokens * (L * a.block_flops_per_token_forward * (3 + rc) +
                                      3 * a.head_flops_per_token_forward);
  const double world = static_cast<double>(plan.world());
  t.mfu = t.model_flops / (t.step_time * world * peak_raw);
  t.hfu = t.hardware_flops / (t.step_time * world * peak_raw);
  t.tflops_per_gpu = t.hardware_flops / (t.step_time * world) / 1e12;
  double most = -1;
  for (const auto& [name, member] : kParts) {
    if (t.parts.*member > most) {
      most = t.parts.*member;
      t.binding = name;
    }
  }
  return t;
}

double TimeModel::paging(const ParallelPlan& plan, const TimeBreakdown& parts) {
  // What the chunk manager moves, from its own dry run (plan/offload_traffic.h) on each
  // pipeline rank's chunks: device <-> host over PCIe, a latency per move (on the CPU backend
  // the calibrated cost of the manager's own moves; one copy thread does both directions),
  // NVMe at the node's rate shared by its devices, the two streams pipelined.
  // The forward and backward's moves hide behind the compute where the machine overlaps
  // transfers, except the loads acquire() waited for; the optimizer walk's moves pipeline with
  // the update chunk by chunk, so only what exceeds the update shows.
  const Cluster& c = cluster_;
  const bool cuda = plan.device == "cuda";
  auto over = [](double bytes, double rate) { return bytes > 0 ? bytes / rate : 0.0; };
  auto seconds = [&](const OffloadPhase& ph) {
    const double pcie =
        over(cuda ? std::max(ph.device_in, ph.device_out) : ph.device_in + ph.device_out,
             c.pcie.bandwidth) +
        ph.device_moves * c.pcie.latency;
    const double nvme = over(ph.nvme_read + ph.nvme_write, c.nvme.bandwidth / c.devices_per_node);
    return std::max(pcie, nvme);
  };
  const MemoryPrediction memory = predict_memory(config_, plan);
  double worst = 0;
  for (const StageMemory& st : memory.stages) {
    if (st.offload_tensors.empty()) continue;
    const OffloadTraffic traffic = simulate_offload(offload_setup(st, plan));
    if (!traffic.error.empty()) continue;  // plan::check and the memory model say why
    const OffloadPhase& fb = traffic.compute;
    const double moves = seconds(fb);
    const double demand = fb.device_in > 0 ? moves * fb.device_demand_in / fb.device_in : 0.0;
    const double exposed =
        c.overlaps_communication ? std::max(demand, moves - parts.compute) : moves;
    const double walk = seconds(traffic.optimizer);
    const double update = parts.optimizer + parts.offload;
    worst = std::max(worst, exposed + std::max(0.0, walk - update));
  }
  return worst;
}

TimePrediction predict_time(const models::ModelConfig& config, const ParallelPlan& plan,
                            const Cluster& cluster, const TimeOptions& options) {
  TimeModel model(config, cluster, options);
  return model.predict(plan);
}

}  // namespace mammoth::plan
