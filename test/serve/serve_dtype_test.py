"""`mammoth serve --dtype bf16` on a bf16 Hugging Face directory (GPT-2 and LLaMA, written by
transformers): the parameters stay bf16 in memory (the loader says so), and greedy completions
through the openai client equal transformers' greedy continuation on the same weights widened
to float32, for text prompts, streaming and not; --dtype f32 on the same directory gives the
same completions.

  serve_dtype_test.py MAMMOTH
"""
import os
import shutil
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from serve_fixture import Server, fail, make_model_dir  # noqa: E402

try:
    import openai
    import torch
    import transformers
    from tokenizers import Tokenizer
except ImportError as e:
    fail(f"Python packages openai/torch/transformers/tokenizers are not importable by "
         f"{sys.executable} ({e})")

PROMPTS = ["the of and", "which this be new", "first one their its"]
MAX_NEW = 12


def check(cond, msg):
    if not cond:
        fail(msg)


def bf16_copy(src, dst, family):
    cls = transformers.LlamaForCausalLM if family == "llama" else transformers.GPT2LMHeadModel
    model = cls.from_pretrained(src, torch_dtype=torch.float32)
    model.to(torch.bfloat16).save_pretrained(dst, safe_serialization=True)
    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(os.path.join(src, f), os.path.join(dst, f))
    return cls


def reference(cls, path, ids, eos):
    """transformers' greedy continuation on the bf16 file's weights widened to float32."""
    model = cls.from_pretrained(path, torch_dtype=torch.float32).eval()
    out = []
    with torch.no_grad():
        seq = list(ids)
        for _ in range(MAX_NEW):
            nxt = int(model(torch.tensor([seq])).logits[0, -1].argmax())
            out.append(nxt)
            if nxt == eos:
                break
            seq.append(nxt)
    return out


def main():
    mammoth = os.path.abspath(sys.argv[1])
    tmp = tempfile.mkdtemp(dir=os.environ.get("TEST_TMPDIR"))
    for family in ("gpt2", "llama"):
        src = make_model_dir(os.path.join(tmp, family), family=family)
        dst = os.path.join(tmp, family + "-bf16")
        cls = bf16_copy(src, dst, family)
        hf = Tokenizer.from_file(os.path.join(dst, "tokenizer.json"))
        eos = hf.token_to_id("<|endoftext|>")
        want, lengths = {}, []
        for p in PROMPTS:
            ids = reference(cls, dst, hf.encode(p).ids, eos)
            want[p] = hf.decode([i for i in ids if i != eos], skip_special_tokens=True)
            lengths.append(len([i for i in ids if i != eos]))
        # The comparison must cover real continuations, not an immediate end of text.
        check(max(lengths) == MAX_NEW, f"{family}: reference continuations of {lengths} tokens")
        for dtype in ("bf16", "f32"):
            srv = Server(mammoth, dst, "--dtype", dtype, "--threads", "1")
            client = openai.OpenAI(base_url=srv.url + "/v1", api_key="unused", max_retries=0)
            for p in PROMPTS:
                r = client.completions.create(model=srv.model, prompt=p, max_tokens=MAX_NEW,
                                              temperature=0)
                got = r.choices[0].text
                check(got == want[p], f"{family} --dtype {dtype} {p!r}: server {got!r}, "
                      f"transformers {want[p]!r}")
                streamed = "".join(
                    c.choices[0].text for c in client.completions.create(
                        model=srv.model, prompt=p, max_tokens=MAX_NEW, temperature=0,
                        stream=True) if c.choices)
                check(streamed == want[p], f"{family} --dtype {dtype} {p!r} streamed: "
                      f"{streamed!r}, transformers {want[p]!r}")
            err = srv.stop()
            check(f"in {dtype} (" in err, f"{family}: the loader does not say the parameters are "
                  f"{dtype}: {err[-600:]}")
            print(f"{family} bf16 file, serve --dtype {dtype}: {len(PROMPTS)} greedy completions "
                  f"({lengths} tokens) equal transformers', streaming and not")
    shutil.rmtree(tmp, ignore_errors=True)
    print("PASS")


main()
