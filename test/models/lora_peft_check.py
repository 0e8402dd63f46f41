"""PEFT interop for `mammoth train --lora-*` (lora_peft_test.sh drives it).

  lora_peft_check.py make FAMILY DIR    transformers writes DIR/base (a tiny random model of
                                        FAMILY), DIR/data.bin (an llm.c token shard) and
                                        DIR/ids.safetensors (the evaluated sequences)
  lora_peft_check.py check FAMILY DIR   PeftModel.from_pretrained(DIR/base, DIR/run/adapter):
                                        every adapter tensor loaded under PEFT's names, its
                                        logits equal Mammoth's (DIR/ours.safetensors) and its
                                        loss equals `mammoth eval --adapter` (DIR/eval.json)
                                        within 1e-5 relative; DIR/merged (ckpt export
                                        --merge-lora) loads in transformers and equals PEFT's
                                        merge_and_unload().
"""
import json
import sys

import numpy as np
import torch
from safetensors.torch import load_file, save_file

VOCAB, T, B = 64, 16, 4


def make(family, d):
    torch.manual_seed(0)
    if family == "gpt2":
        from transformers import GPT2Config, GPT2LMHeadModel
        cfg = GPT2Config(vocab_size=VOCAB, n_positions=32, n_embd=32, n_layer=2, n_head=4,
                         resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
        model = GPT2LMHeadModel(cfg)
    else:  # llama, llama_all (the same model, other targets)
        from transformers import LlamaConfig, LlamaForCausalLM
        cfg = LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64,
                          num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                          max_position_embeddings=32, rms_norm_eps=1e-6,
                          tie_word_embeddings=False)
        model = LlamaForCausalLM(cfg)
    model.save_pretrained(f"{d}/base", safe_serialization=True)
    tokens = np.array([(i * 7 + i // 31) % VOCAB for i in range(8000)], dtype=np.uint16)
    header = np.zeros(256, dtype=np.int32)
    header[:3] = [20240520, 1, len(tokens)]
    with open(f"{d}/data.bin", "wb") as f:
        f.write(header.tobytes())
        f.write(tokens.tobytes())
    ids = torch.from_numpy(tokens[: B * T].astype(np.int64)).view(B, T)
    save_file({"ids": ids}, f"{d}/ids.safetensors")


def rel(a, b):
    return ((a - b).abs().max() / b.abs().max().clamp_min(1e-30)).item()


def check(family, d):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    ids = load_file(f"{d}/ids.safetensors")["ids"]
    adapter = f"{d}/run/adapter"
    cfg = json.load(open(f"{adapter}/adapter_config.json"))
    assert cfg["peft_type"] == "LORA" and cfg["task_type"] == "CAUSAL_LM", cfg
    assert cfg["fan_in_fan_out"] == (family == "gpt2"), cfg
    ours_file = load_file(f"{adapter}/adapter_model.safetensors")

    def peft_model():
        base = AutoModelForCausalLM.from_pretrained(f"{d}/base")
        return PeftModel.from_pretrained(base, adapter).eval()

    pm = peft_model()
    state = pm.state_dict()
    trained = 0.0
    for key, t in ours_file.items():
        # PEFT keeps the adapter's name inside the module path: lora_A.default.weight.
        inner = key.replace(".lora_A.weight", ".lora_A.default.weight").replace(
            ".lora_B.weight", ".lora_B.default.weight")
        assert inner in state, f"PEFT did not place {key} ({inner})"
        assert torch.equal(state[inner], t), key
        if ".lora_B." in key:
            trained = max(trained, t.abs().max().item())
    assert trained > 0, "every lora_B is still zero: training did not move the adapter"
    n_lora = sum(1 for k in state if ".lora_A.default." in k)
    assert n_lora == sum(1 for k in ours_file if ".lora_A." in k), (n_lora, list(ours_file))

    with torch.no_grad():
        out = pm(ids, labels=ids)
    ours = load_file(f"{d}/ours.safetensors")["logits"]
    e_logits = rel(ours, out.logits)
    mammoth_loss = json.load(open(f"{d}/eval.json"))["loss"]
    e_loss = abs(mammoth_loss - out.loss.item()) / abs(out.loss.item())
    base = AutoModelForCausalLM.from_pretrained(f"{d}/base").eval()
    with torch.no_grad():
        e_base = rel(base(ids).logits, out.logits)
    if family == "llama_all":
        assert cfg["target_modules"] == "all-linear", cfg["target_modules"]
        assert n_lora == 2 * 7, n_lora  # 2 layers x (q, k, v, o, gate, up, down), not lm_head
    print(f"{family}: logits vs PEFT {e_logits:.2e}, eval loss {mammoth_loss:.6f} vs PEFT "
          f"{out.loss.item():.6f} ({e_loss:.2e}); the adapter moves the logits by {e_base:.2e}")
    assert e_logits < 1e-5, e_logits
    assert e_loss < 1e-5, e_loss
    assert e_base > 1e-4, "the adapter does not change the model: the test could not fail"

    merged_ref = peft_model().merge_and_unload()
    merged = AutoModelForCausalLM.from_pretrained(f"{d}/merged").eval()
    ref_state, got_state = merged_ref.state_dict(), merged.state_dict()
    worst = 0.0
    for k, t in ref_state.items():
        assert k in got_state, k
        worst = max(worst, rel(got_state[k], t))
    with torch.no_grad():
        e_merged = rel(merged(ids).logits, out.logits)
    print(f"{family}: merged export vs PEFT merge_and_unload: weights {worst:.2e}, logits "
          f"{e_merged:.2e}")
    assert worst < 1e-6, worst
    assert e_merged < 1e-5, e_merged


if __name__ == "__main__":
    {"make": make, "check": check}[sys.argv[1]](sys.argv[2], sys.argv[3])
