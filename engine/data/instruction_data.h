// Instruction (supervised fine-tuning) data: JSONL conversations rendered with a model
// directory's chat template, tokenized, packed into --seq-len bins, with a loss mask.
//
// Each line is one example, either
//   {"messages": [{"role": "system"|"user"|"assistant", "content": "..."}, ...]}
//   {"prompt": "...", "response": "..."}      (read as one user and one assistant message)
// and any other key is refused, naming the line. The conversation is cut into segments by
// rendering it incrementally (chat_template.h): for the assistant message i, the prompt segment
// is render(messages[:i], add_generation_prompt) past what the earlier segments cover, and its
// response segment is render(messages[:i + 1]) past that, so the response includes what the
// template closes a turn with (<|eot_id|>, <|im_end|>, </s>): the model learns to stop. A
// template whose renderings are not prefixes of one another (one that moves the system prompt
// into the last user turn, say) is refused. Each segment is tokenized on its own without added
// special tokens (the template writes them), as a prompt is tokenized at inference.
// Without a chat template, prompt/response examples are the prompt's tokens, then the
// response's and eos; messages examples are refused.
//
// Packing: examples go in order into bins of seq_len tokens; one that does not fit the rest of
// a bin starts the next (the rest padded with eos, or 0, as padding). An example longer than
// seq_len is cut to seq_len; one left with no response token is dropped; both are counted. A
// bin starts with an example's first token, which is never a response token, so the one
// target a training window takes from the next bin is always masked.
//
// Files (DIR): train_000000.bin (the tokens, an llm.c shard), train_000000.loss_mask (an llm.c
// shard of each token's part: 0 padding, 1 prompt / template, 2 response) and
// instructions.json (format, seq_len, counts). One token of padding ends the stream so that
// the last bin is a whole training window.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "engine/data/chat_template.h"
#include "engine/data/token_shard.h"
#include "engine/data/tokenizer.h"

namespace mammoth::data {

enum class TokenPart : uint8_t { kPadding = 0, kPrompt = 1, kResponse = 2 };

struct InstructionExample {
  std::vector<ChatMessage> messages;
  bool prompt_response = false;  // given as {"prompt", "response"}
};

// The examples of a JSONL file (blank lines skipped); throws naming the file and line.
std::vector<InstructionExample> read_instruction_jsonl(const std::string& path);

struct TokenizedExample {
  std::vector<int32_t> tokens;
  std::vector<TokenPart> parts;  // per token
};

// `chat` may be null (no chat template: prompt/response examples only).
TokenizedExample tokenize_example(const InstructionExample& example, const Tokenizer& tokenizer,
                                  const ChatTemplate* chat);

struct InstructionDataOptions {
  std::vector<std::string> jsonl_files;
  std::string out_dir;
  int64_t seq_len = 0;
  bool verbose = true;
};

struct InstructionDataResult {
  int64_t examples = 0, dropped = 0, truncated = 0;
  int64_t bins = 0, tokens = 0, response_tokens = 0;
  std::string tokens_path, loss_mask_path;
};

// Tokenizes, packs and writes the files above. `chat` may be null.
InstructionDataResult build_instruction_data(const InstructionDataOptions& options,
                                             const Tokenizer& tokenizer, const ChatTemplate* chat);
// The same with a model directory's tokenizer and chat template (none when it has none).
InstructionDataResult build_instruction_data(const InstructionDataOptions& options,
                                             const std::string& model_dir);

// Instruction data written by build_instruction_data, opened for training.
struct InstructionData {
  TokenDataset tokens;
  TokenDataset loss_mask;  // the parts, as ids
  int64_t seq_len = 0;
  int64_t vocab_size = 0;  // the tokenizer's
};
// Whether DIR holds instructions.json.
bool is_instruction_dir(const std::string& dir);
InstructionData open_instruction_data(const std::string& dir);

}  // namespace mammoth::data
