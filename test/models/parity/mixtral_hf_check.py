"""transformers' side of the Mixtral parity test: MixtralForCausalLM (transformers 4.44) loads
each directory (mixtral_reference.py's, and the one Mammoth wrote back) and must reproduce the
reference's logits and loss. transformers adds router_aux_loss_coef * its load-balancing loss
(output_router_logits is on) but knows no z-loss: that term is added here from the router
logits transformers returns.

usage: mixtral_hf_check.py EXPECTED_DIR DIR...
"""
import json
import os
import sys

import torch
import transformers

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from hf_check import load_safetensors  # noqa: E402


def main():
    expected = load_safetensors(os.path.join(sys.argv[1], "expected.safetensors"))
    ids = expected["input.ids"]
    worst = 0.0
    for d in sys.argv[2:]:
        model = transformers.MixtralForCausalLM.from_pretrained(d, torch_dtype=torch.float64)
        model.eval()
        with torch.no_grad():
            out = model(input_ids=ids, labels=ids, output_router_logits=True)
        z = torch.logsumexp(torch.cat(out.router_logits, 0), dim=-1).pow(2).mean()
        loss = out.loss + getattr(model.config, "router_z_loss_coef", 0.0) * z
        for name, ours in (("logits", out.logits), ("loss", loss)):
            ref = expected[name]
            e = ((ours - ref).abs().max() / ref.abs().max()).item()
            worst = max(worst, e)
            print(f"transformers {d} {name}: rel {e:.3e}")
    print(json.dumps({"transformers": transformers.__version__, "max_rel": worst}))
    # transformers softmaxes the router in float32 and builds rotary cos/sin in float32.
    sys.exit(0 if worst < 2e-6 else 1)


if __name__ == "__main__":
    main()
