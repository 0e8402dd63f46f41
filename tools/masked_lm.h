// BERT's masked-LM options as `mammoth train` and `mammoth eval` both build them, from the
// model's config and the shared --mask-token / --mask-prob flags (defined in cmd_eval.cc), so
// that eval scores exactly the objective train minimised.
#pragma once

#include "engine/data/masking.h"
#include "models/config.h"

namespace mammoth::tools {

// The rule for model config `c`; `command` names the caller in errors ("[train] model ...
// defines no [MASK] token"). The seed is left to the caller.
data::MaskingOptions masked_lm_options(const models::ModelConfig& c, const char* command);

}  // namespace mammoth::tools
