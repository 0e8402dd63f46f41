#include "engine/data/unicode_class.h"

#include <algorithm>
#include <array>
#include <unordered_map>
#include <vector>

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

namespace {

#include "engine/data/nfc_tables.inc"

constexpr uint32_t kSBase = 0xAC00, kLBase = 0x1100, kVBase = 0x1161, kTBase = 0x11A7;
constexpr uint32_t kLCount = 19, kVCount = 21, kTCount = 28, kNCount = kVCount * kTCount;
constexpr uint32_t kSCount = kLCount * kNCount;
constexpr uint32_t kRawByte = 0x110000;  // + byte: a byte that is not valid UTF-8

struct NfcTables {
  std::unordered_map<uint32_t, std::pair<uint32_t, uint32_t>> nfd;  // cp -> (offset, count)
  std::unordered_map<uint32_t, uint8_t> ccc;
  std::unordered_map<uint64_t, uint32_t> compose;

  NfcTables() {
    for (size_t i = 0; i < std::size(kNfdTable); i += 2 + kNfdTable[i + 1]) {
      nfd.emplace(kNfdTable[i], std::make_pair(static_cast<uint32_t>(i + 2), kNfdTable[i + 1]));
    }
    for (size_t i = 0; i < std::size(kCccTable); i += 2) {
      ccc.emplace(kCccTable[i], static_cast<uint8_t>(kCccTable[i + 1]));
    }
    for (size_t i = 0; i < std::size(kCompositionTable); i += 3) {
      compose.emplace((uint64_t{kCompositionTable[i]} << 32) | kCompositionTable[i + 1],
                      kCompositionTable[i + 2]);
    }
  }
  int class_of(uint32_t c) const {
    if (c < 0x300) return 0;
    auto it = ccc.find(c);
    return it == ccc.end() ? 0 : it->second;
  }
  // The primary composite of (a, b), or 0.
  uint32_t composite(uint32_t a, uint32_t b) const {
    if (a >= kLBase && a < kLBase + kLCount && b >= kVBase && b < kVBase + kVCount) {
      return kSBase + ((a - kLBase) * kVCount + (b - kVBase)) * kTCount;
    }
    if (a >= kSBase && a < kSBase + kSCount && (a - kSBase) % kTCount == 0 && b > kTBase &&
        b < kTBase + kTCount) {
      return a + (b - kTBase);
    }
    auto it = compose.find((uint64_t{a} << 32) | b);
    return it == compose.end() ? 0 : it->second;
  }
};

const NfcTables& nfc_tables() {
  static const NfcTables t;
  return t;
}

void append_code_point(uint32_t c, std::string* out) {
  if (c >= kRawByte) {
    out->push_back(static_cast<char>(c - kRawByte));
  } else if (c < 0x80) {
    out->push_back(static_cast<char>(c));
  } else if (c < 0x800) {
    out->push_back(static_cast<char>(0xC0 | (c >> 6)));
    out->push_back(static_cast<char>(0x80 | (c & 0x3F)));
  } else if (c < 0x10000) {
    out->push_back(static_cast<char>(0xE0 | (c >> 12)));
    out->push_back(static_cast<char>(0x80 | ((c >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (c & 0x3F)));
  } else {
    out->push_back(static_cast<char>(0xF0 | (c >> 18)));
    out->push_back(static_cast<char>(0x80 | ((c >> 12) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | ((c >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (c & 0x3F)));
  }
}

}  // namespace

namespace {

// NFD of code points (raw bytes >= kRawByte pass through as starters).
std::vector<uint32_t> decompose(const std::vector<uint32_t>& text) {
  const NfcTables& t = nfc_tables();
  std::vector<uint32_t> d;
  d.reserve(text.size());
  for (const uint32_t c : text) {
    if (c >= kSBase && c < kSBase + kSCount) {
      const uint32_t s = c - kSBase;
      d.push_back(kLBase + s / kNCount);
      d.push_back(kVBase + (s % kNCount) / kTCount);
      if (s % kTCount != 0) d.push_back(kTBase + s % kTCount);
      continue;
    }
    if (auto it = t.nfd.find(c); it != t.nfd.end()) {
      d.insert(d.end(), kNfdTable + it->second.first,
               kNfdTable + it->second.first + it->second.second);
    } else {
      d.push_back(c);
    }
  }
  // Canonical ordering: a stable sort of each run of nonzero classes by class.
  for (size_t i = 0; i < d.size();) {
    if (d[i] >= kRawByte || t.class_of(d[i]) == 0) {
      ++i;
      continue;
    }
    size_t j = i;
    while (j < d.size() && d[j] < kRawByte && t.class_of(d[j]) != 0) ++j;
    std::stable_sort(d.begin() + i, d.begin() + j,
                     [&](uint32_t a, uint32_t b) { return t.class_of(a) < t.class_of(b); });
    i = j;
  }
  return d;
}

}  // namespace

std::vector<uint32_t> nfd(const std::vector<uint32_t>& text) { return decompose(text); }

std::string nfc(std::string_view text) {
  // Text below U+0300 is its own NFC (no character there decomposes or combines).
  bool plain = true;
  for (unsigned char b : text) plain = plain && b < 0xCC;
  if (plain) return std::string(text);
  const NfcTables& t = nfc_tables();
  std::vector<uint32_t> points;
  points.reserve(text.size());
  for (size_t pos = 0; pos < text.size();) {
    size_t len = 0;
    uint32_t c = decode_utf8(text, pos, &len);
    if (c >= 0x110000) c = kRawByte + static_cast<unsigned char>(text[pos]);
    pos += len;
    points.push_back(c);
  }
  const std::vector<uint32_t> d = decompose(points);
  // Canonical composition: each character joins the last starter unless blocked (a character
  // between them of class 0 or of a class not below its own).
  std::vector<uint32_t> out;
  out.reserve(d.size());
  size_t starter = SIZE_MAX;
  int last_class = 0;
  for (const uint32_t c : d) {
    const int cc = c >= kRawByte ? 0 : t.class_of(c);
    if (starter != SIZE_MAX && c < kRawByte) {
      const bool adjacent = out.size() == starter + 1;
      if (adjacent || (last_class != 0 && last_class < cc)) {
        if (const uint32_t comp = t.composite(out[starter], c); comp != 0) {
          out[starter] = comp;
          continue;
        }
      }
    }
    if (cc == 0) {
      starter = c >= kRawByte ? SIZE_MAX : out.size();
      last_class = 0;
    } else {
      last_class = cc;
    }
    out.push_back(c);
  }
  std::string result;
  result.reserve(text.size());
  for (const uint32_t c : out) append_code_point(c, &result);
  return result;
}

void append_utf8(uint32_t code_point, std::string* out) { append_code_point(code_point, out); }

namespace {
#include "engine/data/bert_tables.inc"

struct LowerTable {
  std::unordered_map<uint32_t, std::pair<uint32_t, uint32_t>> map;  // cp -> (offset, count)
  LowerTable() {
    for (size_t i = 0; i < std::size(kLowerTable); i += 2 + kLowerTable[i + 1]) {
      map.emplace(kLowerTable[i], std::make_pair(static_cast<uint32_t>(i + 2), kLowerTable[i + 1]));
    }
  }
};

const LowerTable& lower_table() {
  static const LowerTable t;
  return t;
}

}  // namespace

bool is_control_category(uint32_t c) { return in_ranges(kControlRanges, c); }
bool is_space_separator(uint32_t c) { return in_ranges(kSpaceSeparatorRanges, c); }
bool is_punctuation_category(uint32_t c) { return in_ranges(kPunctuationRanges, c); }
bool is_nonspacing_mark(uint32_t c) { return in_ranges(kNonspacingMarkRanges, c); }
bool is_python_space(uint32_t c) {
  return std::binary_search(std::begin(kPythonSpaces), std::end(kPythonSpaces), c);
}

std::vector<uint32_t> lower_case(const std::vector<uint32_t>& text) {
  const LowerTable& t = lower_table();
  std::vector<uint32_t> out;
  out.reserve(text.size());
  for (const uint32_t c : text) {
    if (auto it = t.map.find(c); it != t.map.end()) {
      out.insert(out.end(), kLowerTable + it->second.first,
                 kLowerTable + it->second.first + it->second.second);
    } else {
      out.push_back(c);
    }
  }
  return out;
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
