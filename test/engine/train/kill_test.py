"""Crash safety of `mammoth train` checkpoints, with the real binary as a subprocess.

1. kill -9: a run saving every step (--save-every 1) is SIGKILLed at random moments (most land
   inside a checkpoint write, which dominates a tiny model's step) and resumed, several times.
   After every kill, `latest` must name a complete checkpoint whose manifest matches its files
   and that `mammoth train --resume` loads (checksums verified) and continues from.
2. SIGTERM: a run is stopped mid-training; it must save the step it reached, exit with 130,
   and leave `latest` pointing at that checkpoint.
usage: kill_test.py MAMMOTH
"""
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import numpy as np

COMMON = ["--micro-batch", "2", "--seq-len", "16", "--eval-every", "0", "--threads", "1",
          "--warmup", "2", "--log-every", "1"]


def write_shard(path, tokens):
    header = np.zeros(256, dtype=np.int32)
    header[:3] = (20240520, 1, len(tokens))
    with open(path, "wb") as f:
        f.write(header.tobytes())
        f.write(np.asarray(tokens, dtype=np.uint16).tobytes())


def check_manifest(ckpt):
    """Every file the manifest lists exists with the listed size; safetensors headers parse."""
    manifest = json.load(open(os.path.join(ckpt, "manifest.json")))
    for name, entry in manifest["files"].items():
        path = os.path.join(ckpt, name)
        assert os.path.getsize(path) == entry["bytes"], (path, entry)
        if name.endswith(".safetensors"):
            with open(path, "rb") as f:
                n = int.from_bytes(f.read(8), "little")
                json.loads(f.read(n))
    return manifest["step"]


def latest_step(save_dir):
    name = open(os.path.join(save_dir, "latest")).read().strip()
    assert re.fullmatch(r"step_\d{8}", name), name
    step = check_manifest(os.path.join(save_dir, name))
    assert step == int(name[5:]), (name, step)
    return step


def resume_loads(mammoth, data, save_dir, step, tmp):
    """`--resume` on a copy loads `step` (verifying every CRC-32C) and trains one more step."""
    copy = os.path.join(tmp, "verify")
    shutil.rmtree(copy, ignore_errors=True)
    shutil.copytree(save_dir, copy)
    r = subprocess.run([mammoth, "train", "--data", data, "--steps", str(step + 1),
                        "--save-dir", copy, "--resume"] + COMMON,
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert f"at step {step}" in r.stderr, r.stderr
    shutil.rmtree(copy)


def main():
    mammoth = sys.argv[1]
    tmp = tempfile.mkdtemp(dir=os.environ.get("TEST_TMPDIR"))
    data = os.path.join(tmp, "data.bin")
    write_shard(data, [(i * 7 + i // 31) % 48 for i in range(6000)])
    rng = random.Random(int(os.environ.get("KILL_TEST_SEED", "7")))

    save_dir = os.path.join(tmp, "ckpt")
    seen = []
    for attempt in range(6):
        p = subprocess.Popen([mammoth, "train", "--data", data, "--steps", "100000",
                              "--save-dir", save_dir, "--save-every", "1", "--keep-last", "2",
                              "--resume"] + COMMON,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        # Wait for the first checkpoint of this run, then a random part of a few saves.
        deadline = time.time() + 60
        start = latest_step(save_dir) if os.path.exists(os.path.join(save_dir, "latest")) else -1
        while time.time() < deadline:
            if os.path.exists(os.path.join(save_dir, "latest")) and latest_step(save_dir) > start:
                break
            time.sleep(0.01)
        time.sleep(rng.uniform(0.0, 0.6))
        p.send_signal(signal.SIGKILL)
        assert p.wait() == -signal.SIGKILL
        step = latest_step(save_dir)
        # (a kill between writing latest.tmp and renaming it leaves latest.tmp: harmless)
        leftovers = [n for n in os.listdir(save_dir) if n.startswith(".step_")]
        print(f"kill {attempt}: latest = step {step}; partial writes left behind: {leftovers}")
        assert step > start, (step, start)
        # Partial writes of earlier killed runs are removed by the next run's saves.
        assert all(n.endswith(f".tmp.{p.pid}") for n in leftovers), leftovers
        resume_loads(mammoth, data, save_dir, step, tmp)
        seen.append(step)
    assert seen == sorted(seen)

    # SIGTERM mid-run: saves the step reached, exits 130.
    term_dir = os.path.join(tmp, "term")
    p = subprocess.Popen([mammoth, "train", "--data", data, "--steps", "100000",
                          "--save-dir", term_dir] + COMMON,
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    log = []
    for line in p.stderr:
        log.append(line)
        if line.startswith("step") and "/100000" in line and int(line.split()[1].split("/")[0]) >= 3:
            p.send_signal(signal.SIGTERM)
            break
    log += p.stderr.readlines()
    rc = p.wait()
    text = "".join(log)
    assert rc == 130, (rc, text)
    m = re.search(r"signal 15: saving and stopping at step (\d+)", text)
    assert m, text
    stopped = int(m.group(1))
    assert stopped >= 3
    assert os.path.isdir(os.path.join(term_dir, f"step_{stopped:08d}")), os.listdir(term_dir)
    assert latest_step(term_dir) == stopped
    resume_loads(mammoth, data, term_dir, stopped, tmp)
    print(f"SIGTERM: exit 130, checkpoint at step {stopped}")
    print("PASS")


if __name__ == "__main__":
    main()
