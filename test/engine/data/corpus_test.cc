// Tests for engine/data/corpus: the embedded default corpus is deterministic, plain text, and
// its BPE token stream is highly predictable from context (what lets a tiny GPT learn it fast).
#include "engine/data/corpus.h"

#include <catch2/catch.hpp>
#include <cmath>
#include <iostream>
#include <map>
#include <unordered_map>

#include "engine/data/bpe.h"

namespace mammoth::data {
namespace {

TEST_CASE("the default corpus is deterministic English-like text") {
  const std::string a = default_corpus();
  const std::string b = default_corpus();
  CHECK(a == b);
  CHECK(a.size() >= kDefaultCorpusBytes);
  CHECK(a.size() < kDefaultCorpusBytes + 4096);
  CHECK(default_corpus(1 << 16, 1) != default_corpus(1 << 16, 2));
  CHECK(
      std::all_of(a.begin(), a.end(), [](char c) { return c == '\n' || (c >= ' ' && c <= '~'); }));
  const auto docs = default_corpus_documents(50000);
  CHECK(docs.size() > 30);
  for (const std::string& d : docs) {
    CHECK(d.rfind("Once upon a time, there was ", 0) == 0);
    CHECK(d.back() == '.');
    CHECK(d.find(" a old") == std::string::npos);  // articles agree
  }
}

// Cross-entropy (nats/token) on `test` of add-alpha smoothed n-gram models fitted on `train`.
double unigram_xent(const std::vector<int32_t>& train, const std::vector<int32_t>& test, int v) {
  std::vector<double> c(v, 0.5);
  for (int32_t t : train) c[t] += 1;
  const double total = static_cast<double>(train.size()) + 0.5 * v;
  double nll = 0;
  for (int32_t t : test) nll -= std::log(c[t] / total);
  return nll / static_cast<double>(test.size());
}

double bigram_xent(const std::vector<int32_t>& train, const std::vector<int32_t>& test, int v) {
  std::unordered_map<int64_t, double> pair;
  std::vector<double> ctx(v, 0);
  for (size_t i = 1; i < train.size(); ++i) {
    pair[int64_t{train[i - 1]} * v + train[i]] += 1;
    ctx[train[i - 1]] += 1;
  }
  const double alpha = 0.01;
  double nll = 0;
  for (size_t i = 1; i < test.size(); ++i) {
    auto it = pair.find(int64_t{test[i - 1]} * v + test[i]);
    const double n = it == pair.end() ? 0 : it->second;
    nll -= std::log((n + alpha) / (ctx[test[i - 1]] + alpha * v));
  }
  return nll / static_cast<double>(test.size() - 1);
}

TEST_CASE("a BPE of the default corpus gives a predictable token stream") {
  const std::string text = default_corpus();
  const BpeTokenizer tok = BpeTokenizer::train({text}, 512);
  const std::vector<int32_t> ids = tok.encode(text);
  const size_t cut = ids.size() * 9 / 10;
  const std::vector<int32_t> train(ids.begin(), ids.begin() + cut),
      test(ids.begin() + cut, ids.end());
  const double uniform = std::log(static_cast<double>(tok.vocab_size()));
  const double h1 = unigram_xent(train, test, tok.vocab_size());
  const double h2 = bigram_xent(train, test, tok.vocab_size());
  std::cout << "[corpus_test] " << text.size() << " bytes -> " << ids.size() << " tokens ("
            << static_cast<double>(text.size()) / ids.size() << " bytes/token); held-out loss "
            << "uniform " << uniform << ", unigram " << h1 << ", bigram " << h2 << " nats\n";
  CHECK(static_cast<double>(text.size()) / ids.size() > 3.0);
  // Context carries most of the information: the loss a model can reach with one token of
  // context is far below what it starts from.
  CHECK(h1 < 0.8 * uniform);
  CHECK(h2 < 0.5 * h1);
}

}  // namespace
}  // namespace mammoth::data
