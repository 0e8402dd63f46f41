// Mammoth's side of the PEFT interop test (lora_peft_test.sh): the logits of a Hugging Face
// model directory with a PEFT LoRA adapter applied, as models::load_adapter applies it.
//
//   lora_logits MODEL_DIR ADAPTER_DIR IDS.safetensors OUT.safetensors
//
// IDS holds "ids" i64 [B, T]; OUT gets "logits" f32 [B, T, V].
#include <cstdio>
#include <cstring>

#include "base/error.h"
#include "engine/autograd.h"
#include "engine/io/safetensors.h"
#include "models/lora.h"
#include "models/registry.h"

namespace mammoth {
namespace {

int run(int argc, char** argv) {
  MAMMOTH_CHECK(argc == 5) << "usage: lora_logits MODEL_DIR ADAPTER_DIR IDS.safetensors OUT";
  auto model = models::create_language_model(argv[1]);
  auto lora = models::load_adapter(*model, argv[2]);
  model->eval();
  const io::SafetensorsFile in = io::SafetensorsFile::open(argv[3]);
  const io::TensorView& v = in.get("ids");
  engine::Tensor ids = engine::Tensor::empty(v.shape, v.dtype);
  std::memcpy(ids.raw_data(), v.data, v.nbytes);
  engine::NoGradGuard ng;
  const engine::Tensor logits = model->forward(ids).contiguous();
  io::write_safetensors(argv[4],
                        {{"logits", logits.dtype(), logits.shape(),
                          static_cast<const uint8_t*>(logits.raw_data()), logits.nbytes()}},
                        {{"format", "pt"}});
  std::printf("logits %s with LoRA r=%lld on %zu layers\n",
              engine::shape_str(logits.shape()).c_str(),
              static_cast<long long>(lora->options().rank), lora->targets().size());
  return 0;
}

}  // namespace
}  // namespace mammoth

int main(int argc, char** argv) {
  try {
    return mammoth::run(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  }
}
