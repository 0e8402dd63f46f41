"""`mammoth train --tensorboard DIR` read back by the real `tensorboard` package (PyPI).

Trains a few steps (fp16, so loss_scale and skipped_steps are logged too) with --metrics and
--tensorboard, then loads the event file with TensorBoard's own EventFileLoader (which checks
the TFRecord CRCs) and EventAccumulator, and requires every scalar of every metrics line at
its step with the same value (as float32).
usage: tensorboard_test.py MAMMOTH
"""
import glob
import json
import os
import struct
import subprocess
import sys
import tempfile

import numpy as np
from tensorboard.backend.event_processing import event_accumulator, event_file_loader

TAGS = {  # metrics JSON key -> TensorBoard tag
    "loss": "train/loss",
    "lr": "train/lr",
    "grad_norm": "train/grad_norm",
    "tokens_per_s": "train/tokens_per_s",
    "peak_mem_bytes": "train/peak_mem_bytes",
    "loss_scale": "train/loss_scale",
    "skipped_steps": "train/skipped_steps",
    "val_loss": "val/loss",
}


def write_shard(path, tokens):
    header = np.zeros(256, dtype=np.int32)
    header[:3] = (20240520, 1, len(tokens))
    with open(path, "wb") as f:
        f.write(header.tobytes())
        f.write(np.asarray(tokens, dtype=np.uint16).tobytes())


def main():
    mammoth = sys.argv[1]
    tmp = tempfile.mkdtemp(dir=os.environ.get("TEST_TMPDIR"))
    data = os.path.join(tmp, "data.bin")
    write_shard(data, [(i * 7 + i // 31) % 48 for i in range(6000)])
    tb, metrics = os.path.join(tmp, "tb"), os.path.join(tmp, "metrics.jsonl")
    subprocess.run([mammoth, "train", "--data", data, "--steps", "6", "--micro-batch", "2",
                    "--seq-len", "16", "--eval-every", "3", "--eval-batches", "1", "--warmup", "2",
                    "--threads", "1", "--amp", "fp16", "--tensorboard", tb, "--metrics", metrics],
                   check=True)
    lines = [json.loads(l) for l in open(metrics)]
    assert len(lines) == 6, lines

    files = glob.glob(os.path.join(tb, "events.out.tfevents.*"))
    assert len(files) == 1, files
    # The raw loader: first event is the file version; every record passes the CRC checks.
    events = list(event_file_loader.EventFileLoader(files[0]).Load())
    assert events[0].file_version == "brain.Event:2", events[0]
    assert len(events) == 1 + len(lines), len(events)

    acc = event_accumulator.EventAccumulator(tb, size_guidance={event_accumulator.SCALARS: 0})
    acc.Reload()
    scalars = set(acc.Tags()["scalars"])
    found = 0
    for m in lines:
        for key, tag in TAGS.items():
            if key not in m:
                continue
            assert tag in scalars, f"{tag} missing; have {sorted(scalars)}"
            at_step = [e for e in acc.Scalars(tag) if e.step == m["step"]]
            assert len(at_step) == 1, f"{tag} at step {m['step']}: {at_step}"
            want = float(np.float32(m[key]))
            got = at_step[0].value
            assert got == want or (np.isnan(got) and np.isnan(want)), \
                f"{tag} step {m['step']}: tensorboard {got}, metrics {m[key]}"
            assert at_step[0].wall_time > 1.6e9
            found += 1
    assert sum("val_loss" in m for m in lines) == 2  # steps 3 and 6
    print(f"{found} scalars over {len(lines)} steps, tags {sorted(scalars)}")

    # A mixture of experts' step metrics (expert load per layer, router losses): every number
    # of them is a scalar at its step, tagged by its path in the metrics line.
    tb, metrics = os.path.join(tmp, "tb_moe"), os.path.join(tmp, "moe.jsonl")
    subprocess.run([mammoth, "train", "--model", "mixtral-tiny", "--data", data, "--steps", "3",
                    "--micro-batch", "2", "--seq-len", "16", "--eval-every", "0", "--threads", "1",
                    "--tensorboard", tb, "--metrics", metrics], check=True)
    lines = [json.loads(l) for l in open(metrics)]
    assert len(lines) == 3, lines
    acc = event_accumulator.EventAccumulator(tb, size_guidance={event_accumulator.SCALARS: 0})
    acc.Reload()
    scalars = set(acc.Tags()["scalars"])

    def leaves(v, tag):
        if isinstance(v, dict):
            for k, x in v.items():
                yield from leaves(x, f"{tag}/{k}")
        elif isinstance(v, list):
            for i, x in enumerate(v):
                yield from leaves(x, f"{tag}/{i}")
        else:
            yield tag, v

    moe = 0
    for m in lines:
        extra = {k: m[k] for k in ("moe_load", "moe_aux_loss", "moe_z_loss")}
        assert len(extra["moe_load"]) == 2 and len(extra["moe_load"][0]["tokens"]) == 4, extra
        for tag, value in leaves(extra, "train"):
            assert tag in scalars, f"{tag} missing; have {sorted(scalars)}"
            at_step = [e for e in acc.Scalars(tag) if e.step == m["step"]]
            assert len(at_step) == 1, f"{tag} at step {m['step']}: {at_step}"
            assert at_step[0].value == float(np.float32(value)), (tag, at_step[0].value, value)
            moe += 1
    # 2 layers x (4 experts' tokens + dropped) + the two router losses, each step.
    assert moe == 3 * (2 * 5 + 2), moe
    print(f"PASS: and {moe} mixture-of-experts scalars over 3 steps, e.g. train/moe_load/0/tokens/3")


if __name__ == "__main__":
    main()
