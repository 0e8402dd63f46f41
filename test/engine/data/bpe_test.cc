// Tests for engine/data/bpe: the byte alphabet, the GPT-2 pre-tokenizer, training, rank-ordered
// merging, the two-file format and its errors, and encoding speed. Agreement with Hugging Face
// `tokenizers` is checked by bpe_interop_test.py.
#include "engine/data/bpe.h"

#include <catch2/catch.hpp>
#include <chrono>
#include <iostream>
#include <set>
#include <string>
#include <vector>

#include "base/error.h"
#include "base/json.h"
#include "engine/data/corpus.h"
#include "engine/data/unicode_class.h"
#include "test/testing/test_dir.h"

namespace mammoth::data {
namespace {

using mammoth::testing::TestDir;

std::vector<std::string> split(std::string_view text) {
  std::vector<std::string> out;
  for (std::string_view p : pretokenize(text)) out.emplace_back(p);
  return out;
}

// Writes vocab.json/merges.txt from token byte strings (index = id) and merge pairs.
void write_files(const TestDir& dir, const std::vector<std::string>& tokens,
                 const std::vector<std::pair<std::string, std::string>>& merges) {
  json::Value vocab = json::Value::object();
  for (size_t i = 0; i < tokens.size(); ++i) vocab.set(bytes_to_unicode(tokens[i]), i);
  dir.write("vocab.json", json::dump(vocab));
  std::string m = "#version: 0.2\n";
  for (const auto& [a, b] : merges) m += bytes_to_unicode(a) + " " + bytes_to_unicode(b) + "\n";
  dir.write("merges.txt", m);
}

std::vector<std::string> byte_tokens() {
  std::vector<std::string> t;
  for (int b = 0; b < 256; ++b) t.emplace_back(1, static_cast<char>(b));
  return t;
}

TEST_CASE("byte alphabet is GPT-2's and invertible") {
  std::set<std::string> seen;
  for (int b = 0; b < 256; ++b) {
    const std::string u = byte_to_unicode(static_cast<uint8_t>(b));
    seen.insert(u);
    std::string back;
    REQUIRE(unicode_to_bytes(u, &back));
    REQUIRE(back == std::string(1, static_cast<char>(b)));
    const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
    if (printable && b < 0x80) CHECK(u == std::string(1, static_cast<char>(b)));
  }
  CHECK(seen.size() == 256);
  CHECK(byte_to_unicode(' ') == "\xC4\xA0");   // U+0120 'Ġ'
  CHECK(byte_to_unicode('\n') == "\xC4\x8A");  // U+010A 'Ċ'
  CHECK(byte_to_unicode(0xAD) == "\xC5\x83");  // the last shifted byte: U+0143
  CHECK(byte_to_unicode(0xE9) == "\xC3\xA9");  // 'é' stands for itself
  std::string out;
  CHECK_FALSE(unicode_to_bytes(" ", &out));  // a raw space is not in the alphabet
  CHECK_FALSE(unicode_to_bytes("\xE4\xB8\xAD", &out));
}

TEST_CASE("pre-tokenizer follows GPT-2's pattern") {
  using V = std::vector<std::string>;
  CHECK(split("Hello world") == V{"Hello", " world"});
  CHECK(split("I'm here, don't") == V{"I", "'m", " here", ",", " don", "'t"});
  CHECK(split("we're they'll you've he'd") ==
        V{"we", "'re", " they", "'ll", " you", "'ve", " he", "'d"});
  CHECK(split("DON'T") == V{"DON", "'", "T"});  // the contractions are lowercase only
  CHECK(split("a  b") == V{"a", " ", " b"});
  CHECK(split("a\n\nb") == V{"a", "\n", "\n", "b"});
  CHECK(split("a \n b") == V{"a", " \n", " b"});
  CHECK(split("x   ") == V{"x", "   "});
  CHECK(split("  !") == V{" ", " !"});
  CHECK(split("3.14 42x") == V{"3", ".", "14", " 42", "x"});
  CHECK(split("hello!!! world") == V{"hello", "!!!", " world"});
  CHECK(split("a\tb") == V{"a", "\t", "b"});
  CHECK(split(" \xE4\xB8\xAD\xE6\x96\x87") == V{" \xE4\xB8\xAD\xE6\x96\x87"});  // " 中文"
  CHECK(split("e\xCC\x81t") == V{"e", "\xCC\x81", "t"});  // a combining mark is not a letter
  CHECK(split("\xD9\xA3\xD9\xA4 x") == V{"\xD9\xA3\xD9\xA4", " x"});  // Arabic-Indic digits
  CHECK(split("").empty());
  // Invalid UTF-8 bytes are single "other" characters and still cover the text.
  const std::string bad = "ab\xFF\xFE cd\xC3";
  std::string joined;
  for (const auto& p : split(bad)) joined += p;
  CHECK(joined == bad);
}

TEST_CASE("character classes cover common scripts") {
  auto cls = [](uint32_t c) { return char_class(c); };
  for (uint32_t c :
       {U'a', U'Z', U'é', U'ß', U'Ω', U'Ж', U'中', U'あ', U'ア', U'ا', U'ש', U'न', U'한'})
    CHECK(cls(c) == CharClass::kLetter);
  for (uint32_t c : {U'0', U'9', U'٣', U'½', U'²', U'Ⅻ', U'०'}) CHECK(cls(c) == CharClass::kNumber);
  for (uint32_t c : {0x20u, 0x9u, 0xAu, 0xDu, 0xA0u, 0x3000u, 0x2003u, 0x85u})
    CHECK(cls(c) == CharClass::kSpace);
  for (uint32_t c : {0x21u, 0x27u, 0x2Du, 0x301u, 0x93Fu, 0x1F600u, 0x200Du, 0x1Cu})
    CHECK(cls(c) == CharClass::kOther);
  size_t len = 0;
  CHECK(decode_utf8("\xF0\x9F\x98\x80", 0, &len) == 0x1F600u);
  CHECK(len == 4);
  CHECK(decode_utf8("\xC0\xAF", 0, &len) >= 0x110000u);  // overlong
  CHECK(len == 1);
  CHECK(decode_utf8("\xED\xA0\x80", 0, &len) >= 0x110000u);  // surrogate
  CHECK(decode_utf8("\xE4\xB8", 0, &len) >= 0x110000u);      // truncated
}

TEST_CASE("training merges the most frequent pair first, ties by smallest ids") {
  const BpeTokenizer tok = BpeTokenizer::train({"ab ab ab cd"}, 300);
  // Pre-tokens "ab", " ab" x2, " cd": (a,b)=3, (' ',a)=2 after the first merge (' ',ab)=2,
  // then (' ',c)=1 and (c,d)=1 tie and (' '=32, c=99) < (c=99, d=100).
  REQUIRE(tok.num_merges() == 4);
  CHECK(tok.token_bytes(256) == "ab");
  CHECK(tok.token_bytes(257) == " ab");
  CHECK(tok.token_bytes(258) == " c");
  CHECK(tok.token_bytes(259) == " cd");
  CHECK(tok.vocab_size() == 261);  // stopped early: nothing left to merge
  CHECK(tok.eot_id() == 260);
  CHECK(tok.token_bytes(260) == "<|endoftext|>");
  CHECK(tok.merges()[1] == std::make_pair(int32_t{' '}, int32_t{256}));
  CHECK(tok.encode("ab cd abab") == std::vector<int32_t>{256, 259, 257, 256});
  CHECK(tok.token_id(" cd") == 259);
  CHECK(tok.token_id("zz") == -1);

  const BpeTokenizer small = BpeTokenizer::train({"ab ab ab cd"}, 259);
  CHECK(small.num_merges() == 2);
  CHECK(small.vocab_size() == 259);
  CHECK(small.eot_id() == 258);
}

TEST_CASE("training is deterministic and fills the requested vocabulary") {
  const std::vector<std::string> texts = {default_corpus(200000)};
  const BpeTokenizer a = BpeTokenizer::train(texts, 400);
  const BpeTokenizer b = BpeTokenizer::train(texts, 400);
  REQUIRE(a.vocab_size() == 400);
  CHECK(a.eot_id() == 399);
  CHECK(a.merges() == b.merges());
  // Every learned token is the concatenation of its merge.
  for (int r = 0; r < a.num_merges(); ++r) {
    const auto [l, rt] = a.merges()[r];
    CHECK(a.token_id(a.token_bytes(l) + a.token_bytes(rt)) == 256 + r);
  }
}

TEST_CASE("merges apply lowest rank first, not leftmost first") {
  TestDir dir;
  std::vector<std::string> tokens = byte_tokens();
  tokens.push_back("bc");   // 256, rank 0
  tokens.push_back("ab");   // 257, rank 1
  tokens.push_back("abc");  // 258: reachable only as ab + c, which rank order never builds
  write_files(dir, tokens, {{"b", "c"}, {"a", "b"}, {"ab", "c"}});
  const BpeTokenizer tok = BpeTokenizer::load(dir.file("vocab.json"), dir.file("merges.txt"));
  CHECK(tok.encode("abc") == std::vector<int32_t>{'a', 256});
  CHECK(tok.encode("abab") == std::vector<int32_t>{257, 257});
  CHECK(tok.encode("abcab") == std::vector<int32_t>{'a', 256, 257});
  CHECK(tok.eot_id() == -1);
}

TEST_CASE("byte ids need not equal byte values (GPT-2's own vocab order)") {
  TestDir dir;
  // GPT-2 numbers the byte tokens in alphabet order: printable bytes first.
  std::vector<std::string> tokens;
  for (int pass = 0; pass < 2; ++pass) {
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
      if (printable == (pass == 0)) tokens.emplace_back(1, static_cast<char>(b));
    }
  }
  tokens.push_back(" t");
  tokens.push_back(" the");
  tokens.push_back("he");
  tokens.push_back("<|endoftext|>");
  write_files(dir, tokens, {{" ", "t"}, {"h", "e"}, {" t", "he"}});
  const BpeTokenizer tok = BpeTokenizer::load(dir.file("vocab.json"), dir.file("merges.txt"));
  CHECK(tok.vocab_size() == 260);
  CHECK(tok.eot_id() == 259);
  CHECK(tok.token_id("!") == 0);
  const std::vector<int32_t> ids = tok.encode("the the\n");
  CHECK(ids == std::vector<int32_t>{tok.token_id("t"), 258, 257, tok.token_id("\n")});
  CHECK(tok.decode(ids) == "the the\n");
}

TEST_CASE("encode/decode round-trips arbitrary bytes; batch equals single") {
  const BpeTokenizer tok = BpeTokenizer::train({default_corpus(100000)}, 350);
  uint64_t state = 7;
  std::vector<std::string> texts;
  for (int i = 0; i < 50; ++i) {
    std::string s;
    const int n = static_cast<int>((state = state * 6364136223846793005ull + 1) >> 58);
    for (int k = 0; k < n * 7; ++k) {
      state = state * 6364136223846793005ull + 1442695040888963407ull;
      const int pick = static_cast<int>(state >> 60);
      // Mix corpus-like ASCII with raw (often invalid) high bytes.
      s += pick < 10 ? std::string(1, "the cat  \n"[pick]) : std::string(1, char(state >> 40));
    }
    texts.push_back(s);
  }
  std::vector<std::string_view> views(texts.begin(), texts.end());
  const auto batch = tok.encode_batch(views);
  for (size_t i = 0; i < texts.size(); ++i) {
    const std::vector<int32_t> ids = tok.encode(texts[i]);
    CHECK(ids == batch[i]);
    CHECK(tok.decode(ids) == texts[i]);
  }
  CHECK(tok.encode("").empty());
}

TEST_CASE("save then load reproduces the tokenizer") {
  TestDir dir;
  const std::string text = default_corpus(100000) + " \"quoted\\slash\" caf\xC3\xA9 \xE4\xB8\xAD";
  const BpeTokenizer a = BpeTokenizer::train({text}, 420);
  a.save(dir.file("vocab.json"), dir.file("merges.txt"));
  const BpeTokenizer b = BpeTokenizer::load(dir.file("vocab.json"), dir.file("merges.txt"));
  CHECK(b.vocab_size() == a.vocab_size());
  CHECK(b.merges() == a.merges());
  CHECK(b.eot_id() == a.eot_id());
  CHECK(b.encode(text) == a.encode(text));
  const std::string merges = testing::read_bytes(dir.file("merges.txt"));
  CHECK(merges.rfind("#version", 0) == 0);
}

TEST_CASE("bad tokenizer files are clear errors") {
  TestDir dir;
  write_files(dir, byte_tokens(), {});
  const std::string v = dir.file("vocab.json"), m = dir.file("merges.txt");
  CHECK_NOTHROW(BpeTokenizer::load(v, m));
  CHECK_THROWS_WITH(BpeTokenizer::load(dir.file("nope.json"), m), Catch::Contains("nope.json"));
  CHECK_THROWS_WITH(BpeTokenizer::load(v, dir.file("nope.txt")), Catch::Contains("nope.txt"));
  dir.write("array.json", "[1, 2]");
  CHECK_THROWS_WITH(BpeTokenizer::load(dir.file("array.json"), m),
                    Catch::Contains("expected a JSON object"));
  dir.write("broken.json", "{\"a\": 0,");
  CHECK_THROWS_AS(BpeTokenizer::load(dir.file("broken.json"), m), Error);
  dir.write("bad_merges.txt", "#version: 0.2\na b c\n");
  CHECK_THROWS_WITH(BpeTokenizer::load(v, dir.file("bad_merges.txt")),
                    Catch::Contains("bad_merges.txt:2"));
  dir.write("unknown.txt", "#version: 0.2\nq \xC4\xA0zz\n");
  CHECK_THROWS_WITH(BpeTokenizer::load(v, dir.file("unknown.txt")), Catch::Contains("is not in"));
  // A merge whose result is missing from the vocabulary.
  dir.write("no_result.txt", "#version: 0.2\na b\n");
  CHECK_THROWS_WITH(BpeTokenizer::load(v, dir.file("no_result.txt")),
                    Catch::Contains("not in the vocabulary"));
  // A vocabulary without every byte cannot encode arbitrary text.
  std::vector<std::string> missing = byte_tokens();
  missing.erase(missing.begin() + 'q');
  TestDir dir2;
  write_files(dir2, missing, {});
  CHECK_THROWS_WITH(BpeTokenizer::load(dir2.file("vocab.json"), dir2.file("merges.txt")),
                    Catch::Contains("no token for byte 113"));
  dir.write("gap.json", "{\"a\": 0, \"b\": 5}");
  CHECK_THROWS_WITH(BpeTokenizer::load(dir.file("gap.json"), m), Catch::Contains("ids must be"));

  const BpeTokenizer tok = BpeTokenizer::load(v, m);
  CHECK_THROWS_WITH(tok.decode({1, 256}), Catch::Contains("outside the vocabulary"));
  CHECK_THROWS_WITH(tok.decode({-1}), Catch::Contains("outside the vocabulary"));
  CHECK_THROWS_AS(BpeTokenizer::train({"abc"}, 256), Error);
}

TEST_CASE("encoding is faster than 1 MB/s") {
  const std::string corpus = default_corpus(2 << 20);
  const BpeTokenizer tok = BpeTokenizer::train({corpus.substr(0, 300000)}, 1024);
  // Words that never repeat defeat the per-word cache: the merge loop's own speed.
  std::string unique;
  uint64_t state = 99;
  while (unique.size() < (1u << 20)) {
    unique += ' ';
    for (int k = 0; k < 8; ++k) {
      state = state * 6364136223846793005ull + 1442695040888963407ull;
      unique += static_cast<char>('a' + (state >> 59) % 26);
    }
  }
  for (const std::string* text : {&corpus, static_cast<const std::string*>(&unique)}) {
    const auto t0 = std::chrono::steady_clock::now();
    const std::vector<int32_t> ids = tok.encode(*text);
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    const double mb_per_s = static_cast<double>(text->size()) / 1e6 / s;
    std::cout << "[bpe_test] encoded " << text->size() / 1e6 << " MB ("
              << (text == &corpus ? "default corpus" : "unique random words") << ") into "
              << ids.size() << " tokens at " << mb_per_s << " MB/s\n";
    CHECK(mb_per_s > 1.0);
    CHECK(tok.decode(ids) == *text);
  }
}

}  // namespace
}  // namespace mammoth::data
