// `mammoth data`: text files in, llm.c token shards and their tokenizer out.
//
//   mammoth data --out DIR [--vocab-size 1024 | --vocab-json F --merges F | --tokenizer HF_DIR]
//                TEXT...
//
// Each TEXT is a file, a directory (its regular files, sorted) or a glob ("books/*.txt").
// With --tokenizer the model directory's own tokenizer (tokenizer.json, or vocab.json +
// merges.txt; engine/data/tokenizer.h) encodes the text and its files are copied beside the
// shards. Otherwise, without --vocab-json/--merges a byte-level BPE of --vocab-size is trained
// on the text and saved beside the shards as vocab.json/merges.txt (GPT-2's two-file format);
// with them, the given vocabulary (e.g. GPT-2's own) is used and copied there. With no TEXT at
// all the embedded default corpus is tokenized. Shards hold uint16 ids, uint32 when the
// vocabulary exceeds 65536. `mammoth train --data DIR/train_*.bin` reads the result.
//
// Instruction data: when every TEXT is a .jsonl file of chat messages or prompt/response pairs
// (engine/data/instruction_data.h), the --tokenizer directory's tokenizer and chat template
// render and tokenize it, packed into --seq-len bins with a loss mask (which tokens are the
// responses); `mammoth train --data DIR --seq-len N` trains on it with the same N.
#include <glob.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "absl/flags/declare.h"
#include "absl/flags/flag.h"
#include "base/error.h"
#include "base/thread_pool.h"
#include "engine/data/build_shards.h"
#include "engine/data/image_shard.h"
#include "engine/data/instruction_data.h"
#include "engine/data/tokenizer.h"
#include "tools/command.h"

ABSL_DECLARE_FLAG(int64_t, seed);

ABSL_FLAG(std::string, out, "",
          "output: the directory for shards and vocab (data), the .svg file (plot)");
ABSL_FLAG(std::string, vocab_json, "", "an existing GPT-2 style vocab.json (with --merges)");
ABSL_FLAG(std::string, merges, "", "an existing GPT-2 style merges.txt (with --vocab-json)");
ABSL_FLAG(std::string, tokenizer, "",
          "data/generate/eval: a Hugging Face model or tokenizer directory whose tokenizer "
          "(tokenizer.json, else vocab.json + merges.txt) encodes text (generate/eval default: "
          "the --model directory's)");
ABSL_DECLARE_FLAG(std::string, model);
ABSL_FLAG(std::string, shard_size, "100M", "tokens per shard file (K/M/G suffixes accepted)");
ABSL_FLAG(std::string, train_max_bytes, "256M",
          "text bytes the tokenizer is trained on at most (K/M/G suffixes accepted)");
// Shared with `mammoth train` (one flag namespace per binary): --vocab-size, --val-fraction and
// --threads mean the same thing there.
ABSL_DECLARE_FLAG(int, vocab_size);
ABSL_DECLARE_FLAG(double, val_fraction);
ABSL_DECLARE_FLAG(int, threads);
ABSL_DECLARE_FLAG(int64_t, seq_len);
ABSL_FLAG(bool, quiet, false, "no progress lines");
ABSL_FLAG(int64_t, synthetic_images, 0,
          "instead of text: write N synthetic labelled images for ViT to --out/images.bin");
ABSL_FLAG(int64_t, image_classes, 10, "--synthetic-images: number of classes");
ABSL_FLAG(int64_t, image_size, 32, "--synthetic-images: height and width");
ABSL_FLAG(int64_t, image_channels, 3, "--synthetic-images: channels");

namespace mammoth::tools {

namespace fs = std::filesystem;

// Shared by generate and eval: --tokenizer, else the --model directory's tokenizer, checked
// against the model's vocabulary of `model_vocab` ids.
data::Tokenizer text_tokenizer(int64_t model_vocab, const char* command) {
  std::string dir = absl::GetFlag(FLAGS_tokenizer);
  if (dir.empty()) {
    dir = absl::GetFlag(FLAGS_model);
    MAMMOTH_CHECK(fs::is_directory(dir))
        << "[" << command << "] text needs a tokenizer: --model '" << dir
        << "' is not a model directory, so pass --tokenizer DIR (a directory with "
           "tokenizer.json, or vocab.json + merges.txt)";
  }
  data::Tokenizer tok = data::Tokenizer::from_directory(dir);
  MAMMOTH_CHECK(tok.vocab_size() <= model_vocab)
      << "[" << command << "] the tokenizer (" << tok.describe() << ") has more ids than the "
      << "model's vocabulary of " << model_vocab;
  std::fprintf(stderr, "[%s] tokenizer: %s\n", command, tok.describe().c_str());
  return tok;
}

namespace {

// "100M" -> 100'000'000; the option name goes into the error.
int64_t parse_size(const std::string& text, const char* option) {
  MAMMOTH_CHECK(!text.empty()) << "[data] --" << option << " is empty";
  int64_t mult = 1;
  std::string digits = text;
  switch (text.back()) {
    case 'K':
    case 'k':
      mult = 1'000;
      break;
    case 'M':
    case 'm':
      mult = 1'000'000;
      break;
    case 'G':
    case 'g':
      mult = 1'000'000'000;
      break;
    default:
      break;
  }
  if (mult != 1) digits.pop_back();
  size_t used = 0;
  int64_t v = 0;
  try {
    v = std::stoll(digits, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  MAMMOTH_CHECK(used == digits.size() && used > 0 && v > 0)
      << "[data] --" << option << " must be a positive count like 1000, 64K or 100M, got '" << text
      << "'";
  return v * mult;
}

// A file is itself, a directory its regular files, anything else a glob; each sorted.
std::vector<std::string> expand_inputs(const std::vector<std::string>& specs) {
  std::vector<std::string> files;
  for (const std::string& spec : specs) {
    std::error_code ec;
    if (fs::is_regular_file(spec, ec)) {
      files.push_back(spec);
      continue;
    }
    std::vector<std::string> found;
    if (fs::is_directory(spec, ec)) {
      for (const auto& e : fs::directory_iterator(spec)) {
        if (e.is_regular_file()) found.push_back(e.path().string());
      }
    } else {
      glob_t g{};
      const int rc = ::glob(spec.c_str(), 0, nullptr, &g);
      for (size_t i = 0; rc == 0 && i < g.gl_pathc; ++i) {
        if (fs::is_regular_file(g.gl_pathv[i], ec)) found.emplace_back(g.gl_pathv[i]);
      }
      ::globfree(&g);
    }
    MAMMOTH_CHECK(!found.empty()) << "[data] input '" << spec
                                  << "' is not a file and matches no file (directory or glob)";
    std::sort(found.begin(), found.end());
    files.insert(files.end(), found.begin(), found.end());
  }
  return files;
}

int run_data(const std::vector<std::string>& args) {
  const std::string out = absl::GetFlag(FLAGS_out);
  MAMMOTH_CHECK(!out.empty()) << "[data] --out DIR is required (where shards and vocab go)";
  if (const int64_t n = absl::GetFlag(FLAGS_synthetic_images); n > 0) {
    MAMMOTH_CHECK(args.empty()) << "[data] --synthetic-images takes no input files";
    fs::create_directories(out);
    const std::string path = out + "/images.bin";
    data::write_synthetic_image_shard(
        path, n, absl::GetFlag(FLAGS_image_classes), absl::GetFlag(FLAGS_image_channels),
        absl::GetFlag(FLAGS_image_size), static_cast<uint64_t>(absl::GetFlag(FLAGS_seed)));
    if (!absl::GetFlag(FLAGS_quiet))
      std::fprintf(stderr, "[data] wrote %s (%lld images)\n", path.c_str(),
                   static_cast<long long>(n));
    return 0;
  }
  const std::string vocab_json = absl::GetFlag(FLAGS_vocab_json);
  const std::string merges = absl::GetFlag(FLAGS_merges);
  MAMMOTH_CHECK(vocab_json.empty() == merges.empty())
      << "[data] give both --vocab-json and --merges, or neither to train a tokenizer (got "
      << "--vocab-json '" << vocab_json << "', --merges '" << merges << "')";
  const std::string tokenizer = absl::GetFlag(FLAGS_tokenizer);
  MAMMOTH_CHECK(tokenizer.empty() || vocab_json.empty())
      << "[data] --tokenizer and --vocab-json/--merges both name a tokenizer; give one";
  MAMMOTH_CHECK(tokenizer.empty() || fs::is_directory(tokenizer))
      << "[data] --tokenizer '" << tokenizer << "' is not a directory";
  for (const std::string* f : {&vocab_json, &merges}) {
    MAMMOTH_CHECK(f->empty() || fs::is_regular_file(*f))
        << "[data] tokenizer file '" << *f << "' does not exist";
  }
  set_num_threads(absl::GetFlag(FLAGS_threads));

  const std::vector<std::string> files = expand_inputs(args);
  const auto jsonl = [](const std::string& f) { return fs::path(f).extension() == ".jsonl"; };
  const size_t n_jsonl = static_cast<size_t>(std::count_if(files.begin(), files.end(), jsonl));
  if (n_jsonl > 0) {
    MAMMOTH_CHECK(n_jsonl == files.size())
        << "[data] instruction data (.jsonl) and plain text cannot be mixed in one run";
    MAMMOTH_CHECK(!tokenizer.empty())
        << "[data] instruction data (.jsonl) needs --tokenizer DIR: the model directory whose "
           "tokenizer and chat template render it";
    data::InstructionDataOptions io;
    io.jsonl_files = files;
    io.out_dir = out;
    io.seq_len = absl::GetFlag(FLAGS_seq_len);
    io.verbose = !absl::GetFlag(FLAGS_quiet);
    const data::InstructionDataResult r = data::build_instruction_data(io, tokenizer);
    std::printf(
        "%s: %lld examples -> %lld sequences of --seq-len %lld (%lld response tokens); train "
        "with --data %s --seq-len %lld\n",
        out.c_str(), static_cast<long long>(r.examples), static_cast<long long>(r.bins),
        static_cast<long long>(io.seq_len), static_cast<long long>(r.response_tokens), out.c_str(),
        static_cast<long long>(io.seq_len));
    return 0;
  }

  data::BuildShardsOptions o;
  o.text_files = files;
  o.out_dir = out;
  o.vocab_size = absl::GetFlag(FLAGS_vocab_size);
  o.vocab_json = vocab_json;
  o.merges_txt = merges;
  o.tokenizer_dir = tokenizer;
  o.val_fraction = absl::GetFlag(FLAGS_val_fraction);
  o.shard_tokens = parse_size(absl::GetFlag(FLAGS_shard_size), "shard-size");
  o.train_max_bytes = parse_size(absl::GetFlag(FLAGS_train_max_bytes), "train-max-bytes");
  o.verbose = !absl::GetFlag(FLAGS_quiet);
  const bool same_vocab = !vocab_json.empty() && fs::exists(out + "/vocab.json") &&
                          fs::equivalent(vocab_json, out + "/vocab.json");
  MAMMOTH_CHECK(!same_vocab) << "[data] --vocab-json " << vocab_json
                             << " is the output's own vocab.json; copy it elsewhere first";

  const data::BuildShardsResult r = data::build_shards(o);
  std::printf(
      "%s: %lld documents -> %lld train tokens in %zu shard(s), %lld validation tokens "
      "in %zu shard(s) (uint%d ids); vocabulary %d tokens (%s)\n",
      out.c_str(), static_cast<long long>(r.num_documents), static_cast<long long>(r.train_tokens),
      r.train_shards.size(), static_cast<long long>(r.val_tokens), r.val_shards.size(),
      8 * r.token_bytes, r.vocab_size, r.tokenizer_file.c_str());
  return 0;
}

}  // namespace

MAMMOTH_COMMAND(data,
                "tokenize text files into llm.c token shards (a model directory's tokenizer, or "
                "GPT-2 byte-level BPE)",
                run_data);

}  // namespace mammoth::tools
