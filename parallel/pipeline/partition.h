// Cutting a model's layers into pipeline stages.
//
// A stage's time is the sum of its layers' costs plus, on the first stage, the embeddings and,
// on the last, the head. Cutting by layer count ignores the head, which for language models is
// large (GPT-2 small: the LM head is ~5 blocks of FLOPs), so the last stage becomes the
// bottleneck of every schedule. balanced_partition picks contiguous cuts that minimise the
// largest stage cost (exactly, by dynamic programming over cut points), every stage keeping at
// least one layer.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace mammoth::parallel::pipeline {

// Stage s holds layers [bounds[s], bounds[s + 1]); bounds.front() == 0, bounds.back() == L.
using Partition = std::vector<int64_t>;

// Equal layer counts (the first stages take one more when they do not divide).
Partition partition_by_count(int64_t layers, int stages);

// Minimises max over stages of (sum of layer_cost in it + first_extra on stage 0 + last_extra on
// the last stage). Throws naming the sizes when there are fewer layers than stages or a cost is
// negative.
Partition balanced_partition(const std::vector<double>& layer_cost, double first_extra,
                             double last_extra, int stages);

// The largest stage cost of a partition (the pipeline's bottleneck), under the same costs.
double max_stage_cost(const Partition& p, const std::vector<double>& layer_cost, double first_extra,
                      double last_extra);

// "count" or "balanced"; throws naming the value otherwise.
bool partition_is_balanced(const std::string& name);

}  // namespace mammoth::parallel::pipeline
