#include "engine/offload/ordered_reducer.h"

#include <utility>

#include "base/error.h"

namespace mammoth::engine::offload {

OrderedReducer::OrderedReducer(std::vector<int> order, std::vector<int> need, int max_in_flight,
                               std::function<Op(int unit)> launch)
    : order_(std::move(order)),
      need_(std::move(need)),
      count_(need_.size(), 0),
      max_in_flight_(static_cast<size_t>(max_in_flight)),
      launch_(std::move(launch)) {
  MAMMOTH_CHECK(max_in_flight >= 0) << "[reducer] max_in_flight must be >= 0";
  MAMMOTH_CHECK(order_.size() == need_.size())
      << "[reducer] " << order_.size() << " units in the order but " << need_.size() << " counts";
}

void OrderedReducer::begin() {
  MAMMOTH_CHECK(in_flight_.empty()) << "[reducer] a backward began with collectives in flight";
  next_ = 0;
  std::fill(count_.begin(), count_.end(), 0);
}

void OrderedReducer::make_room() {
  while (max_in_flight_ > 0 && in_flight_.size() >= max_in_flight_) complete_oldest();
}

void OrderedReducer::ready(int unit) {
  ++count_[static_cast<size_t>(unit)];
  while (next_ < order_.size()) {
    const int u = order_[next_];
    if (count_[static_cast<size_t>(u)] < need_[static_cast<size_t>(u)]) return;
    make_room();
    in_flight_.push_back(launch_(u));
    ++next_;
  }
}

void OrderedReducer::launch_rest() {
  for (; next_ < order_.size(); ++next_) {
    make_room();
    in_flight_.push_back(launch_(order_[next_]));
  }
}

void OrderedReducer::post(Op op) {
  make_room();
  in_flight_.push_back(std::move(op));
}

void OrderedReducer::poll(bool complete_done) {
  bool front = true;  // every operation before this one was completed by this poll
  for (size_t i = 0; i < in_flight_.size();) {
    const bool done = in_flight_[i].test && in_flight_[i].test();
    if (complete_done && done && front) {
      complete_oldest();  // i stays 0: the next one moved to the front
      continue;
    }
    front = false;
    ++i;
  }
}

void OrderedReducer::complete_oldest() {
  MAMMOTH_CHECK(!in_flight_.empty()) << "[reducer] nothing in flight to complete";
  Op op = std::move(in_flight_.front());
  in_flight_.pop_front();
  op.complete();
}

void OrderedReducer::complete_all() {
  while (!in_flight_.empty()) complete_oldest();
}

}  // namespace mammoth::engine::offload
