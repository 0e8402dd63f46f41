#!/usr/bin/env python3
"""`mammoth serve` driven by the official `openai` client and by raw HTTP.

On a tiny Hugging Face GPT-2 directory (serve_fixture.py):
  - /health, /v1/models (client.models.list());
  - greedy completions equal `mammoth generate` alone for the same prompt, streaming and not,
    text prompts and token-id prompts (the text also equals HF `tokenizers`' decode of
    generate's ids); seeded sampling equals `mammoth generate --seed`;
  - chat completions render the directory's chat template as transformers'
    apply_chat_template does and continue it as generate does, streaming and not;
  - stop strings (string and list) cut the text before the stop, finish_reason "stop", also
    streaming; stream_options.include_usage sends the usage chunk;
  - every bad request (malformed JSON, unknown model, context overflow, zero/negative
    max_tokens, wrong types, unsupported parameters, unknown routes) gets OpenAI's error object
    with its 4xx status, and the server keeps serving;
  - 16 concurrent streaming clients each get the text they get alone, through a pool that holds
    only about half of them at once (the rest queue); the KV pool is empty afterwards
    (/metrics); a request larger than the whole pool is refused;
  - a client that disconnects mid-stream, or while waiting for a non-streaming answer, has
    its sequence cancelled and its blocks freed;
  - --tp 2 in one process is refused by name (serve_tp_test runs it under mpirun);
  - SIGTERM stops the server cleanly (exit 0).

Usage: serve_test.py PATH/TO/mammoth
"""
import http.client
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from serve_fixture import Server, fail, generate, make_model_dir  # noqa: E402

try:
    import openai
    from tokenizers import Tokenizer
except ImportError as e:
    fail(f"Python packages openai/tokenizers are not importable by {sys.executable} ({e})")

PROMPTS = ["the of and", "it was for on that", "which this be", "two 17.", "they who after new",
           "first one their its", "in is", "has had not but"]


def check(cond, msg):
    if not cond:
        fail(msg)


def expect_error(srv, body, status, param=None, code=None, raw=None, path="/v1/completions"):
    got, text = srv.post(path, body, raw=raw)
    check(got == status, f"{body or raw!r}: status {got}, expected {status}: {text}")
    err = json.loads(text).get("error")
    check(isinstance(err, dict) and set(err) == {"message", "type", "param", "code"},
          f"{body or raw!r}: not an OpenAI error object: {text}")
    check(err["message"], f"{body or raw!r}: empty message")
    if param is not None:
        check(err["param"] == param, f"{body or raw!r}: param {err['param']!r}, want {param!r}")
    if code is not None:
        check(err["code"] == code, f"{body or raw!r}: code {err['code']!r}, want {code!r}")
    status_ok, _ = srv.get("/health")
    check(status_ok == 200, "the server stopped serving after a bad request")
    return err


def wait_cancelled(srv, before, who):
    """Waits until the cancelled-requests counter passes `before` and the KV pool is empty."""
    deadline = time.time() + 20
    while srv.metrics()["mammoth_requests_cancelled_total"] == before:
        if time.time() > deadline:
            fail(f"{who} was not cancelled: {srv.metrics()}")
        time.sleep(0.05)
    srv.wait_pool_empty()


def stream_text(client, model, prompt, **kw):
    text, reasons = "", []
    for chunk in client.completions.create(model=model, prompt=prompt, stream=True, **kw):
        if chunk.choices:
            text += chunk.choices[0].text
            if chunk.choices[0].finish_reason:
                reasons.append(chunk.choices[0].finish_reason)
    return text, reasons


def main():
    mammoth = os.path.abspath(sys.argv[1])
    tmp = tempfile.mkdtemp(dir=os.environ.get("TEST_TMPDIR"))
    d = make_model_dir(os.path.join(tmp, "tiny-gpt2"), n_positions=1024)
    hf = Tokenizer.from_file(os.path.join(d, "tokenizer.json"))
    eos = hf.token_to_id("<|endoftext|>")

    # 60 blocks of 16: the 16 concurrent clients below need 7 blocks each at worst, so about
    # half of them wait in the queue at a time (admission control).
    srv = Server(mammoth, d, "--kv-blocks", "60", "--kv-block-size", "16")
    client = openai.OpenAI(base_url=srv.url + "/v1", api_key="unused", max_retries=0)

    status, body = srv.get("/health")
    check(status == 200 and json.loads(body)["status"] == "ok", f"/health: {status} {body}")
    ids = [m.id for m in client.models.list().data]
    check(ids == [srv.model], f"/v1/models: {ids}, want [{srv.model!r}]")

    # Greedy completions against `mammoth generate` alone.
    solo = {}
    for prompt in PROMPTS[:3]:
        want_ids, want = generate(mammoth, d, prompt=prompt, max_new=20)
        r = client.completions.create(model=srv.model, prompt=prompt, max_tokens=20,
                                      temperature=0)
        got = r.choices[0].text
        check(got == want, f"{prompt!r}: server {got!r}, generate {want!r}")
        reason = "stop" if want_ids[-1] == eos else "length"
        check(r.choices[0].finish_reason == reason, f"finish_reason {r.choices[0].finish_reason}")
        check(r.object == "text_completion" and r.id.startswith("cmpl-") and r.model == srv.model,
              f"response header fields: {r}")
        check(r.usage.completion_tokens == len(want_ids) and
              r.usage.prompt_tokens == len(hf.encode(prompt).ids) and
              r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens,
              f"usage {r.usage}")
        streamed, reasons = stream_text(client, srv.model, prompt, max_tokens=20, temperature=0)
        check(streamed == want, f"{prompt!r} streamed: {streamed!r}, generate {want!r}")
        check(reasons == [reason], f"streamed finish reasons {reasons}")
        solo[prompt] = want
    print("greedy text prompts equal mammoth generate, streaming and not")

    # Token-id prompts (raw HTTP), against generate --prompt-tokens with the same eos.
    tokens = hf.encode("which this be").ids
    want_ids, _ = generate(mammoth, d, tokens=tokens, max_new=12, extra=["--eos-token", str(eos)])
    status, text = srv.post("/v1/completions", {"model": srv.model, "prompt": tokens,
                                                "max_tokens": 12, "temperature": 0})
    check(status == 200, f"token prompt: {status} {text}")
    got = json.loads(text)["choices"][0]["text"]
    want = hf.decode(want_ids, skip_special_tokens=True)
    check(got == want, f"token prompt: server {got!r}, HF decode of generate's ids {want!r}")
    print("token-id prompt equals generate --prompt-tokens")

    # Seeded sampling: the same draws as generate --seed.
    _, want = generate(mammoth, d, prompt=PROMPTS[1], max_new=16,
                       extra=["--temperature", "0.9", "--top-k", "30", "--top-p", "0.95",
                              "--seed", "77"])
    r = client.completions.create(model=srv.model, prompt=PROMPTS[1], max_tokens=16,
                                  temperature=0.9, top_p=0.95, seed=77, extra_body={"top_k": 30})
    check(r.choices[0].text == want, f"seeded: server {r.choices[0].text!r}, generate {want!r}")
    print("seeded sampling equals generate --seed")

    # Stop sequences: a piece of the greedy text ends it just before.
    full = solo[PROMPTS[0]]
    cut = full[len(full) // 2:len(full) // 2 + 3]
    cut = cut if cut.strip() else full[-3:]
    want = full[:full.index(cut)]
    r = client.completions.create(model=srv.model, prompt=PROMPTS[0], max_tokens=20,
                                  temperature=0, stop=["zzzz", cut])
    check(r.choices[0].text == want and r.choices[0].finish_reason == "stop",
          f"stop {cut!r}: {r.choices[0].text!r} ({r.choices[0].finish_reason}), want {want!r}")
    streamed, reasons = stream_text(client, srv.model, PROMPTS[0], max_tokens=20, temperature=0,
                                    stop=cut)
    check(streamed == want and reasons == ["stop"], f"streamed stop: {streamed!r} {reasons}")
    usage = None
    for chunk in client.completions.create(model=srv.model, prompt=PROMPTS[0], max_tokens=5,
                                           temperature=0, stream=True,
                                           stream_options={"include_usage": True}):
        usage = chunk.usage or usage
    check(usage is not None and usage.completion_tokens == 5, f"include_usage: {usage}")
    print(f"stop {cut!r} cuts the text, streaming and not; include_usage")

    # Chat: the directory's template (as transformers renders it), then the same completion.
    import transformers
    hf_tok = transformers.PreTrainedTokenizerFast.from_pretrained(d)
    messages = [{"role": "system", "content": "be brief"},
                {"role": "user", "content": "which this be"}]
    rendered = hf_tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    want_ids, _ = generate(mammoth, d, tokens=hf.encode(rendered, add_special_tokens=False).ids,
                           max_new=12, extra=["--eos-token", str(eos)])
    want = hf.decode(want_ids, skip_special_tokens=True)
    r = client.chat.completions.create(model=srv.model, messages=messages, max_tokens=12,
                                       temperature=0)
    check(r.object == "chat.completion" and r.choices[0].message.role == "assistant",
          f"chat response: {r}")
    check(r.choices[0].message.content == want,
          f"chat: {r.choices[0].message.content!r}, generate on the template {want!r}")
    chunks = list(client.chat.completions.create(model=srv.model, messages=messages,
                                                 max_tokens=12, temperature=0, stream=True))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    check(text == want and chunks[0].choices[0].delta.role == "assistant",
          f"streamed chat: {text!r}, want {want!r}")
    check(chunks[-1].choices[0].finish_reason in ("stop", "length"), "chat finish_reason")
    expect_error(srv, {"model": srv.model, "messages": []}, 400, param="messages",
                 path="/v1/chat/completions")
    expect_error(srv, {"model": srv.model, "messages": [{"role": "user"}]}, 400,
                 param="messages", path="/v1/chat/completions")
    print("chat completions use the model's template, streaming and not")

    # Bad requests: each its error, the server keeps serving.
    m = srv.model
    expect_error(srv, None, 400, code="invalid_json", raw=b'{"model": "x", "prompt": ')
    expect_error(srv, None, 400, code="invalid_json", raw=b'[1, 2]')
    expect_error(srv, {"model": "gpt-4", "prompt": "hi"}, 404, param="model",
                 code="model_not_found")
    expect_error(srv, {"prompt": "hi"}, 400, param="model")
    expect_error(srv, {"model": m, "prompt": "the " * 1000, "max_tokens": 100}, 400,
                 code="context_length_exceeded")
    expect_error(srv, {"model": m, "prompt": [1, 2, 3], "max_tokens": 1022}, 400,
                 code="context_length_exceeded")
    for bad in (0, -3):
        expect_error(srv, {"model": m, "prompt": "hi", "max_tokens": bad}, 400,
                     param="max_tokens")
    # Fits the context (1024) but not the pool (60 blocks of 16 = 960 positions).
    expect_error(srv, {"model": m, "prompt": [1, 2, 3], "max_tokens": 1000}, 400,
                 code="request_not_servable")
    expect_error(srv, {"model": m, "prompt": "hi", "max_tokens": "10"}, 400, param="max_tokens")
    expect_error(srv, {"model": m, "prompt": "hi", "temperature": "hot"}, 400,
                 param="temperature")
    expect_error(srv, {"model": m, "prompt": "hi", "temperature": 3}, 400, param="temperature")
    expect_error(srv, {"model": m, "prompt": "hi", "top_p": 0}, 400, param="top_p")
    expect_error(srv, {"model": m, "prompt": "hi", "stop": 5}, 400, param="stop")
    expect_error(srv, {"model": m, "prompt": 5}, 400, param="prompt")
    expect_error(srv, {"model": m, "prompt": [1, 1e9]}, 400, param="prompt")
    expect_error(srv, {"model": m, "prompt": ["a", "b"]}, 400, param="prompt")
    expect_error(srv, {"model": m, "prompt": "hi", "stream": "yes"}, 400, param="stream")
    expect_error(srv, {"model": m, "prompt": "hi", "n": 2}, 400, param="n")
    expect_error(srv, {"model": m, "prompt": "hi", "logprobs": 2}, 400, param="logprobs")
    expect_error(srv, {"model": m, "prompt": "hi", "frobnicate": 1}, 400, param="frobnicate")
    expect_error(srv, {"model": m, "prompt": "hi"}, 404, path="/v1/nothing")
    try:
        client.completions.create(model=m, prompt="hi", max_tokens=-1)
        fail("the openai client got no error for max_tokens=-1")
    except openai.BadRequestError as e:
        check(e.status_code == 400 and e.param == "max_tokens", f"openai error: {e}")
    try:
        client.completions.create(model="nope", prompt="hi")
        fail("the openai client got no error for an unknown model")
    except openai.NotFoundError as e:
        check(e.code == "model_not_found", f"openai error: {e}")
    r = client.completions.create(model=m, prompt=PROMPTS[0], max_tokens=20, temperature=0)
    check(r.choices[0].text == solo[PROMPTS[0]], "after the bad requests the text changed")
    print("bad requests: OpenAI errors with 4xx, the server keeps serving")

    # 16 concurrent streaming clients: each gets its solo text.
    alone = {}
    for p in PROMPTS:
        alone[p] = client.completions.create(model=m, prompt=p, max_tokens=100,
                                             temperature=0).choices[0].text
    results, errors = {}, []

    def worker(i):
        try:
            p = PROMPTS[i % len(PROMPTS)]
            results[i] = (p, stream_text(client, m, p, max_tokens=100, temperature=0)[0])
        except Exception as e:  # noqa: BLE001 (reported below)
            errors.append(f"client {i}: {e!r}")

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(16)]
    depth, done = [], threading.Event()

    def watch():
        while not done.is_set():
            depth.append(srv.metrics()["mammoth_queue_depth"])
            time.sleep(0.01)

    watcher = threading.Thread(target=watch)
    watcher.start()
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    done.set()
    watcher.join()
    check(max(depth) > 0, f"no request ever waited for the pool (queue depths {set(depth)})")
    check(not errors, f"concurrent clients failed: {errors}")
    check(len(results) == 16, f"{len(results)} of 16 concurrent clients finished")
    for i, (p, text) in results.items():
        check(text == alone[p], f"client {i} {p!r}: {text!r}, alone {alone[p]!r}")
    metrics = srv.wait_pool_empty()
    check(metrics["mammoth_kv_blocks_total"] == 60, f"kv_blocks_total {metrics}")
    check(metrics["mammoth_generated_tokens_total"] > 16 * 90, f"generated tokens {metrics}")
    check(metrics["mammoth_time_to_first_token_seconds_count"] > 16, f"ttft count {metrics}")
    print("16 concurrent streaming clients each got their solo text; the KV pool is empty")

    # A client that disconnects mid-stream: its sequence is cancelled and its blocks freed.
    before = srv.metrics()["mammoth_requests_cancelled_total"]
    u = urllib.parse.urlparse(srv.url)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=30)
    conn.request("POST", "/v1/completions",
                 body=json.dumps({"model": m, "prompt": "the", "max_tokens": 900,
                                  "temperature": 0.8, "seed": 1, "stream": True}),
                 headers={"Content-Type": "application/json"})
    resp = conn.getresponse()
    first = resp.fp.readline()
    check(first.startswith(b"data: ") or first.strip().isalnum(), f"stream start: {first!r}")
    conn.sock.close()
    conn.close()
    wait_cancelled(srv, before, "a disconnected stream")
    print("a disconnected stream is cancelled and frees its blocks")

    # A non-streaming client that hangs up while it waits: its sequence is cancelled too. The
    # client hangs up as soon as /metrics shows the sequence running (on a quiet machine the
    # tiny model writes its 900 tokens in well under a second, so a fixed sleep can miss it).
    before = srv.metrics()["mammoth_requests_cancelled_total"]
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=30)
    conn.request("POST", "/v1/completions",
                 body=json.dumps({"model": m, "prompt": "the", "max_tokens": 900,
                                  "temperature": 0.8, "seed": 2}),
                 headers={"Content-Type": "application/json"})
    deadline = time.time() + 20
    while srv.metrics()["mammoth_running_sequences"] < 1:
        check(time.time() < deadline, "the non-streaming request never started running")
        time.sleep(0.002)
    conn.sock.close()
    conn.close()
    wait_cancelled(srv, before, "a disconnected non-streaming client")
    print("a disconnected non-streaming client is cancelled and frees its blocks")

    # --tp without the processes to hold its shards is refused by name at startup.
    res = subprocess.run([mammoth, "serve", "--model", d, "--port", "0", "--tp", "2"],
                         capture_output=True, text=True, timeout=60)
    check(res.returncode == 1 and "--tp 2 needs exactly 2 processes" in res.stderr,
          f"serve --tp 2: exit {res.returncode}: {res.stderr[-300:]}")

    err = srv.stop()
    check("[serve] stopped" in err, f"no clean stop message: {err[-500:]}")
    print("SIGTERM: clean exit")
    print("PASS")


if __name__ == "__main__":
    main()
