// The profiler's recorder: a process-wide, off-by-default log of trace events for
// `mammoth train --profile DIR` (tools/cmd_train.cc), written as Chrome trace JSON.
//
// Off, a hook costs one relaxed atomic load and a predictable branch (on()): no lock, no
// allocation, no clock read. On, each thread appends fixed-size events to its own buffer,
// preallocated the first time that thread records while a session is on; a full buffer drops
// events and counts them (the trace says how many) rather than allocating.
//
// Events sit on lanes (Chrome "tid"s) by what they are: compute (kernels, optimizer, the
// step), communication (collectives and point-to-point, from the flight recorder), pipeline
// actions, I/O (chunk moves, NVMe reads and writes). Counters ("C" events) carry memory use.
#pragma once

#include <atomic>
#include <cstdint>
#include <string>
#include <vector>

namespace mammoth::profile {

enum class Lane : uint8_t { kCompute = 0, kComm = 1, kPipeline = 2, kIo = 3 };
const char* lane_name(Lane lane);

extern std::atomic<bool> g_on;
inline bool on() { return g_on.load(std::memory_order_relaxed); }

// steady_clock, in ns.
int64_t now_ns();

// Records a complete event [begin_ns, end_ns) named `name` (copied, truncated to 47 chars).
// `args` is the body of a JSON object ("\"bytes\":12,\"dtype\":\"f32\"", copied, truncated at
// 159 chars to the last whole member) or null.
void complete(Lane lane, const char* name, int64_t begin_ns, int64_t end_ns,
              const char* args = nullptr);
// Records counter `name` (a "C" event) at now with `value`.
void counter(const char* name, int64_t value);

// Times its scope as one complete event; args() may be filled while it lives.
class Scope {
 public:
  static constexpr size_t kArgs = 160;
  Scope(Lane lane, const char* name) : on_(on()), lane_(lane), name_(name) {
    if (on_) begin_ = now_ns();
  }
  ~Scope() {
    if (on_) complete(lane_, name_, begin_, now_ns(), args_[0] ? args_ : nullptr);
  }
  Scope(const Scope&) = delete;
  Scope& operator=(const Scope&) = delete;
  bool active() const { return on_; }
  char* args() { return args_; }

 private:
  bool on_;
  Lane lane_;
  const char* name_;
  int64_t begin_ = 0;
  char args_[kArgs] = {};
};

// Whether this thread is running autograd's backward pass (engine/autograd.cc sets it): kernel
// events say so, and the summary counts their GEMMs apart from the forward's.
extern thread_local bool t_backward;

class BackwardScope {
 public:
  BackwardScope() : prev_(t_backward) { t_backward = true; }
  ~BackwardScope() { t_backward = prev_; }
  BackwardScope(const BackwardScope&) = delete;
  BackwardScope& operator=(const BackwardScope&) = delete;

 private:
  bool prev_;
};

// The memory tracer: what each allocation made while a session is on is for, from the thread's
// current tag (MemTagScope), so that the peak can be split by purpose. Bytes already live when
// the session began are the baseline, split by the caller (parameters, gradients, optimizer
// states it knows of); frees of baseline blocks come off it.
enum class MemTag : uint8_t { kActivations, kGradients, kOptimizer, kTemporaries, kCount };
const char* mem_tag_name(MemTag tag);
extern thread_local MemTag t_mem_tag;  // kTemporaries unless a scope says otherwise

class MemTagScope {
 public:
  explicit MemTagScope(MemTag tag) : prev_(t_mem_tag) { t_mem_tag = tag; }
  ~MemTagScope() { t_mem_tag = prev_; }
  MemTagScope(const MemTagScope&) = delete;
  MemTagScope& operator=(const MemTagScope&) = delete;

 private:
  MemTag prev_;
};

// The allocator's hooks (call only while on()): a block of `bytes` at `p` made or freed.
void note_alloc(const void* p, int64_t bytes);
void note_free(const void* p, int64_t bytes);
// A block made under one tag that became another's (a backward's buffer adopted as a .grad).
void retag(const void* p, MemTag tag);

struct MemoryPeak {
  int64_t baseline = 0;                                   // live when the session began
  int64_t peak = 0;                                       // the largest total seen
  int64_t baseline_at_peak = 0;                           // baseline bytes still live at the peak
  int64_t by_tag[static_cast<int>(MemTag::kCount)] = {};  // made in the session, live at the peak
};
// Starts the tracer's accounting with `live_bytes` already allocated (call after start()).
void memory_begin(int64_t live_bytes);
MemoryPeak memory_peak();

// Module paths for op events: each parameter's data address and name ("h.1.mlp.c_fc.weight"),
// so that a view of it (a transpose, a reshape) is named too; set before a session starts,
// read without a lock while it runs. Paged parameters (offload) move and go unnamed.
void set_param_names(const std::vector<std::pair<const void*, std::string>>& params);
// The module of the parameter whose data starts at `data` ("h.1.mlp.c_fc"), or null.
const char* param_module(const void* data);

// Starts a session: clears what earlier sessions recorded; every thread's buffer holds up to
// `events_per_thread` events.
void start(size_t events_per_thread = size_t{1} << 16);
// Ends the session; what it recorded stays readable until the next start().
void stop();

// One recorded event, as the summary and the writer read it.
struct Event {
  int64_t ts_ns = 0;
  int64_t dur_ns = 0;  // complete events
  int64_t value = 0;   // counters
  Lane lane = Lane::kCompute;
  char ph = 'X';  // 'X' complete, 'C' counter
  char name[48] = {};
  char args[160] = {};
};

// Every event of the session, sorted by time, and how many were dropped.
std::vector<Event> events(int64_t* dropped = nullptr);

// The Chrome trace of `evs` as process `pid` (a rank): {"traceEvents": [...],
// "displayTimeUnit": "ms", "otherData": {...}}; timestamps are (ts_ns - origin_ns) in us.
std::string chrome_trace(const std::vector<Event>& evs, int pid, int64_t origin_ns,
                         int64_t dropped);

// Collectives across ranks, as the merge finds them: an operation (name, group, sequence number)
// whose event every member of its group recorded. It cannot move data before its last member
// posts it, so each member's event splits into waiting (from its own post to the last post) and
// transfer (from the last post to its completion). Per rank, over its matched collectives.
struct CollectiveSplit {
  std::vector<int64_t> wait_ns, transfer_ns;  // indexed by rank (pid)
  int64_t matched = 0;                        // operations every member recorded
  int64_t unmatched = 0;  // operations some member did not (outside its profiled steps)
};

// Merges per-rank traces written by chrome_trace() (their JSON texts, rank r's at index r)
// into one, adding "wait_us" and "transfer_us" to the args of every matched collective's
// events; `split` (if given) receives the per-rank totals.
std::string merge_traces(const std::vector<std::string>& traces, CollectiveSplit* split = nullptr);

// The class of a compute event, by its name and whether it ran in backward: "gemm forward",
// "gemm backward", "attention", "norms", "activations", "softmax / cross-entropy",
// "optimizer", "reductions", "embedding / indexing", "elementwise / copies".
const char* op_class(const char* name, bool backward);

// The profile's figures: top ops by time, compute vs exposed communication.
struct Summary {
  struct Op {
    std::string name;
    int64_t count = 0;
    int64_t total_ns = 0;
  };
  // Compute events by op_class, with the FLOPs and bytes their events report ("flops", "bytes"
  // args), from which a roofline bound follows: max(flops / peak FLOP/s, bytes / bandwidth).
  struct Class {
    std::string name;
    int64_t count = 0;
    int64_t total_ns = 0;
    double flops = 0, bytes = 0;
    // Seconds at a peak of `flops_per_s` and `bytes_per_s` (either 0: that term is left out).
    double bound_s(double flops_per_s, double bytes_per_s) const;
  };
  std::vector<Op> top_ops;     // by total time, longest first
  std::vector<Class> classes;  // by total time, longest first
  // Step time no other event covers (compute, communication, pipeline, I/O): the framework,
  // allocation, the data loader.
  int64_t outside_ops_ns = 0;
  int64_t steps = 0;
  int64_t step_ns = 0;          // the profiled steps' wall time
  int64_t compute_ns = 0;       // union of compute-lane events
  int64_t comm_ns = 0;          // union of communication events
  int64_t exposed_comm_ns = 0;  // communication not overlapped by compute
};
Summary summarize(const std::vector<Event>& evs, size_t top = 10);

}  // namespace mammoth::profile
