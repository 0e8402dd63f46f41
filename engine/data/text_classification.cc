#include "engine/data/text_classification.h"

#include <algorithm>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include "base/error.h"
#include "base/json.h"

namespace mammoth::data {
namespace {

// One row before labels are mapped: its ids (encoded or given) and its label as written.
struct Row {
  std::vector<int64_t> ids;
  std::string label;
  bool label_is_int = false;
  int64_t line = 0;
};

bool all_digits(const std::string& s) {
  return !s.empty() && s.size() <= 18 &&
         std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; });
}

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> out;
  std::string cur;
  for (char c : s) {
    if (c == sep) {
      out.push_back(cur);
      cur.clear();
    } else {
      cur.push_back(c);
    }
  }
  out.push_back(cur);
  return out;
}

std::vector<int64_t> parse_ids_cell(const std::string& cell, const std::string& where) {
  std::vector<int64_t> ids;
  std::istringstream in(cell);
  std::string tok;
  while (in >> tok) {
    MAMMOTH_CHECK(all_digits(tok)) << "[text_classification] " << where << ": ids cell holds '"
                                   << tok << "', not a non-negative integer";
    ids.push_back(std::stoll(tok));
  }
  return ids;
}

}  // namespace

TextExamples TextExamples::open(const std::string& path, const TextClassificationOptions& o) {
  MAMMOTH_CHECK(o.seq_len >= 2) << "[text_classification] seq_len must be >= 2, got " << o.seq_len;
  std::ifstream in(path);
  MAMMOTH_CHECK(in.good()) << "[text_classification] cannot read " << path;
  const bool jsonl = path.size() > 6 && path.compare(path.size() - 6, 6, ".jsonl") == 0;
  const bool tsv = path.size() > 4 && path.compare(path.size() - 4, 4, ".tsv") == 0;
  MAMMOTH_CHECK(jsonl || tsv) << "[text_classification] " << path
                              << ": labelled rows are read from .jsonl or .tsv files";
  std::vector<Row> rows;
  auto add_text = [&](Row& r, const std::string& text, const std::string& where) {
    MAMMOTH_CHECK(o.tokenizer != nullptr)
        << "[text_classification] " << where
        << " gives text, but there is no WordPiece vocabulary (a model directory with "
           "vocab.txt, or --tokenizer DIR); or give its ids";
    r.ids.push_back(o.tokenizer->cls_id());
    for (int32_t id : o.tokenizer->encode(text, where)) r.ids.push_back(id);
    r.ids.push_back(o.tokenizer->sep_id());
  };
  std::string line;
  int64_t n = 0;
  std::vector<std::string> header;
  int text_col = -1, ids_col = -1, label_col = -1;
  while (std::getline(in, line)) {
    ++n;
    const std::string where = path + " line " + std::to_string(n);
    if (jsonl) {
      if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
      const json::Value v = json::parse(line, where);
      MAMMOTH_CHECK(v.is_object()) << "[text_classification] " << where << " is not an object";
      Row r;
      r.line = n;
      bool has_text = false, has_ids = false, has_label = false;
      for (const json::Value& m : v) {
        if (m.key() == "text") {
          MAMMOTH_CHECK(m.is_string())
              << "[text_classification] " << where << ": \"text\" must be a string";
          has_text = true;
          add_text(r, m.as_string(), where);
        } else if (m.key() == "ids") {
          MAMMOTH_CHECK(m.is_array())
              << "[text_classification] " << where << ": \"ids\" must be an array";
          has_ids = true;
          for (const json::Value& id : m) {
            MAMMOTH_CHECK(id.is_int() && id.as_int() >= 0)
                << "[text_classification] " << where << ": ids must be non-negative integers";
            r.ids.push_back(id.as_int());
          }
        } else if (m.key() == "label") {
          has_label = true;
          if (m.is_int() && m.as_int() >= 0) {
            r.label = std::to_string(m.as_int());
            r.label_is_int = true;
          } else {
            MAMMOTH_CHECK(m.is_string())
                << "[text_classification] " << where
                << ": \"label\" must be a non-negative integer or a string";
            r.label = m.as_string();
          }
        } else {
          MAMMOTH_THROW() << "[text_classification] " << where << ": unknown key \"" << m.key()
                          << "\" (rows hold \"text\" or \"ids\", and \"label\")";
        }
      }
      MAMMOTH_CHECK(has_text != has_ids)
          << "[text_classification] " << where
          << (has_text ? ": both \"text\" and \"ids\"" : ": no \"text\" or \"ids\"");
      MAMMOTH_CHECK(has_label) << "[text_classification] " << where << ": no \"label\"";
      rows.push_back(std::move(r));
      continue;
    }
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (header.empty()) {
      header = split(line, '\t');
      for (size_t c = 0; c < header.size(); ++c) {
        int* slot = header[c] == "text"    ? &text_col
                    : header[c] == "ids"   ? &ids_col
                    : header[c] == "label" ? &label_col
                                           : nullptr;
        MAMMOTH_CHECK(slot != nullptr)
            << "[text_classification] " << path << ": unknown column '" << header[c]
            << "' in the header row (columns: text or ids, and label)";
        MAMMOTH_CHECK(*slot < 0) << "[text_classification] " << path << ": column '" << header[c]
                                 << "' appears twice";
        *slot = static_cast<int>(c);
      }
      MAMMOTH_CHECK(label_col >= 0)
          << "[text_classification] " << path << ": the header row has no 'label' column";
      MAMMOTH_CHECK((text_col >= 0) != (ids_col >= 0))
          << "[text_classification] " << path << ": the header row needs one of 'text' or 'ids'"
          << (text_col >= 0 ? ", not both" : "");
      continue;
    }
    if (line.empty()) continue;
    const std::vector<std::string> cells = split(line, '\t');
    MAMMOTH_CHECK(cells.size() == header.size())
        << "[text_classification] " << where << " has " << cells.size() << " cells, the header "
        << header.size();
    Row r;
    r.line = n;
    if (text_col >= 0) {
      add_text(r, cells[static_cast<size_t>(text_col)], where);
    } else {
      r.ids = parse_ids_cell(cells[static_cast<size_t>(ids_col)], where);
    }
    r.label = cells[static_cast<size_t>(label_col)];
    MAMMOTH_CHECK(!r.label.empty()) << "[text_classification] " << where << ": empty label";
    r.label_is_int = all_digits(r.label);
    rows.push_back(std::move(r));
  }
  MAMMOTH_CHECK(!rows.empty()) << "[text_classification] " << path << " has no rows";

  TextExamples e;
  e.path_ = path;
  e.seq_len_ = o.seq_len;
  e.pad_id_ = o.tokenizer ? o.tokenizer->pad_id() : o.pad_id;
  // Classes: the training file's, or found here.
  if (o.classes != nullptr) {
    e.classes_ = *o.classes;
    e.integer_labels_ = o.integer_labels;
  } else {
    e.integer_labels_ =
        std::all_of(rows.begin(), rows.end(), [](const Row& r) { return r.label_is_int; });
    if (jsonl && !e.integer_labels_) {
      // A JSONL file mixing numbers and names has no single reading.
      for (const Row& r : rows)
        MAMMOTH_CHECK(!r.label_is_int)
            << "[text_classification] " << path << " line " << r.line << ": label " << r.label
            << " is a number but other rows' labels are strings";
    }
    if (e.integer_labels_) {
      int64_t max = 0;
      for (const Row& r : rows) max = std::max<int64_t>(max, std::stoll(r.label));
      for (int64_t k = 0; k <= max; ++k) e.classes_.push_back(std::to_string(k));
    } else {
      std::set<std::string> names;
      for (const Row& r : rows) names.insert(r.label);
      e.classes_.assign(names.begin(), names.end());
    }
    MAMMOTH_CHECK(e.classes_.size() >= 2)
        << "[text_classification] " << path << " has " << e.classes_.size()
        << " class(es); classification needs at least 2";
  }
  std::map<std::string, int64_t> class_id;
  for (size_t k = 0; k < e.classes_.size(); ++k) class_id[e.classes_[k]] = static_cast<int64_t>(k);
  e.ids_.reserve(rows.size() * static_cast<size_t>(o.seq_len));
  for (const Row& r : rows) {
    const std::string where = path + " line " + std::to_string(r.line);
    // Integer labels compare as numbers ("07" is class 7).
    const std::string key =
        e.integer_labels_ && r.label_is_int ? std::to_string(std::stoll(r.label)) : r.label;
    auto it = class_id.find(key);
    MAMMOTH_CHECK(it != class_id.end()) << "[text_classification] " << where << ": label '"
                                        << r.label << "' is not one of the training file's classes";
    e.labels_.push_back(it->second);
    MAMMOTH_CHECK(!r.ids.empty()) << "[text_classification] " << where << ": no ids";
    std::vector<int64_t> ids = r.ids;
    if (static_cast<int64_t>(ids.size()) > o.seq_len) {
      ids.resize(static_cast<size_t>(o.seq_len));
      if (o.tokenizer) ids.back() = o.tokenizer->sep_id();
      ++e.truncated_;
    }
    for (int64_t id : ids) {
      MAMMOTH_CHECK(id >= 0 && (o.vocab_size <= 0 || id < o.vocab_size))
          << "[text_classification] " << where << ": id " << id << " is outside the model's "
          << o.vocab_size << "-token vocabulary";
      MAMMOTH_CHECK(id != e.pad_id_) << "[text_classification] " << where << ": id " << id
                                     << " is the padding id inside the row";
    }
    ids.resize(static_cast<size_t>(o.seq_len), e.pad_id_);
    e.ids_.insert(e.ids_.end(), ids.begin(), ids.end());
  }
  return e;
}

ExampleBatch TextExamples::read(const std::vector<int64_t>& which) const {
  ExampleBatch b;
  const int64_t n = static_cast<int64_t>(which.size());
  b.shape = {n, seq_len_};
  b.ids.reserve(static_cast<size_t>(n * seq_len_));
  for (int64_t i : which) {
    MAMMOTH_CHECK(i >= 0 && i < size())
        << "[text_classification] row " << i << " outside the " << size() << " of " << path_;
    b.ids.insert(b.ids.end(), ids_.begin() + i * seq_len_, ids_.begin() + (i + 1) * seq_len_);
    b.labels.push_back(labels_[static_cast<size_t>(i)]);
  }
  return b;
}

std::string TextExamples::describe() const {
  return "texts " + path_ + ": " + std::to_string(size()) + " rows of " + std::to_string(seq_len_) +
         " ids, " + std::to_string(classes_.size()) + " classes";
}

}  // namespace mammoth::data
