#!/usr/bin/env python3
"""`mpirun -np 2 mammoth serve --tp 2` against one process, through the official openai client.

For a tiny Hugging Face GPT-2, a tiny LLaMA (grouped-query attention with one
key/value head, so each rank holds a copy of it) and the same as Mistral with a sliding window
of 4 (shorter than the prompts): the greedy completions of several prompts,
sent concurrently to the tp server, streaming and not, equal the completions one process
serves for the same prompts, and so do chat completions; the KV pool is empty afterwards. A
client that disconnects mid-stream has its sequence cancelled (the pool returns to empty:
rank 0 sends the block tables with every step, so the other rank's pool follows). SIGTERM to
rank 0 ends both ranks (mpirun exits 0) and the follower has run the steps. Refused by name: a
family without a tensor-parallel KV cache (BERT) and heads that do not divide by tp.

Usage: serve_tp_test.py PATH/TO/mammoth PATH/TO/mpirun.sh
"""
import concurrent.futures
import http.client
import json
import os
import subprocess
import sys
import tempfile
import time
import urllib.parse

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from serve_fixture import Server, fail, make_model_dir  # noqa: E402

try:
    import openai
except ImportError as e:
    fail(f"Python package openai is not importable by {sys.executable} ({e})")

PROMPTS = ["the of and", "it was for on that", "which this be", "two 17.", "they who after new",
           "first one their its"]
FLAGS = ["--threads", "1", "--kv-blocks", "64", "--kv-block-size", "8"]


def check(cond, msg):
    if not cond:
        fail(msg)


def completions(srv, stream, chat=False):
    """Greedy texts of PROMPTS, sent all at once."""
    client = openai.OpenAI(base_url=srv.url + "/v1", api_key="none", max_retries=0)

    def one(prompt):
        kw = dict(model=srv.model, max_tokens=12, temperature=0)
        if chat:
            kw["messages"] = [{"role": "user", "content": prompt}]
            if not stream:
                return client.chat.completions.create(**kw).choices[0].message.content
            return "".join(c.choices[0].delta.content or "" for c in
                           client.chat.completions.create(stream=True, **kw) if c.choices)
        if not stream:
            return client.completions.create(prompt=prompt, **kw).choices[0].text
        return "".join(c.choices[0].text for c in
                       client.completions.create(prompt=prompt, stream=True, **kw) if c.choices)

    with concurrent.futures.ThreadPoolExecutor(len(PROMPTS)) as pool:
        return list(pool.map(one, PROMPTS))


def disconnect(srv):
    before = srv.metrics()["mammoth_requests_cancelled_total"]
    u = urllib.parse.urlparse(srv.url)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=30)
    conn.request("POST", "/v1/completions",
                 body=json.dumps({"model": srv.model, "prompt": "the", "max_tokens": 100,
                                  "temperature": 0.8, "seed": 1, "stream": True}),
                 headers={"Content-Type": "application/json"})
    first = conn.getresponse().fp.readline()
    check(first.startswith(b"data: ") or first.strip().isalnum(), f"stream start: {first!r}")
    conn.sock.close()
    conn.close()
    deadline = time.time() + 20
    while srv.metrics()["mammoth_requests_cancelled_total"] == before:
        if time.time() > deadline:
            fail(f"the disconnected stream was not cancelled: {srv.metrics()}")
        time.sleep(0.05)
    srv.wait_pool_empty()


def main():
    mammoth, mpirun = os.path.abspath(sys.argv[1]), os.path.abspath(sys.argv[2])
    launcher = ["bash", mpirun, "-np", "2"]
    tmp = tempfile.mkdtemp(dir=os.environ.get("TEST_TMPDIR"))
    # Mistral: the sliding window (4) must hold on every rank's paged attention too.
    for family in ("gpt2", "llama", "mistral"):
        d = make_model_dir(os.path.join(tmp, family + "-tiny"), family=family,
                           n_head=4 if family == "gpt2" else 2)
        single = Server(mammoth, d, *FLAGS)
        want = {(stream, chat): completions(single, stream, chat)
                for stream in (False, True) for chat in (False, True)}
        single.stop()
        check(all(t for texts in want.values() for t in texts), f"{family}: empty texts {want}")

        tp = Server(mammoth, d, *FLAGS, "--tp", "2", launcher=launcher)
        for (stream, chat), texts in want.items():
            got = completions(tp, stream, chat)
            for prompt, g, w in zip(PROMPTS, got, texts):
                check(g == w, f"{family} --tp 2 (stream={stream}, chat={chat}) {prompt!r}: "
                              f"{g!r} != one process's {w!r}")
        m = tp.wait_pool_empty()
        check(m["mammoth_requests_finished_total"] >= 4 * len(PROMPTS), f"{family}: {m}")
        print(f"{family}: --tp 2 greedy completions and chats equal one process's, streaming "
              f"and not, {len(PROMPTS)} at once; the KV pool is empty")
        disconnect(tp)
        print(f"{family}: a disconnected stream under --tp 2 is cancelled; the pool is empty")
        err = tp.stop()
        check("[serve] stopped" in err, f"{family}: rank 0 did not stop cleanly: {err[-800:]}")
        steps = [int(x.split()[0]) for x in err.split("stopped after ")[1:]]
        check(len(steps) == 1 and steps[0] > 0,
              f"{family}: the follower's exit line is missing or it ran no steps: {err[-800:]}")
        print(f"{family}: SIGTERM on rank 0 ended both ranks (follower ran {steps[0]} steps)")

    # Refused by name: BERT (no paged KV cache under tp) and heads that do not divide by tp.
    odd = make_model_dir(os.path.join(tmp, "gpt2-3heads"), n_head=3, n_embd=24)
    refusals = (("bert-tiny", ["--fresh-init"],
                 "model family bert has no tensor-parallel paged KV cache"),
                (odd, [], "n_head 3 does not divide by tp 2"))
    for model, extra, words in refusals:
        res = subprocess.run([*launcher, mammoth, "serve", "--model", model, "--port", "0",
                              "--tp", "2", *extra, *FLAGS], capture_output=True, text=True,
                             timeout=120)
        check(res.returncode != 0 and words in res.stderr,
              f"serve --tp 2 --model {model}: exit {res.returncode}, expected an error naming "
              f"{words!r}: {res.stderr[-600:]}")
        print(f"--tp 2 --model {os.path.basename(model)}: refused ({words})")
    print("PASS")


if __name__ == "__main__":
    main()
