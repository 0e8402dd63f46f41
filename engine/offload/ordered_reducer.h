// The gradient-reduction protocol of data parallelism, one implementation for
// parallel::DataParallel (its buckets, every ZeRO stage) and engine/offload's Offload (its
// chunks under dp): a unit (bucket, chunk) is launched once all its parameters' gradients are
// final (readiness counting), strictly in one fixed order, so every rank posts the same
// collectives in the same order whatever order its gradients became final in; at most
// `max_in_flight` operations are outstanding (the oldest is completed before another is
// posted; 0: no bound), and they complete oldest first: wait, then whatever the owner releases
// (copy a result back into its home, free a full-size buffer). The owner's launch callback
// does the copying into the buffer and posts the collective.
#pragma once

#include <cstddef>
#include <deque>
#include <functional>
#include <vector>

namespace mammoth::engine::offload {

class OrderedReducer {
 public:
  struct Op {
    std::function<bool()> test;      // progresses the collective; true once it is done
    std::function<void()> complete;  // waits for it, then releases
  };
  // order: the units in launch order; need[u]: how many ready() calls make unit u ready.
  OrderedReducer(std::vector<int> order, std::vector<int> need, int max_in_flight,
                 std::function<Op(int unit)> launch);

  // A synchronised backward begins: nothing ready, nothing launched.
  void begin();
  // One more piece of `unit` is final; launches every unit the order now allows.
  void ready(int unit);
  // Launches, in order, every unit not launched yet (some pieces never became final).
  void launch_rest();
  // Posts an operation outside the order (a broadcast after the update) under the same bound.
  void post(Op op);
  // Tests the operations in flight, oldest first, for progress; with `complete_done`, completes
  // those at the front that are done.
  void poll(bool complete_done);
  void complete_oldest();
  void complete_all();
  // Completes the oldest operations until another may be posted (before an owner takes a buffer
  // that a completion would recycle).
  void make_room();
  bool all_launched() const { return next_ == order_.size(); }
  size_t in_flight() const { return in_flight_.size(); }

 private:
  std::vector<int> order_, need_, count_;
  size_t max_in_flight_;
  std::function<Op(int)> launch_;
  size_t next_ = 0;  // units launched so far (an index into order_)
  std::deque<Op> in_flight_;
};

}  // namespace mammoth::engine::offload
