// The token stream the training tests learn from: ids (i * 7 + i / 31) % 48, repetitive enough
// that gpt2-tiny / llama-tiny (vocabulary 48) learn it in a few steps, written as a token shard.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "engine/data/token_shard.h"
#include "test/testing/test_dir.h"

namespace mammoth::testing {

// Writes `count` tokens of the stream to dir/name and returns the path.
inline std::string write_tiny_tokens(const TestDir& dir, const std::string& name = "data.bin",
                                     int count = 6000) {
  std::vector<int32_t> tokens;
  tokens.reserve(static_cast<size_t>(count));
  for (int i = 0; i < count; ++i) tokens.push_back((i * 7 + i / 31) % 48);
  const std::string path = dir.file(name);
  data::write_token_shard(path, tokens);
  return path;
}

}  // namespace mammoth::testing
