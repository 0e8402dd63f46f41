// `mammoth train` for classification: ViT on labelled images (--images DIR|FILE) and BERT
// sequence classification (--task classify --train-file FILE.jsonl|.tsv), reporting
// validation accuracy. Built on the same runtime (dp / ZeRO) and training loop as the language
// models (engine/train: the labelled-examples batch source).
#pragma once

#include "engine/train/device.h"
#include "engine/train/trainer.h"
#include "runtime/runtime.h"

namespace mammoth::tools {

// Whether the flags ask for classification (--images, or --task classify); refuses by name the
// flags that only classification reads when it is not asked for, an unknown --task, and a ViT
// model without --images.
bool classification_requested();

// Trains and returns the exit status (130 when interrupted). `options` holds the flags every
// objective shares (tools/cmd_train.cc's options_from_flags).
int run_classification(runtime::TrainingRuntime& rt, const engine::train::DeviceChoice& device,
                       engine::train::TrainOptions options);

}  // namespace mammoth::tools
