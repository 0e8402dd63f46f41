// The memory model: a formula over (config, plan) for the bytes each rank's allocator holds at
// the step's height. Every term names the code that allocates it; the per-block activation
// bytes and the tp split of the parameters are each family's (FamilySpec::cost, declared in
// models/<family>/<family>_family.cc), following its forward code (and its tensor-parallel form
// in models/policies) and what each engine op saves for backward
// (engine/ops/*.cc: linear saves its input, layer_norm its input and two row statistics,
// rms_norm its input and one, the activations their input, mul both operands, attention
// q, k, v, its output and the log-sum-exp; views, add and rope save nothing).
//
// The step's peak is the largest of a few moments, each a sum of what is live then:
//   forward end    every micro-batch in flight's saved tensors (+ the loss's temporaries)
//   head backward  + the head's input gradient and its weight gradient
//   first block    the saved tensors, the gradients made so far, the block's backward extras
//   last block     one block's saved tensors left, nearly every gradient made
//   backward end   every gradient (+ the embedding's scatter when it is tied to the head)
//   norm           every gradient and the global norm's square of the largest
// for the step's first backward (no gradients yet) and, with accumulation or a pipeline, for
// the next one (every gradient of the stage already there). Blocks are identical, so what is
// live is linear in the blocks already done and the first and the last block bound the rest.
//
// Checked against the CPU allocator's measured peak per rank by test/plan/memory_train_test.sh
// (50+ configurations of the tiny models); the terms were read off the code and off traces of
// the live allocations at the measured peak, never fitted per configuration.
#include "plan/memory_model.h"

#include <algorithm>
#include <cstdio>
#include <sstream>
#include <vector>

#include "base/dtype.h"
#include "base/error.h"
#include "memory/chunks/layout.h"
#include "models/analyze.h"
#include "models/family.h"
#include "parallel/pipeline/partition.h"

namespace mammoth::plan {
namespace {

using models::ModelConfig;

// Constants of the runtime this model follows (parallel/data_parallel.h, engine/offload).
constexpr int kMaxInFlight = 2;         // ZeRO-2/3 full-size gradient buckets posted at once
constexpr int kMinShardedBuckets = 16;  // ZeRO-2/3 buckets are at most 1/16 of the model
constexpr int kOffloadCommBuffers = 4;  // host buffers averaging / broadcasting offload chunks
// Small tensors a step keeps beside the counted ones (loss scalars, masks, index vectors,
// MPI staging of scalars); the batch's ids are counted apart. The CPU allocator counts the
// bytes requested (memory/allocator.cc), so there is no per-block overhead to add.
constexpr int64_t kFixedSmall = 4 * 1024;

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Parameter counts split the way the sharding policies split them (models/policies): matrices
// of the blocks divide by tp (column- and row-parallel), column-parallel biases too; norms and
// row-parallel biases are replicated. Vocabulary tables (and untied heads) are vocab-parallel,
// padded to a multiple of tp; position / token-type tables and final norms are replicated.
struct ParamSplit {
  int64_t block = 0;          // one block, unsharded (models::count_parameters difference)
  int64_t block_shard = 0;    // one block on one tp rank
  int64_t embed = 0;          // embedding part (first stage), one tp rank
  int64_t head = 0;           // head part (last stage, excluding a tied table), one tp rank
  int64_t tied = 0;           // a table used by both (on first and last stage), one tp rank
  int64_t largest = 0;        // the largest single parameter on one tp rank (elements)
  int64_t largest_block = 0;  // the largest parameter of a block on one tp rank
};

ParamSplit split_params(const ModelConfig& c, int tp) {
  ParamSplit s;
  ModelConfig none = c;
  none.n_layer = 0;
  ModelConfig one = c;
  one.n_layer = 1;
  const int64_t outside = models::count_parameters(none);
  s.block = models::count_parameters(one) - outside;
  const int64_t d = c.d_model, V = c.vocab_size;
  const int64_t Vp = ceil_div(V, tp) * tp;
  const models::FamilySpec& spec = models::family_spec(c.family);
  const models::TpParamSplit split = spec.cost.tp_split(c, tp, Vp, outside);
  // Grouped-query k/v heads are replicated when there are fewer of them than tp ranks.
  int64_t kv_extra = 0;
  if (spec.rotary && tp > c.n_kv_head) {
    const int64_t kv = c.n_kv_head * c.head_dim();
    kv_extra = 2 * d * kv * (tp / c.n_kv_head) / tp;  // each rank holds a whole head's rows
    kv_extra -= 2 * d * kv / tp;
  }
  s.block_shard = split.replicated + (s.block - split.replicated) / tp + kv_extra;
  s.tied = split.tied;
  s.embed = split.embed;
  s.head = split.head;
  s.largest_block = split.largest_block;
  s.largest = std::max({Vp * d / tp, s.largest_block, c.max_seq * d});
  return s;
}

// The stage cut `mammoth train` uses (models/pipeline ModelPipeline::balanced: block
// FLOPs with the head on the last stage, at the pipeline's seq_len + 1 positions).
parallel::pipeline::Partition stage_cut(const ModelConfig& c, const ParallelPlan& p) {
  if (!p.stage_cut.empty()) return p.stage_cut;
  const int stages = p.pp * std::max(1, p.virtual_stages);
  if (stages == 1) return {0, c.n_layer};
  if (p.pp_partition == "count") return parallel::pipeline::partition_by_count(c.n_layer, stages);
  const models::ModelAnalysis a = models::analyze(c, p.seq_len + 1);
  const std::vector<double> blocks(static_cast<size_t>(c.n_layer), a.block_flops_per_token_forward);
  return parallel::pipeline::balanced_partition(blocks, 0.0, a.head_flops_per_token_forward,
                                                stages);
}

// Activation bytes of one micro-batch on one rank, by part, following the forward code.
struct Acts {
  int64_t block = 0;            // one block's saved tensors
  int64_t block_recompute = 0;  // one recomputed block's saved tensors (its input)
  int64_t block_bwd = 0;        // extra live inside one block's backward (dy, dx of d_ff, dW)
  int64_t embed = 0;            // saved by the embedding (first stage)
  int64_t head = 0;             // saved by the head and the loss (last stage)
  int64_t head_fwd = 0;         // transient while the loss is computed
  int64_t head_bwd = 0;         // transient in the head's backward (its input gradient)
  int64_t boundary = 0;         // one block's output (pipeline send, the gradient flowing)
};

Acts activations(const ModelConfig& c, const ParallelPlan& p, int64_t e) {
  const int tp = p.tp;
  const bool ulysses = p.sp_mode == "ulysses", ring = p.sp_mode == "ring";
  const bool sg = p.sp_mode == "split_gather";
  // Positions a rank computes: ulysses / ring split the sequence over sp for every tensor.
  const int64_t T = p.seq_len + (p.pp > 1 ? 1 : 0);
  const int64_t Tl = (ulysses || ring) ? T / p.sp : T;
  const int64_t B = p.micro_batch;
  const int64_t N = B * Tl;  // tokens per rank
  const int64_t C = c.d_model, F = c.d_ff;
  const int64_t H = c.n_head / tp;  // local query heads
  const int64_t Hkv = std::max<int64_t>(1, c.n_kv_head / tp);
  const models::FamilySpec& spec = models::family_spec(c.family);
  const int64_t Ckv = (spec.rotary ? Hkv : H) * c.head_dim();
  const int64_t Cl = H * c.head_dim();  // local attention width
  const int64_t Fl = F / tp;
  const int64_t Vl = ceil_div(c.vocab_size, tp);
  // Between blocks split_gather keeps 1/tp of the positions; the column-parallel layers
  // all-gather their input and save the gathered copy (parallel/tensor_parallel/layers.cc).
  const int64_t Ns = sg ? N / tp : N;
  const int64_t lse = B * H * Tl * 4;  // attention's log-sum-exp rows, always f32
  Acts a;
  // Attention's saved q, k, v and output, then the merged heads saved by the out projection.
  int64_t attn = (Cl + 2 * Ckv + Cl + Cl) * N * e + lse;
  if (ring) {
    // Ring attention (parallel/sequence_parallel.cc) on the zigzag layout: 2 sp chunks of
    // c = T / 2sp positions, two per rank. Each (query chunk, key chunk) pair computed (causal:
    // 2 sp + 1 of them on every rank; full attention: 4 sp) saves its exponentiated scores
    // [B, H, c, c] (exp's output), e @ v and its division by the row sums; each merge of two
    // partial outputs saves their weighted sum and its quotient (the chunk's last is the
    // output, freed once the chunks are concatenated), and a few [B, H, c] row vectors. The
    // K/V blocks every step received stay saved (the key-head copies under grouped queries),
    // and so does the query's contiguous copy; the merged heads are the out projection's input.
    const bool causal = spec.causal;
    const int64_t pairs = causal ? 2 * p.sp + 1 : 4 * p.sp;
    const int64_t merges = pairs - 2;
    const int64_t chunk = T / (2 * p.sp);
    const int64_t o_chunk = B * H * chunk * c.head_dim() * e;
    const int64_t row = B * H * chunk * 4;
    const int64_t kv_width = Hkv * c.head_dim() == Cl ? Ckv : Cl;
    attn = 2 * p.sp * N * kv_width * e + N * Cl * e + pairs * B * H * chunk * chunk * e +
           (2 * pairs + 2 * merges - 2) * o_chunk + (2 * pairs + 4 * merges) * row + N * Cl * e;
  }
  const models::FamilyActivations fam =
      spec.cost.activations(c, {.N = N, .Ns = Ns, .C = C, .Fl = Fl, .e = e, .attn = attn});
  a.block = fam.block;
  // engine/nn/checkpoint.h keeps only the block's input.
  a.block_recompute = Ns * C * e;
  // In a block's backward: what the family's backward holds beside the saved tensors.
  a.block_bwd = fam.block_bwd;
  a.boundary = Ns * C * e;
  const bool vocab_parallel = tp > 1 || p.sp_mode != "none";
  // Vocab-parallel embedding (tp): the masked lookup is multiplied by its keep mask, and mul
  // saves the lookup.
  a.embed = (vocab_parallel ? N * C * e : 0) + fam.embed;
  // Head: what the family's head saves, then the logits. Without tp cross_entropy saves the
  // logits and writes their gradient over them; the vocab-parallel one saves exp(shifted) and
  // makes the shifted logits and the exponentials as temporaries.
  const int64_t logits = N * (vocab_parallel ? Vl : c.vocab_size) * e;
  a.head = fam.head + logits + 2 * N * e;  // + cross-entropy's per-row loss and lse
  a.head_fwd = vocab_parallel ? 2 * logits : 0;
  if (p.pp > 1) {
    // pipeline_loss slices the T + 1 positions' logits to T - 1 (cross_entropy copies the
    // slice): the full logits are a temporary beside the saved copy.
    a.head_fwd = std::max(a.head_fwd, logits);
  }
  // The head's backward: its input gradient (its weight gradient is the first gradient made,
  // counted with the gradients); the vocab-parallel loss's gradient of the shifted logits
  // (exp's and gather's, summed in place), its saved forward temporaries gone.
  a.head_bwd = N * C * e + (vocab_parallel ? logits : 0);
  if (c.attn_dropout > 0) {
    // models::attend materialises scores, probabilities and the dropout mask per block.
    const int64_t sq = B * H * Tl * (ring ? Tl : T);
    a.block += sq * (2 * e + 1);
  }
  return a;
}

// Micro-batches whose activations a stage holds at once (parallel/pipeline/schedule.h).
int64_t in_flight(const ParallelPlan& p, int stage) {
  const int64_t M = p.grad_accum;
  if (p.pp == 1) return 1;
  if (p.pp_schedule == "gpipe") return M;
  if (p.pp_schedule == "interleaved") {
    // Megatron's interleaved warm-up: (pp - s - 1) * 2 + (v - 1) * pp chunk forwards before
    // the first backward, each chunk ~1/v of the stage.
    const int v = std::max(1, p.virtual_stages);
    const int64_t chunks = std::min<int64_t>(M * v, (p.pp - stage - 1) * 2 + (v - 1) * p.pp + 1);
    return std::max<int64_t>(1, ceil_div(chunks, v));
  }
  return std::min<int64_t>(M, p.pp - stage);  // 1f1b, zb
}

}  // namespace

int64_t MemoryPrediction::device_peak() const {
  int64_t m = 0;
  for (const StageMemory& s : stages) m = std::max(m, s.device_peak);
  return m;
}

int64_t MemoryPrediction::planned_peak() const {
  int64_t m = 0;
  for (const StageMemory& s : stages) m = std::max(m, s.planned_peak());
  return m;
}

json::Value MemoryPrediction::to_json() const {
  json::Value out = json::Value::array();
  for (const StageMemory& s : stages) {
    json::Value homes = json::Value::object();
    static const char* const kNames[] = {"device", "host", "nvme"};
    for (int t = kDeviceTier; t <= kNvmeTier; ++t) {
      homes.set(kNames[t], json::Value::object()
                               .set("params", s.homes[t].params)
                               .set("grads", s.homes[t].grads)
                               .set("optimizer", s.homes[t].optimizer));
    }
    out.push_back(json::Value::object()
                      .set("homes", std::move(homes))
                      .set("params", s.params)
                      .set("grads", s.grads)
                      .set("optimizer", s.optimizer)
                      .set("activations", s.activations)
                      .set("buffers", s.buffers)
                      .set("temporaries", s.temporaries)
                      .set("model_copy", s.model_copy)
                      .set("chunks_device", s.chunks_device)
                      .set("device_peak", s.device_peak)
                      .set("host", s.host)
                      .set("nvme", s.nvme));
  }
  return json::Value::object()
      .set("stages", std::move(out))
      .set("device_peak", device_peak())
      .set("planned_peak", planned_peak());
}

std::string MemoryPrediction::explain() const {
  std::ostringstream os;
  auto mib = [](int64_t b) { return static_cast<double>(b) / 1048576.0; };
  char line[512];
  for (size_t s = 0; s < stages.size(); ++s) {
    const StageMemory& m = stages[s];
    std::snprintf(line, sizeof(line),
                  "stage %zu: device peak %.1f MiB = params %.1f + grads %.1f + optimizer %.1f + "
                  "activations %.1f + buffers %.1f + temporaries %.1f + model copy %.1f MiB; "
                  "chunks on device %.1f, host %.1f, nvme %.1f MiB\n",
                  s, mib(m.device_peak), mib(m.params), mib(m.grads), mib(m.optimizer),
                  mib(m.activations), mib(m.buffers), mib(m.temporaries), mib(m.model_copy),
                  mib(m.chunks_device), mib(m.host), mib(m.nvme));
    os << line;
  }
  return os.str();
}

std::string placement_table(const StageMemory& m, const ParallelPlan& p) {
  auto mib = [](int64_t b) { return static_cast<double>(b) / 1048576.0; };
  auto budget = [&](int tier) -> std::string {
    char b[64];
    const int64_t bytes = tier == kDeviceTier ? p.device_mem : tier == kHostTier ? p.host_mem : 0;
    if (tier == kDeviceTier && p.auto_device_mem > 0)
      std::snprintf(b, sizeof(b), "auto:%.1f MiB", mib(p.auto_device_mem));
    else if (tier == kNvmeTier)
      return p.nvme_dir.empty() ? "-" : p.nvme_dir;
    else if (bytes == 0)
      return "unlimited";
    else
      std::snprintf(b, sizeof(b), "%.1f MiB", mib(bytes));
    return b;
  };
  std::ostringstream os;
  char line[512];
  static const char* const kNames[] = {"device", "host", "nvme"};
  for (int t = kDeviceTier; t <= kNvmeTier; ++t) {
    const StageMemory::Homes& h = m.homes[t];
    std::snprintf(line, sizeof(line),
                  "  %-6s  params %9.2f MiB  grads %9.2f MiB  optimizer %9.2f MiB  "
                  "total %9.2f MiB  budget %s\n",
                  kNames[t], mib(h.params), mib(h.grads), mib(h.optimizer), mib(h.total()),
                  budget(t).c_str());
    os << line;
  }
  return os.str();
}

MemoryPrediction predict_memory(const ModelConfig& c, const ParallelPlan& p) {
  MAMMOTH_CHECK(p.dp >= 1 && p.pp >= 1 && p.tp >= 1 && p.sp >= 1)
      << "[memory_model] mesh axes must be >= 1, got dp " << p.dp << " pp " << p.pp << " tp "
      << p.tp << " sp " << p.sp;
  MAMMOTH_CHECK(c.n_layer >= p.pp) << "[memory_model] " << c.n_layer << " layers for pp " << p.pp;
  const int64_t e = static_cast<int64_t>(dtype_size(c.dtype));
  // AdamW: two moments per parameter; 16-bit weights add fp32 masters (models/analyze.h's
  // 12 bytes per parameter). The runtime's own AdamW keeps f32 moments for f32 parameters
  // (engine/optim/optim.cc, eagerly in its constructor), which is every measured case.
  const int64_t opt_bytes_per = c.dtype == DType::kF32 ? 8 : 12;
  const int64_t P = models::count_parameters(c);
  const ParamSplit ps = split_params(c, p.tp);
  const parallel::pipeline::Partition cut = stage_cut(c, p);
  const Acts a = activations(c, p, e);
  const bool model_parallel = p.tp * p.sp > 1 || p.sp_mode != "none";
  // ZeRO-3 with NVMe-homed shards is data parallelism (its shards paged by the chunk manager),
  // not the engine's chunked offload.
  const bool offload = p.offloaded() && !p.zero3_shards_on_nvme();
  const int v = std::max(1, p.virtual_stages);
  // The trained form on one tp rank, whole (every stage): `mammoth train` builds the whole
  // model on every pipeline rank and trains its stages' parameters only.
  // Under --ep a rank holds 1/ep of every block's experts (runtime/runtime.cc frees the other
  // expert ranks' weights in all blocks) and reduces them in a DataParallel of their own over
  // the dp / ep ranks that hold the same ones (parallel/expert_parallel.h).
  const bool ep = p.ep > 1 && c.moe_experts > 0;
  const int64_t expert_block = ep ? models::family_spec(c.family).cost.expert_params(c) : 0;
  const int64_t freed_block = ep ? expert_block - expert_block / p.ep : 0;
  const int64_t trained_all =
      c.n_layer * (ps.block_shard - freed_block) + ps.embed + ps.head + ps.tied;

  MemoryPrediction out;
  for (int s = 0; s < p.pp; ++s) {
    StageMemory m;
    // This rank's blocks and parts (virtual stages s, s + pp, ...).
    // Recompute covers the model's first recompute_blocks layers (models/model.h recomputes()),
    // wherever the stage cut puts them.
    const int64_t rc_end = p.recompute_blocks < 0 ? c.n_layer : p.recompute_blocks;
    int64_t blocks = 0, recomputed = 0;
    bool first = false, last = false;
    for (int k = 0; k < v; ++k) {
      const int vs = s + k * p.pp;
      const int64_t lo = cut[static_cast<size_t>(vs)], hi = cut[static_cast<size_t>(vs) + 1];
      blocks += hi - lo;
      recomputed += std::max<int64_t>(0, std::min(hi, rc_end) - lo);
      first = first || vs == 0;
      last = last || vs == p.pp * v - 1;
    }
    const int64_t stage_params = blocks * (ps.block_shard - freed_block) + (first ? ps.embed : 0) +
                                 (last ? ps.head : 0) + (first || last ? ps.tied : 0);
    const int64_t stage_experts = ep ? blocks * (expert_block - freed_block) : 0;

    // ---- parameters, gradients, optimizer, buffers: persistent and transient ----
    // Under tp/sp `mammoth train` keeps the single-process model (the policy's checkpoint map
    // reads its names and shapes, runtime/runtime.cc PolicyShards) beside its sharded form, and
    // every pipeline rank builds the whole (trained form of the) model, training only its
    // stages' parameters: the other stages' are held too.
    m.model_copy = ((model_parallel ? P : 0) + trained_all - stage_params) * e;
    const bool dp_on = p.dp > 1 && !offload;

    int64_t params = stage_params;
    int64_t opt = stage_params * opt_bytes_per / e;  // in elements of e
    int64_t grad_persist = 0;                        // dp flat gradient buffers
    // The most gradient bytes autograd holds at once (beyond a tied table's): all of them
    // unless something takes them as they are made.
    int64_t grad_unit_max = stage_params;
    // ZeRO-2/3 full-size buckets at the peak: gradient buffers in flight, gathered parameters.
    int64_t dp_in_flight = 0, dp_gathered = 0;
    int64_t shard = stage_params;  // ZeRO: the first (shared) DataParallel's shard
    if (dp_on) {
      params = opt = grad_persist = grad_unit_max = 0;
      // One DataParallel per group of parameters: the stage's, or under --ep the shared ones
      // over dp and this rank's experts over dp / ep, each keeping its own buckets gathered.
      struct Reduced {
        int64_t n;
        int ranks;
        int resident;  // ZeRO-3 buckets kept gathered
      };
      std::vector<Reduced> groups;
      if (ep) {
        groups.push_back({stage_params - stage_experts, p.dp, kZero3ResidentBuckets});
        groups.push_back({stage_experts, p.dp / p.ep, zero3_resident_buckets(p, c)});
      } else {
        groups.push_back({stage_params, p.dp, zero3_resident_buckets(p, c)});
      }
      for (size_t g = 0; g < groups.size(); ++g) {
        const auto [n, ranks, resident] = groups[g];
        // DataParallel buckets (parallel/data_parallel.cc): filled in reverse registration
        // order, closed when they reach bucket_mb (ZeRO-2/3: at most 1/16 of the group's
        // bytes), each padded to a multiple of the group's ranks. A bucket closes on the
        // parameter that reaches the size: a block matrix or more.
        int64_t bucket = static_cast<int64_t>(p.bucket_mb * 1048576.0) / e;
        if (p.zero >= 2) bucket = std::min(bucket, n / kMinShardedBuckets);
        bucket = std::max<int64_t>(bucket, 1);
        const int64_t bucket_typical = std::min(n, std::max(bucket, ps.largest_block));
        const int64_t n_buckets = std::max<int64_t>(1, ceil_div(n, bucket));
        const int64_t padded = n + n_buckets * (ranks - 1);
        const int64_t own = ceil_div(padded, ranks);
        if (g == 0) shard = own;
        params += p.zero == 3 ? own : padded;
        opt += (p.zero >= 1 ? own : padded) * opt_bytes_per / e;
        grad_persist += p.zero >= 2 ? own : padded;
        // Parameters' own gradients wait for their bucket to launch (all of them with one
        // bucket): the bucket being filled is one bucket's worth.
        grad_unit_max += p.zero >= 2 || n_buckets > 1 ? bucket_typical : n;
        // ZeRO-2/3: each launch allocates the bucket's full-size buffer, at most kMaxInFlight.
        if (p.zero >= 2) dp_in_flight += kMaxInFlight * bucket_typical;
        if (p.zero == 3) {
          // `resident` buckets stay gathered; at the ends of the model (where the peak is) one
          // of the first group's holds the vocabulary table or head, a bucket of its own as it
          // passes the size.
          const int64_t gathered = std::min<int64_t>(n_buckets, resident);
          const bool ends = g == 0 && (first || last);
          dp_gathered += (ends ? std::max(bucket_typical, ps.largest) : bucket_typical) +
                         (gathered - 1) * bucket_typical;
        }
      }
    }
    if (offload) {
      // engine/offload: parameters, gradients and AdamW states move into chunks, which the
      // chunk manager allocates itself (outside the allocator; chunks_device / host / nvme).
      // What stays in the allocator: a gradient from autograd until its grad-ready hook copies
      // it into its chunk (one parameter at a time; a tied table's all backward long), and
      // under dp the host buffers chunks are averaged and broadcast through.
      // Under tp / pp each rank chunks its own shard or stages (the whole model otherwise).
      const int64_t P = p.tp > 1 || p.pp > 1 ? stage_params : models::count_parameters(c);
      {
        std::vector<int64_t>& t = m.offload_tensors;
        // The tied table is packed first (model order); the first stage reads it as the
        // embedding, the last as the LM head after its blocks.
        const bool tied = (first || last) && ps.tied > 0;
        if (tied) t.push_back(ps.tied * e);
        if (tied && first) m.offload_uses.push_back(0);
        if (first && ps.embed > 0) t.push_back(ps.embed * e);
        const int pieces = std::max(
            1, static_cast<int>(models::family_spec(c.family).time_shape.calls.param_tensors));
        const int64_t block = ps.block_shard - freed_block;
        const int64_t big = std::min(ps.largest_block, block);
        for (int64_t b = 0; b < blocks; ++b) {
          t.push_back(big * e);
          for (int k = 1; k < pieces; ++k)
            t.push_back((block - big) / (pieces - 1) * e +
                        (k == 1 ? (block - big) % (pieces - 1) * e : 0));
        }
        if (last && ps.head > 0) t.push_back(ps.head * e);
        for (int i = tied ? 1 : 0; i < static_cast<int>(t.size()); ++i)
          if (t[static_cast<size_t>(i)] > 0) m.offload_uses.push_back(i);
        if (tied && last) m.offload_uses.push_back(0);
        m.offload_largest = t.empty() ? 0 : *std::max_element(t.begin(), t.end());
      }
      // The runtime's chunk size (memory/chunks/layout.h): the largest parameter, or
      // --chunk-mb with larger ones spanning chunks when the budgets are cramped.
      const int64_t chunk = memory::chunks::choose_chunk_bytes(
                                static_cast<int64_t>(p.chunk_mb * 1048576.0),
                                std::max(ps.largest * e, m.offload_largest), p.device_mem,
                                p.offload == "none" ? 4 : 2, p.host_mem, p.offload == "nvme",
                                p.dp == 1 && p.device != "cuda" && p.auto_device_mem == 0)
                                .chunk_bytes;
      const int64_t chunks = std::max<int64_t>(1, ceil_div(P * e, chunk));
      const int64_t states_all = P * opt_bytes_per;
      const int64_t states =
          p.dp > 1 ? std::min(states_all, ceil_div(states_all, p.dp) + 2 * chunk) : states_all;
      m.chunks_device = 2 * P * e + (p.offload == "none" ? states : 0);
      if (p.device_mem > 0) m.chunks_device = std::min(m.chunks_device, p.device_mem);
      m.host = p.offload == "host" ? states : 0;
      if (p.offload == "nvme") {
        m.nvme = states;
        m.host = 2 * chunk;
      }
      // Homes (memory/chunks ChunkManager::finalize): the lists whose first choice is the
      // device live there when they all fit --device-mem, else on the host; CUDA's host-update
      // flow (optimizer states off the device) homes parameters and gradients on the host.
      const bool host_update = p.device == "cuda" && p.offload != "none";
      const std::string param_home = p.offload_params != "none" ? p.offload_params
                                     : host_update              ? "host"
                                                                : "device";
      const int64_t device_wanted =
          (param_home == "device" ? 2 * P * e : 0) + (p.offload == "none" ? states : 0);
      const bool fits = p.device_mem == 0 || device_wanted <= p.device_mem;
      auto tier_of = [&](const std::string& home) {
        return home == "nvme"                                  ? kNvmeTier
               : home == "host" || (home == "device" && !fits) ? kHostTier
                                                               : kDeviceTier;
      };
      const int pt = tier_of(param_home);
      m.homes[pt].params = P * e;
      m.homes[pt].grads = P * e;
      m.homes[tier_of(p.offload == "none" ? "device" : p.offload)].optimizer = states;
      if (p.offload_params == "host") m.host += 2 * P * e;
      if (p.offload_params == "nvme") m.nvme += 2 * P * e;
      params = 0;
      opt = 0;
      grad_unit_max = ps.largest_block;
      if (p.dp > 1) m.buffers += std::min<int64_t>(kOffloadCommBuffers, chunks) * chunk;
    }
    // Bytes, from here on.
    params *= e;
    opt *= e;
    grad_persist *= e;
    grad_unit_max *= e;
    dp_in_flight *= e;
    dp_gathered *= e;
    const int64_t block_grad = ps.block_shard * e;
    // Gradients autograd has made and nothing has taken yet, after k blocks of backward. The
    // head's come first (the last stage); a tied table's gradient waits for the embedding's
    // contribution (and under dp it is in the last bucket launched), so it stays all along.
    const int64_t tied_grad = last ? ps.tied * e : 0;
    const int64_t head_grad = last ? ps.head * e : 0;
    auto made = [&](int64_t k) {
      return tied_grad + std::min(head_grad + k * block_grad, grad_unit_max);
    };
    // In the head's backward its weight gradients are live whole, before a hook or a bucket
    // takes them (an untied head's table is larger than a bucket or a block's parameters).
    const int64_t head_made = tied_grad + head_grad;
    const int64_t stage_grad = stage_params * e;

    // ---- activations at each moment ----
    const int64_t mb = in_flight(p, s);
    const int64_t M = p.grad_accum;
    const int64_t per_mb = (blocks - recomputed) * a.block + recomputed * a.block_recompute +
                           (first ? a.embed : 0) + (last ? a.head : 0);
    // Pipeline transfers (parallel/pipeline/stage.cc): every tensor sent is held until the
    // step's last action, so a stage keeps every micro-batch's output it sent forward, and the
    // input gradients it sent back for the micro-batches whose backward ran (all but those
    // still in flight at the peak); receives are posted kLookahead actions ahead.
    if (p.pp > 1) {
      constexpr int kLookahead = 3;
      m.buffers += ((last ? 0 : M) + (first ? 0 : M - mb) + kLookahead) * a.boundary;
    }
    // A recomputed block re-runs whole in its backward.
    const int64_t recompute_live = recomputed > 0 ? a.block : 0;
    // Saved bytes of the top k blocks (backward runs them first; recompute covers the first
    // blocks, so the top ones keep everything).
    auto top_saved = [&](int64_t k) {
      const int64_t whole = std::min(k, blocks - recomputed);
      return whole * a.block + (k - whole) * a.block_recompute;
    };
    const int64_t dropped_head = last ? a.head : 0;
    // A tied table's embedding scatter is added into the head's gradient of it (a transient of
    // its size); a first-only pipeline stage's embedding gradient is new at the end.
    const int64_t embed_grad = first ? (ps.embed + (last ? 0 : ps.tied)) * e : 0;

    int64_t act_peak = 0, grad_at_peak = 0, temp_at_peak = 0, buf_at_peak = 0, best = -1;
    auto consider = [&](int64_t act, int64_t grads, int64_t temp, int64_t buf) {
      if (act + grads + temp + buf > best) {
        best = act + grads + temp + buf;
        act_peak = act;
        grad_at_peak = grads;
        temp_at_peak = temp;
        buf_at_peak = buf;
      }
    };
    // One backward's moments with `n` micro-batches' activations live and `base` gradient
    // bytes there from earlier micro-batches. On the last stage of a pipeline other than gpipe
    // each micro-batch's backward follows its forward, so one set of logits is live.
    auto backward_moments = [&](int64_t n, int64_t base) {
      const int64_t acts =
          n * per_mb - (last && p.pp > 1 && p.pp_schedule != "gpipe" ? (n - 1) * a.head : 0);
      if (last) {
        consider(acts, base, a.head_fwd, dp_gathered);                       // loss computed
        consider(acts, std::max(base, head_made), a.head_bwd, dp_gathered);  // head backward
      }
      if (blocks > 0) {
        // First and last block of this stage's backward (blocks done: 0 and blocks - 1).
        consider(acts - dropped_head, std::max(base, made(0)),
                 a.block_bwd + (recomputed == blocks ? recompute_live : 0),
                 dp_gathered + dp_in_flight / kMaxInFlight);
        consider(std::max<int64_t>(acts - dropped_head - top_saved(blocks - 1), 0),
                 std::max(base, made(blocks - 1)),
                 a.block_bwd + (recomputed > 0 ? recompute_live : 0), dp_gathered + dp_in_flight);
      }
      // Backward end: every gradient.
      const int64_t end_grads = std::max(
          base, tied_grad + std::min(head_grad + blocks * block_grad + embed_grad, grad_unit_max));
      consider(std::max<int64_t>(acts - dropped_head - top_saved(blocks), 0), end_grads,
               first && last && ps.tied > 0 ? ps.tied * e : 0, dp_gathered + dp_in_flight);
    };
    // The first backward of the step, with no gradients yet (the micro-batches in flight:
    // gpipe all, 1f1b pp - stage), then the next one, which adds into every gradient of the
    // stage with one micro-batch fewer in flight (gpipe) or as many (1f1b's steady state).
    backward_moments(p.pp > 1 ? mb : 1, 0);
    if (M > 1 && !offload) {
      const int64_t n = p.pp == 1 ? 1 : (p.pp_schedule == "gpipe" ? M - 1 : std::min(mb, M - 1));
      backward_moments(n, stage_grad);
    }
    // After the step's backward the global norm squares each gradient it counts into a
    // temporary (engine/optim grad_sq_sum), the largest a vocabulary table's (under ZeRO its
    // shard segment); the gradients are the parameters' own unless dp or offload took them.
    const int64_t largest = first || last ? ps.largest : ps.largest_block;
    const int64_t norm_temp = (dp_on && p.zero >= 1 ? std::min(largest, shard) : largest) * e;
    consider(0, dp_on || offload ? 0 : stage_grad, norm_temp, p.zero == 3 ? dp_gathered : 0);

    m.params = params;
    m.optimizer = opt;
    m.grads = grad_persist + grad_at_peak;
    if (!offload) {
      // Held across the step: dp's flat buffers (ZeRO-2/3: the shard), else every gradient.
      m.homes[kDeviceTier] = {params, grad_persist > 0 ? grad_persist : stage_grad, opt};
    }
    if (p.zero3_shards_on_nvme()) {
      // The shards live in the chunk manager (outside the allocator): homed on NVMe, cached on
      // the device up to --device-mem; what stays in the allocator is the gathered buckets.
      const int64_t shard_bytes = shard * e;
      m.params -= shard_bytes;
      m.homes[kDeviceTier].params = 0;
      m.homes[kNvmeTier].params = shard_bytes;
      m.nvme = shard_bytes;
      m.chunks_device = p.device_mem > 0 ? std::min(shard_bytes, p.device_mem) : shard_bytes;
    }
    m.activations = act_peak;
    m.buffers += buf_at_peak;
    // The micro-batch's ids and targets (i64) on the device, position ids; a pipeline keeps
    // every micro-batch of the step as one row of seq_len + 1 ids.
    const int64_t ids = p.micro_batch * p.seq_len * 8;
    m.temporaries = temp_at_peak + kFixedSmall + 2 * ids + p.seq_len * 8 +
                    (p.pp > 1 ? M * (ids + p.micro_batch * 8) : 0);
    m.device_peak =
        m.params + m.grads + m.optimizer + m.activations + m.buffers + m.temporaries + m.model_copy;
    out.stages.push_back(m);
  }
  return out;
}

}  // namespace mammoth::plan
