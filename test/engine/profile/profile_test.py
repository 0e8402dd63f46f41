"""`mammoth train --profile DIR`:
  1. dp 2 x pp 2 on 4 ranks, 3 profiled steps: every rank's trace is Chrome trace JSON holding
     op (kernel), collective and pipeline events; the merged trace has one pid per rank; the
     two ends of a pipeline send / recv overlap in time; the summary's FLOPs are mammoth
     analyze's per-token count times the tokens of the profiled steps; the memory tracer's peak
     equals the allocator's measured peak and its attribution sums to it; `plot --trace DIR` writes an SVG (parsed as XML) with
     a lane group per rank;
  2. one process with --offload nvme: chunk moves and NVMe reads / writes are in the trace;
     then 2 dp ranks with rank 1 delayed 1 s (MAMMOTH_FAULT=delay): the merge splits each
     collective into waiting for the last member and transfer, and rank 0 waits;
  3. bad --profile-steps are refused by name.
usage: profile_test.py MAMMOTH MPIRUN_SH
"""
import json
import os
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET

COMMON = ["--steps", "4", "--seq-len", "32", "--log-every", "100", "--eval-every", "0",
          "--warmup", "1", "--threads", "1"]


def run(cmd, env):
    p = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if p.returncode != 0:
        sys.stdout.write(p.stdout)
        raise SystemExit(f"FAIL: {' '.join(cmd)} exited {p.returncode}")
    return p.stdout


def load_trace(path):
    with open(path) as f:
        t = json.load(f)
    assert isinstance(t["traceEvents"], list) and t["displayTimeUnit"] == "ms", path
    for e in t["traceEvents"]:
        assert e["ph"] in ("X", "C", "M"), e
        assert isinstance(e["pid"], int) and isinstance(e["name"], str), e
        if e["ph"] in ("X", "C"):
            assert isinstance(e["ts"], (int, float)), e
        if e["ph"] == "X":
            assert e["dur"] >= 0, e
    return t["traceEvents"]


def main():
    mammoth, mpirun = sys.argv[1], sys.argv[2]
    tmp = tempfile.mkdtemp(dir=os.environ.get("TEST_TMPDIR"))
    env = dict(os.environ, HOME=os.path.join(tmp, "home"))

    # 1. dp 2 x pp 2, steps 1..3 profiled.
    prof = os.path.join(tmp, "prof")
    log = run(["bash", mpirun, "-np", "4", mammoth, "train", *COMMON, "--dp", "2", "--pp", "2",
               "--micro-batch", "2", "--grad-accum", "2", "--profile", prof,
               "--profile-steps", "1:4", "--peak-gflops", "100", "--peak-gbps", "20"], env)
    print(log)
    per_rank = {}
    for r in range(4):
        evs = load_trace(os.path.join(prof, f"rank_{r}.trace.json"))
        cats = {e.get("cat") for e in evs if e["ph"] == "X"}
        for cat in ("compute", "communication", "pipeline"):
            assert cat in cats, f"rank {r}: no {cat} events ({cats})"
        ops = [e for e in evs if e["ph"] == "X" and e["cat"] == "compute"]
        assert any(e["name"] == "matmul" and e["args"].get("flops", 0) > 0 for e in ops), r
        assert any(e["name"] == "matmul" and e["args"].get("module", "").count(".") >= 2
                   for e in ops), (r, {e["args"].get("module") for e in ops})
        assert all("dtype" in e["args"] and "bytes" in e["args"]
                   for e in ops if e["name"] not in ("step", "optimizer")), r
        assert sum(1 for e in evs if e["ph"] == "X" and e["name"] == "step") == 3, r
        assert {e["pid"] for e in evs} == {r}, r
        per_rank[r] = evs
    merged = load_trace(os.path.join(prof, "merged.trace.json"))
    assert {e["pid"] for e in merged} == {0, 1, 2, 3}, {e["pid"] for e in merged}
    names = {(e["pid"], e["args"]["name"]) for e in merged if e["name"] == "process_name"}
    assert names == {(r, f"rank {r}") for r in range(4)}, names

    # Send / recv pairs: the n-th send from A to B and the n-th recv on B from A.
    def p2p(evs, op):
        out = {}
        for e in evs:
            if e["ph"] == "X" and e["cat"] == "communication" and e["name"] == op:
                out.setdefault(e["args"]["peer_world"], []).append((e["ts"], e["ts"] + e["dur"]))
        return out
    pairs = overlapping = 0
    for a in range(4):
        for b, sends in p2p(per_rank[a], "send").items():
            recvs = p2p(per_rank[b], "recv").get(a, [])
            assert len(recvs) == len(sends), (a, b, len(sends), len(recvs))
            for (s0, s1), (r0, r1) in zip(sends, recvs):
                pairs += 1
                overlapping += s0 <= r1 and r0 <= s1
    assert pairs > 0, "no send / recv pairs"
    assert overlapping == pairs, f"{overlapping} of {pairs} send / recv pairs overlap"

    with open(os.path.join(prof, "summary.json")) as f:
        summary = json.load(f)
    # The model train built (its vocabulary fits the corpus' tokenizer), as analyze reads it.
    model_dir = os.path.join(tmp, "model")
    os.makedirs(model_dir)
    with open(os.path.join(model_dir, "config.json"), "w") as f:
        json.dump(summary["model_config"], f)
    analysis = json.loads(run([mammoth, "analyze", "--model", model_dir, "--context", "32",
                               "--json"], env))
    # 2 dp x 2 micro-batches x 2 accumulation x 32 tokens per step, 3 steps.
    want = analysis["flops_per_token_train"] * 2 * 2 * 2 * 32 * 3
    assert abs(summary["flops"] - want) <= 1e-9 * want, (summary["flops"], want)
    assert summary["steps"] == 3, summary
    for r in summary["ranks"]:
        assert r["traced_peak_bytes"] == r["measured_peak_bytes"] > 0, r
        parts = r["peak_attribution"]
        assert sum(parts.values()) == r["traced_peak_bytes"], r
        assert parts["parameters"] > 0 and parts["activations"] > 0, parts
        assert r["compute_s"] > 0 and r["communication_s"] > 0, r
    assert "[profile] model FLOPs" in log and "[profile] top ops" in log

    # Rank 0's time by op class: the GEMMs split by autograd phase, their FLOPs those of the
    # matmul events, every class within the steps, bounds at the peaks given.
    assert "[profile] time by op class on rank 0, against the roofline of 100.0 GFLOP/s and " \
        "20.0 GB/s" in log, log
    classes = {c["name"]: c for c in summary["classes_rank0"]}
    assert {"gemm forward", "gemm backward", "optimizer", "exposed communication",
            "outside ops"} <= set(classes), classes
    rank0_ops = [e for e in per_rank[0] if e["ph"] == "X" and e["cat"] == "compute"]
    for phase, backward in (("gemm forward", False), ("gemm backward", True)):
        want_flops = sum(e["args"]["flops"] for e in rank0_ops if e["name"] == "matmul"
                         and e["args"].get("backward", False) == backward)
        assert want_flops > 0 and classes[phase]["flops"] == want_flops, (phase, classes[phase])
        c = classes[phase]
        assert c["bound_ms"] == max(c["flops"] / 100e9, c["bytes"] / 20e9) * 1e3 or \
            abs(c["bound_ms"] / (max(c["flops"] / 100e9, c["bytes"] / 20e9) * 1e3) - 1) < 1e-9, c
    assert classes["optimizer"]["bytes"] > 0, classes["optimizer"]
    step_ms = summary["ranks"][0]["step_s"] * 1e3
    # Outside ops: the steps' time that no other event of rank 0 (any lane) covers, recomputed
    # from its trace.
    def union(spans):
        total, end = 0.0, float("-inf")
        for a, b in sorted(spans):
            if b > end:
                total += b - max(a, end)
                end = b
        return total
    steps = [(e["ts"], e["ts"] + e["dur"]) for e in per_rank[0]
             if e["ph"] == "X" and e["name"] == "step"]
    others = [(e["ts"], e["ts"] + e["dur"]) for e in per_rank[0]
              if e["ph"] == "X" and e["name"] != "step"]
    outside_ms = (union(steps + others) - union(others)) * 1e-3
    assert abs(classes["outside ops"]["total_ms"] - outside_ms) <= 0.01, \
        (classes["outside ops"], outside_ms)
    assert 0 < outside_ms < step_ms, (outside_ms, step_ms)
    assert 0 < classes["exposed communication"]["total_ms"] <= \
        summary["ranks"][0]["communication_s"] * 1e3, classes

    out = run([mammoth, "plot", "--trace", prof], env)
    root = ET.parse(os.path.join(prof, "timeline.svg")).getroot()
    assert root.tag == "{http://www.w3.org/2000/svg}svg", root.tag
    ns = {"s": "http://www.w3.org/2000/svg"}
    groups = root.findall("s:g[@class='rank']", ns)
    assert [g.get("data-rank") for g in groups] == ["0", "1", "2", "3"], out
    for g in groups:
        lanes = {l.get("data-lane"): len(l.findall("s:rect", ns))
                 for l in g.findall("s:g[@class='lane']", ns)}
        assert lanes["compute"] > 0 and lanes["communication"] > 0 and lanes["pipeline"] > 0, lanes
        assert g.findall("s:polyline[@class='memory']", ns), "no memory counter line"

    # 2. NVMe offload on one process: chunk moves and NVMe I/O.
    nvme = os.path.join(tmp, "nvme")
    os.makedirs(nvme)
    prof2 = os.path.join(tmp, "prof_nvme")
    log = run([mammoth, "train", *COMMON, "--micro-batch", "2", "--chunk-mb", "0.25",
               "--offload", "nvme", "--nvme-dir", nvme, "--device-mem", "2M",
               "--profile", prof2, "--profile-steps", "1:3"], env)
    evs = load_trace(os.path.join(prof2, "rank_0.trace.json"))
    io = {e["name"] for e in evs if e["ph"] == "X" and e["cat"] == "io"}
    assert io & {"chunk_load", "chunk_prefetch"} and "chunk_evict" in io, io
    # Each chunk move names the parameters the chunk holds (module paths, first .. last).
    moves = [e for e in evs if e["ph"] == "X" and e["name"].startswith("chunk_")]
    named = [e["args"]["tensors"] for e in moves if e.get("args", {}).get("tensors")]
    assert len(named) == len(moves) and any(t.startswith("h.") or t.startswith("wte")
                                            for t in named), named[:5]
    assert {"nvme_read", "nvme_write"} <= io, io
    assert any(e["ph"] == "C" and e["name"].startswith("chunks.") for e in evs)

    # 2b. A straggler: on 2 dp ranks, rank 1 sleeps 1 s before launching its step-2 gradient
    # reductions. Its collectives are posted late, so rank 0's wait for the last member grows
    # by about that second while rank 1's does not; each event's wait + transfer is its span.
    prof3 = os.path.join(tmp, "prof_straggler")
    log = run(["bash", mpirun, "-np", "2", mammoth, "train", *COMMON, "--dp", "2",
               "--micro-batch", "2", "--profile", prof3, "--profile-steps", "1:4"],
              dict(env, MAMMOTH_FAULT="delay@1:2:backward"))
    assert "injecting delay" in log, log
    with open(os.path.join(prof3, "summary.json")) as f:
        ranks = json.load(f)["ranks"]
    wait = [r["collective_wait_s"] for r in ranks]
    print("straggler: collective wait per rank", wait,
          "transfer", [r["collective_transfer_s"] for r in ranks])
    assert wait[0] >= 0.8 and wait[1] < 0.5, wait
    split = [e for e in load_trace(os.path.join(prof3, "merged.trace.json"))
             if e["ph"] == "X" and e["cat"] == "communication" and "wait_us" in e["args"]]
    assert {e["pid"] for e in split} == {0, 1}, split[:2]
    for e in split:
        assert abs(e["args"]["wait_us"] + e["args"]["transfer_us"] - e["dur"]) <= 1.0, e
    assert "[profile] rank 0 collectives:" in log, log

    # 3. Inputs it cannot honour are refused by name.
    for flags, message in ((["--profile", prof2, "--profile-steps", "3:2"], "--profile-steps must be A:B"),
                           (["--profile-steps", "1:2"], "--profile-steps needs --profile DIR"),
                           (["--profile", prof2, "--profile-steps", "9:12"], "the run has 4 steps")):
        p = subprocess.run([mammoth, "train", *COMMON, *flags], env=env, stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, text=True)
        assert p.returncode != 0 and message in p.stdout, (flags, p.stdout[-500:])
    print("profile_test: ok")


if __name__ == "__main__":
    main()
