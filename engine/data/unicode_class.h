// UTF-8 decoding and the Unicode character classes the GPT-2 pre-tokenizer needs.
//
// GPT-2's pattern distinguishes letters (\p{L}), numbers (\p{N}), whitespace (\s) and the rest.
// Letters and numbers come from the general-category tables in unicode_tables.inc (generated
// from Python's unicodedata); whitespace is Unicode's White_Space property, which is what the
// Oniguruma regex engine used by Hugging Face `tokenizers` means by \s.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace mammoth::data {

enum class CharClass : uint8_t { kLetter, kNumber, kSpace, kOther };

CharClass char_class(uint32_t code_point);

// The Unicode version the letter/number tables were generated from, e.g. "14.0.0".
const char* unicode_tables_version();

// Decodes the code point starting at text[pos] and stores its byte length in *len. Bytes that
// do not start a valid UTF-8 sequence decode as one-byte code points >= 0x110000 (class kOther),
// so arbitrary bytes still tokenize and round-trip.
uint32_t decode_utf8(std::string_view text, size_t pos, size_t* len);

// Unicode Normalization Form C of UTF-8 text (canonical decomposition, canonical ordering,
// canonical composition; tables from nfc_tables.inc, Hangul by rule). Bytes that are not valid
// UTF-8 are kept as they are and block composition across them.
std::string nfc(std::string_view text);

// What transformers' BertTokenizer asks of Python's unicodedata and str, from bert_tables.inc
// (generated from the same Python as the tables above):
bool is_control_category(uint32_t c);      // general category C* (Cc, Cf, Cn, Co, Cs)
bool is_space_separator(uint32_t c);       // Zs
bool is_punctuation_category(uint32_t c);  // P*
bool is_nonspacing_mark(uint32_t c);       // Mn
bool is_python_space(uint32_t c);          // str.isspace(): what str.split() splits on
// Each code point's str.lower() (a full mapping: one may become several), one at a time as
// BertTokenizer lowers text: no Final_Sigma context, so capital sigma is always small sigma.
std::vector<uint32_t> lower_case(const std::vector<uint32_t>& text);
// Canonical decomposition with canonical ordering (NFD) of code points.
std::vector<uint32_t> nfd(const std::vector<uint32_t>& text);
void append_utf8(uint32_t code_point, std::string* out);

// End (exclusive byte offset) of the run of characters of class `k` starting at `pos`.
size_t class_run_end(std::string_view text, size_t pos, CharClass k);

}  // namespace mammoth::data
