"""Reference side of dtype_cli_test: transformers writes 16-bit Hugging Face directories and
continues a prompt greedily from the same weights widened to float32.

  dtype_reference.py make DIR FAMILY DTYPE   # random tiny LlamaForCausalLM / GPT2LMHeadModel /
                                             # ViTForImageClassification (32x32, 10 labels),
                                             # saved in bfloat16 or float16 (safetensors)
  dtype_reference.py greedy DIR IDS N        # N greedy ids after IDS (comma-separated), the
                                             # directory loaded with torch_dtype=float32

Mammoth's --dtype keeps the weights 16-bit in memory and computes in f32 on the widened
values, which is what from_pretrained(torch_dtype=float32) computes on the same files.
"""
import sys

import torch
import transformers


def make(out, family, dtype):
    torch.manual_seed(0)
    if family == "vit":
        cfg = transformers.ViTConfig(image_size=32, patch_size=8, num_channels=3, hidden_size=64,
                                     num_hidden_layers=4, num_attention_heads=4,
                                     intermediate_size=128, num_labels=10)
        model = transformers.ViTForImageClassification(cfg)
    elif family == "llama":
        cfg = transformers.LlamaConfig(vocab_size=512, hidden_size=64, intermediate_size=160,
                                       num_hidden_layers=6, num_attention_heads=4,
                                       num_key_value_heads=2, max_position_embeddings=128,
                                       tie_word_embeddings=False)
        model = transformers.LlamaForCausalLM(cfg)
    else:
        cfg = transformers.GPT2Config(vocab_size=512, n_embd=64, n_layer=6, n_head=4,
                                      n_positions=128)
        model = transformers.GPT2LMHeadModel(cfg)
    # Random init is small (std 0.02): scale so greedy continuations are not near ties.
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 2:
                p.mul_(4.0)
    model = model.to({"bf16": torch.bfloat16, "f16": torch.float16}[dtype])
    model.save_pretrained(out, safe_serialization=True)


def greedy(path, ids, n):
    model = transformers.AutoModelForCausalLM.from_pretrained(path, torch_dtype=torch.float32)
    model.eval()
    prompt = torch.tensor([[int(t) for t in ids.split(",")]])
    with torch.no_grad():
        out = model.generate(prompt, max_new_tokens=int(n), min_new_tokens=int(n),
                             do_sample=False, pad_token_id=0)
    print(",".join(str(int(t)) for t in out[0, prompt.shape[1]:]))


if __name__ == "__main__":
    {"make": make, "greedy": greedy}[sys.argv[1]](*sys.argv[2:])
