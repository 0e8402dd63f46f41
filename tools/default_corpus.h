// The corpus `mammoth train` trains on when given no --data: the embedded text, tokenized once
// per requested BPE vocabulary size into $HOME/.cache/mammoth and reused afterwards. Its real
// vocabulary can be smaller than the one asked for (the BPE stops when the corpus runs out of
// pairs to merge), and the model trained on it takes that size: whatever predicts such a run
// (`mammoth bench plan`) must use it too.
#pragma once

#include <cstdint>

#include "engine/data/build_shards.h"
#include "models/config.h"

namespace mammoth::tools {

// The size `train --vocab-size` asks for by default.
inline constexpr int kDefaultCorpusVocab = 1024;

// The shards and the real vocabulary size, tokenizing on first use (announced on stderr).
data::BuildShardsResult default_corpus(int vocab_size = kDefaultCorpusVocab);

// The vocabulary of a model trained on a corpus of `bpe_vocab` ids: the BPE's, and for a masked
// LM one id more for [MASK], which a byte-level BPE lacks.
inline int64_t corpus_model_vocab(bool masked_lm, int64_t bpe_vocab) {
  return masked_lm ? bpe_vocab + 1 : bpe_vocab;
}

// `config` as `train` builds it on the default corpus of `vocab_size` asked for: with the
// corpus's real vocabulary (tokenizing on first use).
models::ModelConfig on_default_corpus(models::ModelConfig config,
                                      int vocab_size = kDefaultCorpusVocab);

}  // namespace mammoth::tools
