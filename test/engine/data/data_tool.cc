// Command-line access to engine/data for the interop tests: bpe_interop_test.py checks our BPE
// files and token ids against Hugging Face `tokenizers`; format_interop_test.py checks token
// shards and indexed datasets against numpy code written from the format descriptions.
//
//   data_tool train VOCAB_SIZE VOCAB_JSON MERGES_TXT FILE...   learn a BPE from the files
//   data_tool encode VOCAB_JSON MERGES_TXT TEXT_FILE           ids, space separated, to stdout
//   data_tool decode VOCAB_JSON MERGES_TXT IDS_FILE            decoded bytes to stdout
//   data_tool pretokenize TEXT_FILE                            one pre-token per line, in GPT-2's
//                                                             byte alphabet (so no raw newlines)
//   data_tool classes                                          one letter (L, N, S, O) per code
//                                                             point 0..0x10FFFF
//   data_tool shard-write PATH IDS_FILE                        llm.c shard of the ids in the file
//   data_tool shard-dump PATH                                  its ids, space separated
//   data_tool indexed-write PREFIX DTYPE_CODE SPEC_FILE        Megatron dataset; SPEC_FILE has
//                                                             one sequence of ids per line and
//                                                             a line "doc" after each document
//   data_tool indexed-dump PREFIX                              "dtype CODE", then SPEC_FILE lines
//   data_tool hf-encode DIR TEXTS_JSON ADD_SPECIAL             a model directory's tokenizer:
//                                                             a JSON list of texts in, a JSON
//                                                             list of id lists out
//   data_tool hf-decode DIR IDS_JSON SKIP_SPECIAL              JSON id lists in, texts out
//   data_tool hf-info DIR                                      vocab size, bos, eos (JSON)
//   data_tool pretokenize-llama3 TEXT_FILE MAX_DIGITS          as pretokenize, Llama 3's split
#include <cstdio>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include "base/error.h"
#include "base/json.h"
#include "engine/data/bpe.h"
#include "engine/data/corpus.h"
#include "engine/data/indexed_dataset.h"
#include "engine/data/token_shard.h"
#include "engine/data/tokenizer.h"
#include "engine/data/unicode_class.h"

namespace {

using mammoth::data::BpeTokenizer;

std::vector<int32_t> parse_ids(const std::string& text) {
  std::istringstream in(text);
  std::vector<int32_t> ids;
  for (int64_t id; in >> id;) ids.push_back(static_cast<int32_t>(id));
  return ids;
}

std::string join_ids(const std::vector<int32_t>& ids) {
  std::string line;
  for (size_t i = 0; i < ids.size(); ++i) {
    if (i) line += ' ';
    line += std::to_string(ids[i]);
  }
  return line;
}

std::string read_all(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  MAMMOTH_CHECK(in.good()) << "[data_tool] cannot open '" << path << "'";
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

int usage() {
  std::cerr << "usage: data_tool train VOCAB_SIZE VOCAB_JSON MERGES_TXT FILE...|@default\n"
               "       data_tool encode VOCAB_JSON MERGES_TXT TEXT_FILE\n"
               "       data_tool decode VOCAB_JSON MERGES_TXT IDS_FILE\n"
               "       data_tool pretokenize TEXT_FILE\n"
               "       data_tool classes\n"
               "       data_tool shard-write PATH IDS_FILE\n"
               "       data_tool shard-dump PATH\n"
               "       data_tool indexed-write PREFIX DTYPE_CODE SPEC_FILE\n"
               "       data_tool indexed-dump PREFIX\n"
               "       data_tool hf-encode DIR TEXTS_JSON ADD_SPECIAL\n"
               "       data_tool hf-decode DIR IDS_JSON SKIP_SPECIAL\n"
               "       data_tool hf-info DIR\n"
               "       data_tool pretokenize-llama3 TEXT_FILE MAX_DIGITS\n";
  return 2;
}

int run(int argc, char** argv) {
  if (argc < 2) return usage();
  const std::string cmd = argv[1];
  if (cmd == "train" && argc >= 6) {
    std::vector<std::string> texts;
    for (int i = 5; i < argc; ++i) {
      // "@default" stands for the embedded default corpus.
      texts.push_back(std::string(argv[i]) == "@default" ? mammoth::data::default_corpus()
                                                         : read_all(argv[i]));
    }
    BpeTokenizer tok = BpeTokenizer::train(texts, std::stoi(argv[2]));
    tok.save(argv[3], argv[4]);
    std::cerr << "trained vocab " << tok.vocab_size() << " with " << tok.num_merges()
              << " merges\n";
    return 0;
  }
  if (cmd == "encode" && argc == 5) {
    BpeTokenizer tok = BpeTokenizer::load(argv[2], argv[3]);
    std::cout << join_ids(tok.encode(read_all(argv[4]))) << "\n";
    return 0;
  }
  if (cmd == "decode" && argc == 5) {
    BpeTokenizer tok = BpeTokenizer::load(argv[2], argv[3]);
    const std::string text = tok.decode(parse_ids(read_all(argv[4])));
    std::fwrite(text.data(), 1, text.size(), stdout);
    return 0;
  }
  if (cmd == "pretokenize" && argc == 3) {
    for (std::string_view p : mammoth::data::pretokenize(read_all(argv[2]))) {
      std::cout << mammoth::data::bytes_to_unicode(p) << "\n";
    }
    return 0;
  }
  if (cmd == "classes" && argc == 2) {
    std::string out(0x110000, 'O');
    for (uint32_t c = 0; c < 0x110000; ++c) {
      switch (mammoth::data::char_class(c)) {
        case mammoth::data::CharClass::kLetter:
          out[c] = 'L';
          break;
        case mammoth::data::CharClass::kNumber:
          out[c] = 'N';
          break;
        case mammoth::data::CharClass::kSpace:
          out[c] = 'S';
          break;
        case mammoth::data::CharClass::kOther:
          break;
      }
    }
    std::cout << out;
    return 0;
  }
  if (cmd == "shard-write" && argc == 4) {
    mammoth::data::write_token_shard(argv[2], parse_ids(read_all(argv[3])));
    return 0;
  }
  if (cmd == "shard-dump" && argc == 3) {
    const auto shard = mammoth::data::TokenShard::open(argv[2]);
    std::vector<int32_t> ids(static_cast<size_t>(shard.size()));
    for (int64_t i = 0; i < shard.size(); ++i) ids[i] = static_cast<int32_t>(shard.at(i));
    std::cout << join_ids(ids) << "\n";
    return 0;
  }
  if (cmd == "hf-encode" && argc == 5) {
    namespace json = mammoth::json;
    const auto tok = mammoth::data::Tokenizer::from_directory(argv[2]);
    const json::Value texts = json::parse_file(argv[3]);
    json::Value out = json::Value::array();
    for (const json::Value& t : texts) {
      json::Value ids = json::Value::array();
      for (int32_t id : tok.encode(t.as_string(), std::string(argv[4]) == "1")) ids.push_back(id);
      out.push_back(std::move(ids));
    }
    std::cout << json::dump(out) << "\n";
    return 0;
  }
  if (cmd == "hf-decode" && argc == 5) {
    namespace json = mammoth::json;
    const auto tok = mammoth::data::Tokenizer::from_directory(argv[2]);
    const json::Value lists = json::parse_file(argv[3]);
    json::Value out = json::Value::array();
    for (const json::Value& l : lists) {
      std::vector<int32_t> ids;
      for (const json::Value& id : l) ids.push_back(static_cast<int32_t>(id.as_int()));
      out.push_back(tok.decode(ids, std::string(argv[4]) == "1"));
    }
    std::cout << json::dump(out) << "\n";
    return 0;
  }
  if (cmd == "hf-info" && argc == 3) {
    namespace json = mammoth::json;
    const auto tok = mammoth::data::Tokenizer::from_directory(argv[2]);
    std::cout << json::dump(json::Value::object()
                                .set("vocab_size", tok.vocab_size())
                                .set("bos", tok.bos_id())
                                .set("eos", tok.eos_id())
                                .set("describe", tok.describe()))
              << "\n";
    return 0;
  }
  if (cmd == "pretokenize-llama3" && argc == 4) {
    const std::string text = read_all(argv[2]);
    const int digits = std::stoi(argv[3]);
    for (size_t pos = 0; pos < text.size();) {
      const size_t end = mammoth::data::next_pretoken_llama3(text, pos, digits);
      std::cout << mammoth::data::bytes_to_unicode(text.substr(pos, end - pos)) << "\n";
      pos = end;
    }
    return 0;
  }
  if (cmd == "indexed-write" && argc == 5) {
    mammoth::data::IndexedDatasetWriter w(
        argv[2], static_cast<mammoth::data::IndexedDType>(std::stoi(argv[3])));
    std::istringstream spec(read_all(argv[4]));
    for (std::string line; std::getline(spec, line);) {
      if (line == "doc") {
        w.end_document();
      } else {
        w.add_sequence(parse_ids(line));
      }
    }
    w.finalize();
    return 0;
  }
  if (cmd == "indexed-dump" && argc == 3) {
    const auto d = mammoth::data::IndexedDataset::open(argv[2]);
    std::cout << "dtype " << static_cast<int>(d.dtype()) << "\n";
    int64_t doc = 1;
    for (int64_t i = 0; i < d.num_sequences(); ++i) {
      std::cout << join_ids(d.get(i)) << "\n";
      while (doc <= d.num_documents() && d.document_index(doc) == i + 1) {
        std::cout << "doc\n";
        ++doc;
      }
    }
    return 0;
  }
  return usage();
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const mammoth::Error& e) {
    std::cerr << e.what() << "\n";
    return 1;
  }
}
