"""Reference side of the model parity test: GPT-2, LLaMA (Mistral, Qwen2), BERT and ViT in plain
PyTorch.

Nothing of Mammoth runs here. Each family is written directly from its paper / Hugging Face
transformers' modeling file, over a flat dict of tensors named exactly as HF state dicts name
them (GPT-2's Conv1D weights [in, out], ViT's Conv2d patch weight [D, C, P, P]). The script
draws random weights and inputs, runs forward and backward in float64, and writes a directory
in Hugging Face's layout that Mammoth loads:

  DIR/config.json          HF config (model_type, sizes)
  DIR/model.safetensors    the weights (float32, HF names)
  DIR/expected.safetensors inputs ("input.*"), "logits", "loss" and "grad.<hf name>" (float64)

usage: reference.py --family gpt2|gpt2_untied|llama|mistral|qwen2|bert|vit --out DIR [--seed N]

mistral and qwen2 are LLaMA with modeling_mistral's sliding window and modeling_qwen2's q/k/v
biases and tied embeddings.

gpt2_untied is GPT-2 with tie_word_embeddings false: its own lm_head.weight [V, C], and the file
in GPT2LMHeadModel's names ("transformer.h.0...", "lm_head.weight") as transformers writes it.
"""
import argparse
import json
import math
import os
import struct

import numpy as np
import torch

torch.set_default_dtype(torch.float64)

# ---------------------------------------------------------------- safetensors (format by hand)

_DTYPES = {np.dtype("float32"): "F32", np.dtype("float64"): "F64", np.dtype("int64"): "I64"}


def save_safetensors(path, tensors, metadata=None):
    """Writes the safetensors layout: u64 LE header size, JSON header, packed data."""
    header, blobs, offset = {}, [], 0
    for name, t in tensors.items():
        a = np.asarray(t.detach().cpu().numpy() if torch.is_tensor(t) else t)
        if not a.flags.c_contiguous:  # (np.ascontiguousarray would turn a scalar into [1])
            a = a.copy()
        b = a.tobytes()
        header[name] = {"dtype": _DTYPES[a.dtype], "shape": list(a.shape),
                        "data_offsets": [offset, offset + len(b)]}
        blobs.append(b)
        offset += len(b)
    if metadata:
        header["__metadata__"] = metadata
    h = json.dumps(header).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for b in blobs:
            f.write(b)

# ---------------------------------------------------------------- shared pieces


def layer_norm(x, w, b, eps):
    mu = x.mean(-1, keepdim=True)
    var = ((x - mu) ** 2).mean(-1, keepdim=True)
    return (x - mu) / torch.sqrt(var + eps) * w + b


def rms_norm(x, w, eps):
    return x / torch.sqrt((x * x).mean(-1, keepdim=True) + eps) * w


def gelu_tanh(x):  # GPT-2's "gelu_new"
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x ** 3)))


def gelu_erf(x):  # BERT / ViT "gelu"
    return 0.5 * x * (1.0 + torch.erf(x / math.sqrt(2.0)))


def sdpa(q, k, v, causal=False, key_keep=None, window=None):
    """q, k, v [B, H, T, D]; key_keep bool [B, Tk] (True = attend); window: Mistral's
    sliding_window, which (modeling_mistral's _update_causal_mask) also hides key j from query i
    when j <= i - window."""
    s = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    if causal:
        T = q.shape[-2]
        s = s.masked_fill(torch.triu(torch.ones(T, T, dtype=torch.bool), 1), float("-inf"))
    if window is not None:
        i = torch.arange(q.shape[-2])[:, None]
        j = torch.arange(k.shape[-2])[None, :]
        s = s.masked_fill(j <= i - window, float("-inf"))
    if key_keep is not None:
        s = s.masked_fill(~key_keep[:, None, None, :], float("-inf"))
    return torch.softmax(s, -1) @ v


def heads(x, n):  # [B, T, n*D] -> [B, n, T, D]
    B, T, C = x.shape
    return x.view(B, T, n, C // n).transpose(1, 2)


def merge(x):  # [B, H, T, D] -> [B, T, H*D]
    B, H, T, D = x.shape
    return x.transpose(1, 2).reshape(B, T, H * D)


def lin(x, p, name, bias=True):  # nn.Linear: weight [out, in]
    y = x @ p[name + ".weight"].T
    return y + p[name + ".bias"] if bias else y

# ---------------------------------------------------------------- GPT-2


def gpt2_config():
    return {"model_type": "gpt2", "vocab_size": 96, "n_positions": 24, "n_embd": 32,
            "n_layer": 2, "n_head": 4, "n_inner": None, "layer_norm_epsilon": 1e-5,
            "resid_pdrop": 0.0, "embd_pdrop": 0.0, "attn_pdrop": 0.0,
            "activation_function": "gelu_new"}


def gpt2_shapes(c):
    d, f = c["n_embd"], 4 * c["n_embd"]
    s = {"wte.weight": (c["vocab_size"], d), "wpe.weight": (c["n_positions"], d)}
    for i in range(c["n_layer"]):
        h = f"h.{i}."
        s.update({h + "ln_1.weight": (d,), h + "ln_1.bias": (d,),
                  h + "attn.c_attn.weight": (d, 3 * d), h + "attn.c_attn.bias": (3 * d,),
                  h + "attn.c_proj.weight": (d, d), h + "attn.c_proj.bias": (d,),
                  h + "ln_2.weight": (d,), h + "ln_2.bias": (d,),
                  h + "mlp.c_fc.weight": (d, f), h + "mlp.c_fc.bias": (f,),
                  h + "mlp.c_proj.weight": (f, d), h + "mlp.c_proj.bias": (d,)})
    s.update({"ln_f.weight": (d,), "ln_f.bias": (d,)})
    return s


def gpt2_forward(p, c, inputs):
    ids = inputs["ids"]
    B, T = ids.shape
    eps, H = c["layer_norm_epsilon"], c["n_head"]
    conv1d = lambda x, n: x @ p[n + ".weight"] + p[n + ".bias"]  # HF Conv1D: [in, out]
    x = p["wte.weight"][ids] + p["wpe.weight"][torch.arange(T)]
    for i in range(c["n_layer"]):
        h = f"h.{i}."
        a = layer_norm(x, p[h + "ln_1.weight"], p[h + "ln_1.bias"], eps)
        q, k, v = conv1d(a, h + "attn.c_attn").split(c["n_embd"], dim=-1)
        y = merge(sdpa(heads(q, H), heads(k, H), heads(v, H), causal=True))
        x = x + conv1d(y, h + "attn.c_proj")
        m = layer_norm(x, p[h + "ln_2.weight"], p[h + "ln_2.bias"], eps)
        x = x + conv1d(gelu_tanh(conv1d(m, h + "mlp.c_fc")), h + "mlp.c_proj")
    x = layer_norm(x, p["ln_f.weight"], p["ln_f.bias"], eps)
    # GPT2LMHeadModel: lm_head (nn.Linear, no bias), tied to wte unless tie_word_embeddings false
    logits = x @ (p["wte.weight"] if c.get("tie_word_embeddings", True) else p["lm_head.weight"]).T
    V = logits.shape[-1]
    loss = torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, V), ids[:, 1:].reshape(-1))
    return logits, loss


def gpt2_untied_config():
    return dict(gpt2_config(), tie_word_embeddings=False)


def gpt2_untied_shapes(c):
    return dict(gpt2_shapes(c), **{"lm_head.weight": (c["vocab_size"], c["n_embd"])})


def gpt2_untied_file_name(name):  # GPT2LMHeadModel's state dict: the body under "transformer."
    return name if name.startswith("lm_head.") else "transformer." + name

# ---------------------------------------------------------------- LLaMA


def llama_config():
    return {"model_type": "llama", "vocab_size": 80, "hidden_size": 32,
            "intermediate_size": 72, "num_hidden_layers": 2, "num_attention_heads": 4,
            "num_key_value_heads": 2, "max_position_embeddings": 32, "rms_norm_eps": 1e-6,
            "rope_theta": 10000.0, "hidden_act": "silu", "tie_word_embeddings": False}


def llama_shapes(c):
    d, f, V = c["hidden_size"], c["intermediate_size"], c["vocab_size"]
    D = d // c["num_attention_heads"]
    kv = c["num_key_value_heads"] * D
    s = {"model.embed_tokens.weight": (V, d)}
    for i in range(c["num_hidden_layers"]):
        h = f"model.layers.{i}."
        s.update({h + "input_layernorm.weight": (d,),
                  h + "self_attn.q_proj.weight": (d, d), h + "self_attn.k_proj.weight": (kv, d),
                  h + "self_attn.v_proj.weight": (kv, d), h + "self_attn.o_proj.weight": (d, d),
                  h + "post_attention_layernorm.weight": (d,),
                  h + "mlp.gate_proj.weight": (f, d), h + "mlp.up_proj.weight": (f, d),
                  h + "mlp.down_proj.weight": (d, f)})
        if c["model_type"] == "qwen2":  # modeling_qwen2: q/k/v_proj with bias=True
            s.update({h + "self_attn.q_proj.bias": (d,), h + "self_attn.k_proj.bias": (kv,),
                      h + "self_attn.v_proj.bias": (kv,)})
    s["model.norm.weight"] = (d,)
    if not c["tie_word_embeddings"]:
        s["lm_head.weight"] = (V, d)
    return s


def mistral_config():  # sliding_window 5 < the 12 positions of make_inputs: the window matters
    return dict(llama_config(), model_type="mistral", sliding_window=5)


def qwen2_config():  # q/k/v bias, tied embeddings (as Qwen2's small checkpoints)
    return dict(llama_config(), model_type="qwen2", tie_word_embeddings=True,
                use_sliding_window=False, sliding_window=4096, max_window_layers=2)


def rotate_half(x):
    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2:]
    return torch.cat((-x2, x1), dim=-1)


def llama_forward(p, c, inputs):
    ids = inputs["ids"]
    B, T = ids.shape
    H, Hk = c["num_attention_heads"], c["num_key_value_heads"]
    D = c["hidden_size"] // H
    eps = c["rms_norm_eps"]
    bias = c["model_type"] == "qwen2"
    window = c.get("sliding_window") if c["model_type"] == "mistral" else None
    inv_freq = 1.0 / (c["rope_theta"] ** (torch.arange(0, D, 2, dtype=torch.float64) / D))
    freqs = torch.outer(torch.arange(T, dtype=torch.float64), inv_freq)
    emb = torch.cat((freqs, freqs), dim=-1)
    cos, sin = emb.cos(), emb.sin()  # [T, D]
    rope = lambda x: x * cos + rotate_half(x) * sin  # x [B, H, T, D]
    x = p["model.embed_tokens.weight"][ids]
    for i in range(c["num_hidden_layers"]):
        h = f"model.layers.{i}."
        a = rms_norm(x, p[h + "input_layernorm.weight"], eps)
        q = rope(heads(lin(a, p, h + "self_attn.q_proj", bias), H))
        k = rope(heads(lin(a, p, h + "self_attn.k_proj", bias), Hk))
        v = heads(lin(a, p, h + "self_attn.v_proj", bias), Hk)
        # repeat_kv: query head j reads key/value head j // (H / Hk)
        k = k.repeat_interleave(H // Hk, dim=1)
        v = v.repeat_interleave(H // Hk, dim=1)
        x = x + lin(merge(sdpa(q, k, v, causal=True, window=window)), p, h + "self_attn.o_proj",
                    False)
        m = rms_norm(x, p[h + "post_attention_layernorm.weight"], eps)
        g = lin(m, p, h + "mlp.gate_proj", False)
        x = x + lin(torch.nn.functional.silu(g) * lin(m, p, h + "mlp.up_proj", False), p,
                    h + "mlp.down_proj", False)
    x = rms_norm(x, p["model.norm.weight"], eps)
    head = "model.embed_tokens.weight" if c["tie_word_embeddings"] else "lm_head.weight"
    logits = x @ p[head].T
    V = logits.shape[-1]
    loss = torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, V), ids[:, 1:].reshape(-1))
    return logits, loss

# ---------------------------------------------------------------- BERT


def bert_config():
    return {"model_type": "bert", "vocab_size": 90, "hidden_size": 32, "num_hidden_layers": 2,
            "num_attention_heads": 4, "intermediate_size": 64, "hidden_act": "gelu",
            "hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0,
            "max_position_embeddings": 24, "type_vocab_size": 2, "layer_norm_eps": 1e-12,
            "position_embedding_type": "absolute", "id2label": {"0": "A", "1": "B", "2": "C"}}


def bert_shapes(c):
    d, f, V = c["hidden_size"], c["intermediate_size"], c["vocab_size"]
    e = "bert.embeddings."
    s = {e + "word_embeddings.weight": (V, d),
         e + "position_embeddings.weight": (c["max_position_embeddings"], d),
         e + "token_type_embeddings.weight": (c["type_vocab_size"], d),
         e + "LayerNorm.weight": (d,), e + "LayerNorm.bias": (d,)}
    for i in range(c["num_hidden_layers"]):
        h = f"bert.encoder.layer.{i}."
        for n in ("query", "key", "value"):
            s[h + f"attention.self.{n}.weight"] = (d, d)
            s[h + f"attention.self.{n}.bias"] = (d,)
        s.update({h + "attention.output.dense.weight": (d, d),
                  h + "attention.output.dense.bias": (d,),
                  h + "attention.output.LayerNorm.weight": (d,),
                  h + "attention.output.LayerNorm.bias": (d,),
                  h + "intermediate.dense.weight": (f, d), h + "intermediate.dense.bias": (f,),
                  h + "output.dense.weight": (d, f), h + "output.dense.bias": (d,),
                  h + "output.LayerNorm.weight": (d,), h + "output.LayerNorm.bias": (d,)})
    L = len(c["id2label"])
    s.update({"bert.pooler.dense.weight": (d, d), "bert.pooler.dense.bias": (d,),
              "cls.predictions.transform.dense.weight": (d, d),
              "cls.predictions.transform.dense.bias": (d,),
              "cls.predictions.transform.LayerNorm.weight": (d,),
              "cls.predictions.transform.LayerNorm.bias": (d,),
              "cls.predictions.bias": (V,),
              "classifier.weight": (L, d), "classifier.bias": (L,)})
    return s


def bert_forward(p, c, inputs):
    ids, types, keep = inputs["ids"], inputs["token_type_ids"], inputs["attention_mask"].bool()
    B, T = ids.shape
    H, eps = c["num_attention_heads"], c["layer_norm_eps"]
    e = "bert.embeddings."
    x = (p[e + "word_embeddings.weight"][ids] + p[e + "position_embeddings.weight"][torch.arange(T)]
         + p[e + "token_type_embeddings.weight"][types])
    x = layer_norm(x, p[e + "LayerNorm.weight"], p[e + "LayerNorm.bias"], eps)
    for i in range(c["num_hidden_layers"]):
        h = f"bert.encoder.layer.{i}."
        q, k, v = (heads(lin(x, p, h + f"attention.self.{n}"), H) for n in ("query", "key", "value"))
        a = lin(merge(sdpa(q, k, v, key_keep=keep)), p, h + "attention.output.dense")
        x = layer_norm(a + x, p[h + "attention.output.LayerNorm.weight"],
                       p[h + "attention.output.LayerNorm.bias"], eps)
        m = lin(gelu_erf(lin(x, p, h + "intermediate.dense")), p, h + "output.dense")
        x = layer_norm(m + x, p[h + "output.LayerNorm.weight"], p[h + "output.LayerNorm.bias"], eps)
    t = gelu_erf(lin(x, p, "cls.predictions.transform.dense"))
    t = layer_norm(t, p["cls.predictions.transform.LayerNorm.weight"],
                   p["cls.predictions.transform.LayerNorm.bias"], eps)
    logits = t @ p[e + "word_embeddings.weight"].T + p["cls.predictions.bias"]  # tied decoder
    pooled = torch.tanh(lin(x[:, 0], p, "bert.pooler.dense"))
    class_logits = lin(pooled, p, "classifier")
    V = logits.shape[-1]
    mlm = torch.nn.functional.cross_entropy(logits.reshape(-1, V), inputs["targets"].reshape(-1),
                                            ignore_index=-100)
    cls = torch.nn.functional.cross_entropy(class_logits, inputs["labels"])
    return (logits, class_logits), mlm + cls

# ---------------------------------------------------------------- ViT


def vit_config():
    return {"model_type": "vit", "hidden_size": 32, "num_hidden_layers": 2,
            "num_attention_heads": 4, "intermediate_size": 64, "hidden_act": "gelu",
            "hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0,
            "layer_norm_eps": 1e-12, "image_size": 16, "patch_size": 4, "num_channels": 3,
            "qkv_bias": True, "id2label": {str(i): f"L{i}" for i in range(5)}}


def vit_shapes(c):
    d, f, P, C = c["hidden_size"], c["intermediate_size"], c["patch_size"], c["num_channels"]
    N = (c["image_size"] // P) ** 2
    e = "vit.embeddings."
    s = {e + "cls_token": (1, 1, d), e + "position_embeddings": (1, N + 1, d),
         e + "patch_embeddings.projection.weight": (d, C, P, P),
         e + "patch_embeddings.projection.bias": (d,)}
    for i in range(c["num_hidden_layers"]):
        h = f"vit.encoder.layer.{i}."
        for n in ("query", "key", "value"):
            s[h + f"attention.attention.{n}.weight"] = (d, d)
            s[h + f"attention.attention.{n}.bias"] = (d,)
        s.update({h + "attention.output.dense.weight": (d, d),
                  h + "attention.output.dense.bias": (d,),
                  h + "layernorm_before.weight": (d,), h + "layernorm_before.bias": (d,),
                  h + "layernorm_after.weight": (d,), h + "layernorm_after.bias": (d,),
                  h + "intermediate.dense.weight": (f, d), h + "intermediate.dense.bias": (f,),
                  h + "output.dense.weight": (d, f), h + "output.dense.bias": (d,)})
    L = len(c["id2label"])
    s.update({"vit.layernorm.weight": (d,), "vit.layernorm.bias": (d,),
              "classifier.weight": (L, d), "classifier.bias": (L,)})
    return s


def vit_forward(p, c, inputs):
    px = inputs["pixels"]
    B = px.shape[0]
    H, eps, P = c["num_attention_heads"], c["layer_norm_eps"], c["patch_size"]
    e = "vit.embeddings."
    # A real convolution here, so the reference does not share our patches-as-matmul idea.
    x = torch.nn.functional.conv2d(px, p[e + "patch_embeddings.projection.weight"],
                                   p[e + "patch_embeddings.projection.bias"], stride=P)
    x = x.flatten(2).transpose(1, 2)  # [B, N, D]
    x = torch.cat([p[e + "cls_token"].expand(B, -1, -1), x], dim=1) + p[e + "position_embeddings"]
    for i in range(c["num_hidden_layers"]):
        h = f"vit.encoder.layer.{i}."
        a = layer_norm(x, p[h + "layernorm_before.weight"], p[h + "layernorm_before.bias"], eps)
        q, k, v = (heads(lin(a, p, h + f"attention.attention.{n}"), H)
                   for n in ("query", "key", "value"))
        x = x + lin(merge(sdpa(q, k, v)), p, h + "attention.output.dense")
        m = layer_norm(x, p[h + "layernorm_after.weight"], p[h + "layernorm_after.bias"], eps)
        x = x + lin(gelu_erf(lin(m, p, h + "intermediate.dense")), p, h + "output.dense")
    x = layer_norm(x, p["vit.layernorm.weight"], p["vit.layernorm.bias"], eps)
    logits = lin(x[:, 0], p, "classifier")
    return logits, torch.nn.functional.cross_entropy(logits, inputs["labels"])

# ---------------------------------------------------------------- driver


def make_inputs(family, c, g):
    B, T = 2, 12
    if family == "vit":
        s = c["image_size"]
        return {"pixels": torch.randn(B, c["num_channels"], s, s, generator=g),
                "labels": torch.randint(0, len(c["id2label"]), (B,), generator=g)}
    ids = torch.randint(0, c["vocab_size"], (B, T), generator=g)
    if family != "bert":
        return {"ids": ids}
    targets = torch.full((B, T), -100, dtype=torch.int64)
    pick = torch.rand(B, T, generator=g) < 0.4
    pick[:, 1] = True
    targets[pick] = torch.randint(0, c["vocab_size"], (B, T), generator=g)[pick]
    mask = torch.ones(B, T, dtype=torch.int64)
    mask[1, T - 3:] = 0  # padding at the end of the second sequence
    return {"ids": ids, "targets": targets,
            "token_type_ids": (torch.arange(T) >= T // 2).long().expand(B, T).contiguous(),
            "attention_mask": mask,
            "labels": torch.randint(0, len(c["id2label"]), (B,), generator=g)}


FAMILIES = {"gpt2": (gpt2_config, gpt2_shapes, gpt2_forward),
            "gpt2_untied": (gpt2_untied_config, gpt2_untied_shapes, gpt2_forward),
            "llama": (llama_config, llama_shapes, llama_forward),
            "mistral": (mistral_config, llama_shapes, llama_forward),
            "qwen2": (qwen2_config, llama_shapes, llama_forward),
            "bert": (bert_config, bert_shapes, bert_forward),
            "vit": (vit_config, vit_shapes, vit_forward)}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--family", required=True, choices=sorted(FAMILIES))
    ap.add_argument("--out", required=True)
    ap.add_argument("--seed", type=int, default=1234)
    args = ap.parse_args()
    config_fn, shapes_fn, forward_fn = FAMILIES[args.family]
    c = config_fn()
    g = torch.Generator().manual_seed(args.seed)
    params = {}
    for name, shape in shapes_fn(c).items():
        if len(shape) == 1 and ("norm" in name.lower() or name.endswith("ln_1.weight")
                                or name.endswith("ln_2.weight") or name.endswith("ln_f.weight")):
            t = 1.0 + 0.2 * torch.randn(shape, generator=g) if name.endswith("weight") else \
                0.2 * torch.randn(shape, generator=g)
        else:
            t = 0.2 * torch.randn(shape, generator=g)
        # float32 values, so that the float32 file holds exactly what the reference used
        params[name] = t.float().double().requires_grad_()
    inputs = make_inputs(args.family, c, g)
    out, loss = forward_fn(params, c, inputs)
    loss.backward()
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "config.json"), "w") as f:
        json.dump(c, f, indent=2)
    file_name = gpt2_untied_file_name if args.family == "gpt2_untied" else (lambda n: n)
    save_safetensors(os.path.join(args.out, "model.safetensors"),
                     {file_name(n): t.detach().float() for n, t in params.items()},
                     {"format": "pt"})
    expected = {"input." + k: v for k, v in inputs.items()}
    if isinstance(out, tuple):
        expected["logits"], expected["class_logits"] = out[0].detach(), out[1].detach()
    else:
        expected["logits"] = out.detach()
    expected["loss"] = loss.detach().reshape(())
    for n, t in params.items():
        expected["grad." + file_name(n)] = t.grad
    save_safetensors(os.path.join(args.out, "expected.safetensors"), expected)
    print(f"{args.family}: {len(params)} tensors, loss {loss.item():.6f} -> {args.out}")


if __name__ == "__main__":
    main()
