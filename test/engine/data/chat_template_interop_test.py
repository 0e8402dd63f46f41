#!/usr/bin/env python3
"""Interop test: engine/data/chat_template against transformers' apply_chat_template.

Each template below is written into a model directory with transformers'
PreTrainedTokenizerFast.save_pretrained (tokenizer_config.json's "chat_template", and once the
named-list form), loaded back with AutoTokenizer, and rendered with
apply_chat_template(messages, tokenize=False, add_generation_prompt=...) over several
conversations. Our rendering of the same directory (chat_template_tool) must be byte-identical,
and where the template raises (raise_exception) ours must raise with the same message.

The Llama 3, Qwen2 (ChatML), Llama 2, Mistral and Zephyr templates are those their model
directories ship; "features" exercises the rest of the Jinja subset we claim (namespace, loop
variables, filters, tests, slices, arithmetic, for-else, whitespace control). Then 300 random
templates made of tags, comments, '-' / '+' markers, spaces, tabs and newlines must render as
Jinja2 itself renders them with transformers' settings (trim_blocks, lstrip_blocks).

Usage: chat_template_interop_test.py PATH/TO/chat_template_tool
"""
import json
import os
import random
import subprocess
import sys
import tempfile

from jinja2.sandbox import ImmutableSandboxedEnvironment
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import AutoTokenizer, PreTrainedTokenizerFast

LLAMA3 = (
    "{% set loop_messages = messages %}{% for message in loop_messages %}"
    "{% set content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'"
    "+ message['content'] | trim + '<|eot_id|>' %}{% if loop.index0 == 0 %}"
    "{% set content = bos_token + content %}{% endif %}{{ content }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}"
    "{% endif %}")

QWEN2 = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n' }}{% endif %}"
    "{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")

LLAMA2 = (
    "{% if messages[0]['role'] == 'system' %}{% set loop_messages = messages[1:] %}"
    "{% set system_message = messages[0]['content'] %}{% else %}"
    "{% set loop_messages = messages %}{% set system_message = false %}{% endif %}"
    "{% for message in loop_messages %}"
    "{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}"
    "{% endif %}{% if loop.index0 == 0 and system_message != false %}"
    "{% set content = '<<SYS>>\\n' + system_message + '\\n<</SYS>>\\n\\n' + message['content'] %}"
    "{% else %}{% set content = message['content'] %}{% endif %}"
    "{% if message['role'] == 'user' %}{{ bos_token + '[INST] ' + content.strip() + ' [/INST]' }}"
    "{% elif message['role'] == 'assistant' %}{{ ' '  + content.strip() + ' ' + eos_token }}"
    "{% endif %}{% endfor %}")

MISTRAL = """{%- if messages[0]["role"] == "system" %}
    {%- set system_message = messages[0]["content"] %}
    {%- set loop_messages = messages[1:] %}
{%- else %}
    {%- set loop_messages = messages %}
{%- endif %}

{{- bos_token }}
{%- for message in loop_messages %}
    {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}
        {{- raise_exception('After the optional system message, conversation roles must alternate user/assistant/user/assistant/...') }}
    {%- endif %}
    {%- if message['role'] == 'user' %}
        {%- if loop.last and system_message is defined %}
            {{- '[INST] ' + system_message + '\\n\\n' + message['content'] + '[/INST]' }}
        {%- else %}
            {{- '[INST] ' + message['content'] + '[/INST]' }}
        {%- endif %}
    {%- elif message['role'] == 'assistant' %}
        {{- ' ' + message['content']|trim + eos_token}}
    {%- else %}
        {{- raise_exception('Only user and assistant roles are supported, with the exception of an initial optional system message!') }}
    {%- endif %}
{%- endfor %}
"""

ZEPHYR = """{% for message in messages %}
{% if message['role'] == 'user' %}
{{ '<|user|>
' + message['content'] + eos_token }}
{% elif message['role'] == 'system' %}
{{ '<|system|>
' + message['content'] + eos_token }}
{% elif message['role'] == 'assistant' %}
{{ '<|assistant|>
'  + message['content'] + eos_token }}
{% endif %}
{% if loop.last and add_generation_prompt %}
{{ '<|assistant|>' }}
{% endif %}
{% endfor %}"""

FEATURES = """{#- counts and the system prompt -#}
{%- set ns = namespace(count=0, sys='') -%}
{%- for m in messages if m.role != 'system' -%}
  {%- set ns.count = ns.count + 1 -%}
{%- endfor -%}
{%- if messages[0]['role'] == 'system' -%}
  {%- set ns.sys = messages[0].content | trim -%}
  {%- set rest = messages[1:] -%}
{%- else -%}
  {%- set rest = messages -%}
{%- endif -%}
{{ bos_token ~ '[' ~ ns.count ~ ' turns, ' ~ (ns.count / 2) ~ ' pairs, ' ~ (ns.count // 2) ~ ', ' ~ ns.count % 2 ~ ', ' ~ 2 ** 3 ~ ']' }}
{% if ns.sys %}SYS={{ ns.sys | upper }}|{{ ns.sys | length }}|{{ ns.sys.lower() }}|{{ ns.sys | capitalize }}|{{ ns.sys.title() }}
{% endif %}
  {% for message in rest %}
    {%- if loop.first %}<first {{ loop.length }}>{% elif loop.last %}<last {{ loop.revindex0 }}>{% else %}<mid {{ loop.index }}/{{ loop.revindex }}>{% endif %}
    {{- message['role'][0] | upper ~ message.role[1:] }}: {{ message.content.strip() | tojson }}
    {%- if 'bye' in message.content %} [bye]{% endif %}
    {%- if message.role == 'user' and message.content.startswith('skip') %} [skip]{% elif message.content.endswith('?\n') %} [q]{% endif %}
    {{ ' (prev=' ~ loop.previtem.role ~ ')' if loop.previtem is defined else ' (none)' }}
  {% else %}
(empty)
  {% endfor %}
{%+ if true %}   kept indent {{ messages | length }}
{% endif %}
{%- set info = {'n': messages | length, 'ok': true, 'x': none, 'f': 1.5, 'l': [1, 'a', 2.0]} %}
{{- info | tojson }}
{% for k, v in info.items() if k != 'l' %}{{ k }}={{ v if v is not none else 'null' }};{% endfor %}
{{ messages[-1].content | default('x') }}|{{ messages[7] is defined }}|{{ (messages[7].content is defined) if messages[7] is defined else 'no 7' }}|{{ undefined_name | default('dflt') }}|{{ '' | default('e', true) }}
{{ ['a', 'b'] | join('-') }}|{{ 'a,b,,c'.split(',') | length }}|{{ (messages | last).role }}|{{ messages[::-1][0].role }}|{{ messages[1:][:1] | length }}
{{ range(3) | list | length }}|{{ -3 + 1.0 }}|{{ 7 // -2 }}|{{ -7 % 3 }}|{{ 0.1 + 0.2 }}|{{ 100000.0 * 1 }}|{{ 10 / 4 }}|{{ 'ab' * 3 }}|{{ ([1] + [2]) | length }}
{{ "q\\"uote" }}|{{ 'it\\'s' | replace("'", '`') }}|{{ 'x y  z'.split() | join('+') }}|{{ '  pad  ' | trim }}|{{ 'abc'[1] }}{{ 'abc'[-1] }}|{{ 'héllo'[1:3] }}|{{ 'héllo' | length }}
{{ 3 is odd }}{{ 4 is even }}{{ 6 is divisibleby(3) }}{{ none is none }}{{ 'a' is string }}{{ 1 is number }}{{ info is mapping }}{{ rest is sequence }}{{ 1 is integer }}{{ 1.0 is float }}{{ true is boolean }}{{ 'a' is eq('a') }}{{ 2 is ne 3 }}
{{ not (1 < 2 and 2 <= 2 and 3 > 2 and 3 >= 4) }}{{ 'a' < 'b' }}{{ 1 == 1.0 }}{{ 'x' not in 'abc' }}{{ 2 in [1, 2] }}{{ 'n' in info }}{{ (1 or 0) ~ (0 and 1) ~ ('' or 'z') }}
{%- if add_generation_prompt %}
<gen>
{%- endif %}
"""

TEMPLATES = {"llama3": LLAMA3, "qwen2": QWEN2, "llama2": LLAMA2, "mistral": MISTRAL,
             "zephyr": ZEPHYR, "features": FEATURES}

S = {"role": "system", "content": "You are terse."}
U1 = {"role": "user", "content": "Hello there!"}
A1 = {"role": "assistant", "content": "  Hi. How can I help?\n"}
U2 = {"role": "user", "content": "Write \"a poem\"\nabout héllo 世界 🙂, then say bye."}
A2 = {"role": "assistant", "content": "Roses\tare red."}
U3 = {"role": "user", "content": "skip this one"}
CONVERSATIONS = [
    [U1],
    [S, U1],
    [U1, A1, U2],
    [S, U1, A1, U2, A2],
    [U3, A1, U1, A2],
    [S, U3, A2],
    [U1, U2],  # roles do not alternate: Llama 2 and Mistral raise
    [S],
]


def write_dir(path, template):
    tok = Tokenizer(models.WordLevel({"<unk>": 0, "<s>": 1, "</s>": 2}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    t = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>",
                                unk_token="<unk>")
    t.chat_template = template
    t.save_pretrained(path)
    return AutoTokenizer.from_pretrained(path)


def whitespace_cases(n, seed):
    pieces = ["{% if true %}", "{% endif %}", "{%- if true %}", "{% if true -%}", "{%- endif -%}",
              "{%+ if true %}", "{# c #}", "{#- c -#}", "{{ 'x' }}", "{{- 'y' -}}", " ", "  ",
              "\n", "\t", "a", "\n  ", "  \n", "{% set z = 1 %}", "{%- set z = 2 -%}"]
    rng = random.Random(seed)
    cases = []
    for _ in range(n):
        depth, out = 0, []
        for _ in range(rng.randint(1, 12)):
            p = rng.choice(pieces)
            if "endif" in p:
                if depth == 0:
                    continue
                depth -= 1
            elif "if true" in p:
                depth += 1
            out.append(p)
        out += ["{% endif %}"] * depth + (["\n"] if rng.random() < 0.3 else [])
        cases.append("".join(out))
    return cases


def check_whitespace(tool, root):
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    cases_path = os.path.join(root, "empty.json")
    json.dump([{"messages": [], "add_generation_prompt": False}], open(cases_path, "w"))
    bad = 0
    for i, src in enumerate(whitespace_cases(300, 26)):
        d = os.path.join(root, f"ws{i}")
        os.makedirs(d)
        json.dump({"chat_template": src}, open(os.path.join(d, "tokenizer_config.json"), "w"))
        ours = json.loads(subprocess.run([tool, d, cases_path], check=True, capture_output=True,
                                         text=True).stdout)[0]
        want = env.from_string(src).render()
        if ours.get("text") != want:
            bad += 1
            print(f"WHITESPACE MISMATCH {src!r}\n  want {want!r}\n  got  {ours!r}")
    print(f"300 whitespace templates checked against Jinja2, {bad} mismatches")
    return bad


def main():
    tool = sys.argv[1]
    failures = 0
    checked = 0
    with tempfile.TemporaryDirectory() as root:
        failures += check_whitespace(tool, root)
        dirs = dict(TEMPLATES)
        # The named-list form: transformers (and we) take "default".
        dirs["named_list"] = {"default": QWEN2, "tool_use": LLAMA3}
        for name, template in dirs.items():
            path = os.path.join(root, name)
            hf = write_dir(path, template)
            config = json.load(open(os.path.join(path, "tokenizer_config.json")))
            if name == "named_list":
                assert isinstance(config["chat_template"], list), config["chat_template"]
            cases = [{"messages": c, "add_generation_prompt": g}
                     for c in CONVERSATIONS for g in (False, True)]
            cases_path = os.path.join(root, name + ".json")
            json.dump(cases, open(cases_path, "w"))
            ours = json.loads(subprocess.run([tool, path, cases_path], check=True,
                                             capture_output=True, text=True).stdout)
            for case, got in zip(cases, ours):
                checked += 1
                try:
                    want = {"text": hf.apply_chat_template(
                        case["messages"], tokenize=False,
                        add_generation_prompt=case["add_generation_prompt"])}
                except Exception as e:  # jinja2's TemplateError from raise_exception
                    want = {"error": str(e)}
                ok = (got == want if "text" in want else
                      "error" in got and ("template raised: " + want["error"]) in got["error"])
                if not ok:
                    failures += 1
                    print(f"MISMATCH {name} gen={case['add_generation_prompt']} "
                          f"roles={[m['role'] for m in case['messages']]}\n"
                          f"  want {want!r}\n  got  {got!r}")
    print(f"{checked} renderings checked, {failures} mismatches")
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
