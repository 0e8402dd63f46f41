// The embedded default corpus: what `mammoth train` learns from when no --data is given.
//
// Nothing is downloaded or shipped as a blob: a small grammar writes short children's stories
// (characters with consistent names and pronouns, places, objects, dialogue, counting) from a
// fixed seed, so every build produces the same bytes. The text is English-like with a narrow
// vocabulary and a strong structure, so a byte-level BPE of 512-1024 tokens compresses it well
// and a tiny GPT's loss falls visibly within a minute on a CPU.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace mammoth::data {

inline constexpr size_t kDefaultCorpusBytes = size_t{1} << 20;
inline constexpr uint64_t kDefaultCorpusSeed = 20240520;

// Stories of at least `min_bytes` in total (the last story is completed, so slightly more).
std::vector<std::string> default_corpus_documents(size_t min_bytes = kDefaultCorpusBytes,
                                                  uint64_t seed = kDefaultCorpusSeed);

// The same stories joined by blank lines.
std::string default_corpus(size_t min_bytes = kDefaultCorpusBytes,
                           uint64_t seed = kDefaultCorpusSeed);

}  // namespace mammoth::data
