"""Reference side of the Mixtral parity test: plain PyTorch from transformers 4.44's
modeling_mixtral.py (MixtralSparseMoeBlock, load_balancing_loss_func), nothing of Mammoth.

Writes the directory layout reference.py writes (config.json, model.safetensors,
expected.safetensors with inputs, logits, loss and grad.<hf name>, float64) for one case:

  dropless   HF's routing (every token to its top-k experts), aux loss and z-loss on
  capacity   each expert keeps the first C = ceil(factor * N * k / E) tokens that chose it,
             in token order; dropped (token, expert) pairs contribute nothing (Mammoth's rule)
  empty      8 experts for 6 tokens: at least one expert of some layer receives no token

usage: mixtral_reference.py --case dropless|capacity|empty --out DIR [--seed N]
Prints one JSON line: the case, per-layer tokens per expert, dropped pairs.
"""
import argparse
import json
import math
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from reference import heads, lin, merge, rms_norm, rotate_half, save_safetensors, sdpa  # noqa

torch.set_default_dtype(torch.float64)

CAPACITY_FACTOR = 0.75


def config(case):
    return {"model_type": "mixtral", "vocab_size": 80, "hidden_size": 32,
            "intermediate_size": 40, "num_hidden_layers": 2, "num_attention_heads": 4,
            "num_key_value_heads": 2, "max_position_embeddings": 32, "rms_norm_eps": 1e-5,
            "rope_theta": 10000.0, "hidden_act": "silu", "tie_word_embeddings": False,
            "sliding_window": None, "num_local_experts": 8 if case == "empty" else 4,
            "num_experts_per_tok": 2, "output_router_logits": True,
            "router_aux_loss_coef": 0.02, "router_z_loss_coef": 0.01,
            "router_jitter_noise": 0.0}


def shapes(c):
    d, f, V, E = c["hidden_size"], c["intermediate_size"], c["vocab_size"], c["num_local_experts"]
    kv = c["num_key_value_heads"] * (d // c["num_attention_heads"])
    s = {"model.embed_tokens.weight": (V, d)}
    for i in range(c["num_hidden_layers"]):
        h = f"model.layers.{i}."
        s.update({h + "input_layernorm.weight": (d,),
                  h + "self_attn.q_proj.weight": (d, d), h + "self_attn.k_proj.weight": (kv, d),
                  h + "self_attn.v_proj.weight": (kv, d), h + "self_attn.o_proj.weight": (d, d),
                  h + "post_attention_layernorm.weight": (d,),
                  h + "block_sparse_moe.gate.weight": (E, d)})
        for e in range(E):
            x = f"{h}block_sparse_moe.experts.{e}."
            s.update({x + "w1.weight": (f, d), x + "w2.weight": (d, f), x + "w3.weight": (f, d)})
    s.update({"model.norm.weight": (d,), "lm_head.weight": (V, d)})
    return s


def moe(p, c, h, prefix, capacity_factor, stats):
    """MixtralSparseMoeBlock.forward on h [N, C]; returns (out [N, C], router logits [N, E])."""
    E, k = c["num_local_experts"], c["num_experts_per_tok"]
    N = h.shape[0]
    router_logits = lin(h, p, prefix + "gate", False)
    routing_weights = torch.softmax(router_logits, dim=1)
    routing_weights, selected = torch.topk(routing_weights, k, dim=-1)
    routing_weights = routing_weights / routing_weights.sum(dim=-1, keepdim=True)
    capacity = math.ceil(capacity_factor * N * k / E) if capacity_factor > 0 else N
    out = torch.zeros_like(h)
    expert_mask = torch.nn.functional.one_hot(selected, num_classes=E).permute(2, 1, 0)
    tokens, dropped = [], 0
    for e in range(E):
        idx, top_x = torch.where(expert_mask[e])
        order = torch.argsort(top_x)  # token order (a token picks an expert at most once)
        idx, top_x = idx[order], top_x[order]
        tokens.append(int(top_x.numel()))
        dropped += max(0, int(top_x.numel()) - capacity)
        idx, top_x = idx[:capacity], top_x[:capacity]
        x = h[top_x]
        ep = f"{prefix}experts.{e}."
        y = lin(torch.nn.functional.silu(lin(x, p, ep + "w1", False)) * lin(x, p, ep + "w3", False),
                p, ep + "w2", False)
        out = out.index_add(0, top_x, y * routing_weights[top_x, idx, None])
    stats.append({"tokens": tokens, "dropped": dropped})
    return out, router_logits


def load_balancing_loss(gate_logits, E, k):
    """transformers' load_balancing_loss_func without an attention mask."""
    concatenated = torch.cat(gate_logits, dim=0)
    routing_weights = torch.softmax(concatenated, dim=-1)
    _, selected = torch.topk(routing_weights, k, dim=-1)
    expert_mask = torch.nn.functional.one_hot(selected, E)
    tokens_per_expert = torch.mean(expert_mask.to(routing_weights.dtype), dim=0)
    router_prob_per_expert = torch.mean(routing_weights, dim=0)
    return torch.sum(tokens_per_expert * router_prob_per_expert.unsqueeze(0)) * E


def forward(p, c, ids, capacity_factor, stats):
    B, T = ids.shape
    H, Hk = c["num_attention_heads"], c["num_key_value_heads"]
    d = c["hidden_size"]
    D = d // H
    eps = c["rms_norm_eps"]
    inv_freq = 1.0 / (c["rope_theta"] ** (torch.arange(0, D, 2, dtype=torch.float64) / D))
    freqs = torch.outer(torch.arange(T, dtype=torch.float64), inv_freq)
    emb = torch.cat((freqs, freqs), dim=-1)
    cos, sin = emb.cos(), emb.sin()
    rope = lambda x: x * cos + rotate_half(x) * sin  # noqa: E731
    x = p["model.embed_tokens.weight"][ids]
    gate_logits = []
    for i in range(c["num_hidden_layers"]):
        h = f"model.layers.{i}."
        a = rms_norm(x, p[h + "input_layernorm.weight"], eps)
        q = rope(heads(lin(a, p, h + "self_attn.q_proj", False), H))
        k = rope(heads(lin(a, p, h + "self_attn.k_proj", False), Hk))
        v = heads(lin(a, p, h + "self_attn.v_proj", False), Hk)
        k = k.repeat_interleave(H // Hk, dim=1)
        v = v.repeat_interleave(H // Hk, dim=1)
        x = x + lin(merge(sdpa(q, k, v, causal=True)), p, h + "self_attn.o_proj", False)
        m = rms_norm(x, p[h + "post_attention_layernorm.weight"], eps).reshape(B * T, d)
        y, logits = moe(p, c, m, h + "block_sparse_moe.", capacity_factor, stats)
        gate_logits.append(logits)
        x = x + y.reshape(B, T, d)
    x = rms_norm(x, p["model.norm.weight"], eps)
    logits = lin(x, p, "lm_head", False)
    V = logits.shape[-1]
    loss = torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, V), ids[:, 1:].reshape(-1))
    aux = load_balancing_loss(gate_logits, c["num_local_experts"], c["num_experts_per_tok"])
    z = torch.logsumexp(torch.cat(gate_logits, 0), dim=-1).pow(2).mean()
    loss = loss + c["router_aux_loss_coef"] * aux + c["router_z_loss_coef"] * z
    return logits, loss


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--case", required=True, choices=["dropless", "capacity", "empty"])
    ap.add_argument("--out", required=True)
    ap.add_argument("--seed", type=int, default=1234)
    args = ap.parse_args()
    c = config(args.case)
    g = torch.Generator().manual_seed(args.seed)
    params = {}
    for name, shape in shapes(c).items():
        if len(shape) == 1:
            t = 1.0 + 0.2 * torch.randn(shape, generator=g)
        else:
            t = 0.2 * torch.randn(shape, generator=g)
        params[name] = t.float().double().requires_grad_()
    B, T = (1, 6) if args.case == "empty" else (2, 12)
    ids = torch.randint(0, c["vocab_size"], (B, T), generator=g)
    stats = []
    factor = CAPACITY_FACTOR if args.case == "capacity" else 0.0
    logits, loss = forward(params, c, ids, factor, stats)
    loss.backward()
    # The case must exercise what it names.
    if args.case == "capacity":
        assert sum(s["dropped"] for s in stats) > 0, stats
    if args.case == "empty":
        assert any(0 in s["tokens"] for s in stats), stats
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "config.json"), "w") as f:
        json.dump(c, f, indent=2)
    save_safetensors(os.path.join(args.out, "model.safetensors"),
                     {n: t.detach().float() for n, t in params.items()}, {"format": "pt"})
    expected = {"input.ids": ids, "logits": logits.detach(), "loss": loss.detach().reshape(())}
    for n, t in params.items():
        expected["grad." + n] = t.grad
    save_safetensors(os.path.join(args.out, "expected.safetensors"), expected)
    print(json.dumps({"case": args.case, "capacity_factor": factor, "layers": stats,
                      "loss": loss.item()}))


if __name__ == "__main__":
    main()
