#include "engine/data/unicode_class.h"

#include <algorithm>
#include <array>

namespace mammoth::data {
namespace {

struct CodeRange {
  uint32_t first;
  uint32_t last;
};

#include "engine/data/unicode_tables.inc"

template <size_t N>
bool in_ranges(const CodeRange (&ranges)[N], uint32_t c) {
  // First range whose last >= c; c is inside it when first <= c.
  const CodeRange* it = std::lower_bound(std::begin(ranges), std::end(ranges), c,
                                         [](const CodeRange& r, uint32_t v) { return r.last < v; });
  return it != std::end(ranges) && it->first <= c;
}

bool is_white_space(uint32_t c) {
  // Unicode's White_Space property (PropList.txt); it has not changed since Unicode 6.
  return (c >= 0x9 && c <= 0xD) || c == 0x20 || c == 0x85 || c == 0xA0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F ||
         c == 0x3000;
}

CharClass classify_slow(uint32_t c) {
  if (is_white_space(c)) return CharClass::kSpace;
  if (in_ranges(kLetterRanges, c)) return CharClass::kLetter;
  if (in_ranges(kNumberRanges, c)) return CharClass::kNumber;
  return CharClass::kOther;
}

// Latin-1 and the rest of the lowest 2048 code points (Latin, Greek, Cyrillic, Hebrew, Arabic)
// cover most text; a table avoids the binary search for them.
constexpr uint32_t kTableSize = 0x800;

const std::array<CharClass, kTableSize>& low_table() {
  static const std::array<CharClass, kTableSize> table = [] {
    std::array<CharClass, kTableSize> t{};
    for (uint32_t c = 0; c < kTableSize; ++c) t[c] = classify_slow(c);
    return t;
  }();
  return table;
}

}  // namespace

CharClass char_class(uint32_t code_point) {
  if (code_point < kTableSize) return low_table()[code_point];
  return classify_slow(code_point);
}

size_t class_run_end(std::string_view text, size_t pos, CharClass k) {
  while (pos < text.size()) {
    size_t len = 0;
    if (char_class(decode_utf8(text, pos, &len)) != k) break;
    pos += len;
  }
  return pos;
}

const char* unicode_tables_version() { return kUnicodeTablesVersion; }

uint32_t decode_utf8(std::string_view text, size_t pos, size_t* len) {
  const auto* s = reinterpret_cast<const unsigned char*>(text.data());
  const size_t n = text.size();
  const unsigned char b0 = s[pos];
  // Invalid bytes map above the Unicode range so they can never be letters or numbers.
  const uint32_t invalid = 0x110000u + b0;
  if (b0 < 0x80) {
    *len = 1;
    return b0;
  }
  auto cont = [&](size_t i) { return pos + i < n && (s[pos + i] & 0xC0) == 0x80; };
  if (b0 >= 0xC2 && b0 <= 0xDF && cont(1)) {
    *len = 2;
    return ((b0 & 0x1Fu) << 6) | (s[pos + 1] & 0x3Fu);
  }
  if (b0 >= 0xE0 && b0 <= 0xEF && cont(1) && cont(2)) {
    const uint32_t c = ((b0 & 0x0Fu) << 12) | ((s[pos + 1] & 0x3Fu) << 6) | (s[pos + 2] & 0x3Fu);
    if (c >= 0x800 && (c < 0xD800 || c > 0xDFFF)) {  // no overlongs, no surrogates
      *len = 3;
      return c;
    }
  }
  if (b0 >= 0xF0 && b0 <= 0xF4 && cont(1) && cont(2) && cont(3)) {
    const uint32_t c = ((b0 & 0x07u) << 18) | ((s[pos + 1] & 0x3Fu) << 12) |
                       ((s[pos + 2] & 0x3Fu) << 6) | (s[pos + 3] & 0x3Fu);
    if (c >= 0x10000 && c <= 0x10FFFF) {
      *len = 4;
      return c;
    }
  }
  *len = 1;
  return invalid;
}

}  // namespace mammoth::data
