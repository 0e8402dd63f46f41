// Labelled texts for sequence classification (BERT): rows of a JSONL or TSV file as
// LabelledExamples (examples.h) of token ids [n, seq_len].
//
// JSONL: one object a line, {"text": "...", "label": L} or {"ids": [101, ...], "label": L}.
// TSV: a header row naming the columns (text or ids, and label, in any order), then one row a
// line; an ids cell is space-separated integers. Any other column / key, a missing one, or both
// text and ids, is refused naming it and the row.
//
// Labels: when every training label is a non-negative integer (a JSON integer, or in TSV a
// cell of digits), the label is the class id and the classes are 0..max; otherwise every label
// is a name and the class ids are the sorted distinct names. Validation rows are mapped with
// the training rows' classes (an unseen label is refused by row).
//
// Text is encoded by the WordPiece vocabulary as [CLS] pieces [SEP], truncated to seq_len
// (the last piece kept is followed by [SEP]; truncated rows are counted), padded with [PAD].
// Ids are taken as they are (no [CLS] / [SEP] added), truncated and padded alike with the
// given pad id; an id outside the vocabulary, or the pad id inside a row, is refused: padding
// is where the model's attention mask is 0, so it must not appear as a token.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "engine/data/examples.h"
#include "engine/data/wordpiece.h"

namespace mammoth::data {

struct TextClassificationOptions {
  int64_t seq_len = 64;
  const WordPiece* tokenizer = nullptr;  // null: rows must give ids
  int64_t vocab_size = 0;                // ids (given or encoded) must be below it
  int64_t pad_id = 0;                    // ids rows' padding (text rows: the vocabulary's [PAD])
  // The training file's classes, for a validation file (null: this is the training file).
  const std::vector<std::string>* classes = nullptr;
  bool integer_labels = false;  // with `classes`: whether they were integers
};

class TextExamples final : public LabelledExamples {
 public:
  static TextExamples open(const std::string& path, const TextClassificationOptions& options);

  int64_t size() const override { return static_cast<int64_t>(labels_.size()); }
  int64_t num_classes() const override { return static_cast<int64_t>(classes_.size()); }
  ExampleBatch read(const std::vector<int64_t>& which) const override;
  std::string describe() const override;

  // Class names in id order ("0", "1", ... for integer labels).
  const std::vector<std::string>& classes() const { return classes_; }
  bool integer_labels() const { return integer_labels_; }
  int64_t truncated() const { return truncated_; }  // rows cut to seq_len
  int64_t pad_id() const { return pad_id_; }
  int64_t seq_len() const { return seq_len_; }

 private:
  std::string path_;
  int64_t seq_len_ = 0, pad_id_ = 0, truncated_ = 0;
  bool integer_labels_ = false;
  std::vector<std::string> classes_;
  std::vector<int64_t> ids_;  // size() * seq_len, padded
  std::vector<int64_t> labels_;
};

}  // namespace mammoth::data
