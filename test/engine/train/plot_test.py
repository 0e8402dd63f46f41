"""`mammoth plot` on a synthetic metrics file: the SVG parses as XML and its curves encode the
data (point counts, x order, y order), with two panels, tick labels and axis titles.
usage: plot_test.py MAMMOTH
"""
import json
import math
import os
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET

NS = {"s": "http://www.w3.org/2000/svg"}


def points(poly):
    return [tuple(map(float, p.split(","))) for p in poly.get("points").split()]


def main():
    mammoth = sys.argv[1]
    tmp = tempfile.mkdtemp(dir=os.environ.get("TEST_TMPDIR"))
    metrics = os.path.join(tmp, "run.jsonl")
    losses = [5.0 * math.exp(-s / 30.0) + 1.0 for s in range(1, 101)]
    with open(metrics, "w") as f:
        for s, loss in enumerate(losses, start=1):
            m = {"step": s, "loss": loss, "lr": 1e-3, "tokens_per_s": 1000.0 + 10 * s}
            if s % 25 == 0:
                m["val_loss"] = loss + 0.5
            f.write(json.dumps(m) + "\n")
        # A skipped fp16 step's non-finite loss is written as null: left out of the curve.
        f.write('{"step": 101, "loss": null, "tokens_per_s": 2000.0}\n')
    subprocess.run([mammoth, "plot", metrics], check=True)
    svg_path = os.path.join(tmp, "run.svg")
    root = ET.parse(svg_path).getroot()
    assert root.tag == "{http://www.w3.org/2000/svg}svg", root.tag

    panels = root.findall("s:g[@class='panel']", NS)
    assert len(panels) == 2, len(panels)
    series = {p.get("data-label"): points(p) for p in root.iter("{http://www.w3.org/2000/svg}polyline")}
    assert set(series) == {"train loss", "val loss", "tokens/s"}, series.keys()
    assert len(series["train loss"]) == 100
    assert len(series["val loss"]) == 4
    assert len(series["tokens/s"]) == 101
    for name, pts in series.items():
        xs = [x for x, _ in pts]
        assert xs == sorted(xs) and len(set(xs)) == len(xs), name
    # Loss falls, so its y (downwards in SVG) grows; tokens/s rises, so its y shrinks.
    ys = [y for _, y in series["train loss"]]
    assert all(b >= a for a, b in zip(ys, ys[1:])), "loss curve not monotone"
    ys = [y for _, y in series["tokens/s"]]
    assert all(b <= a for a, b in zip(ys, ys[1:])), "tokens/s curve not monotone"
    # The validation curve sits above the training curve at the same steps (loss + 0.5).
    train = dict(series["train loss"])
    for x, y in series["val loss"]:
        assert y < train[x], (x, y, train[x])

    texts = [t.text for t in root.iter("{http://www.w3.org/2000/svg}text")]
    assert texts.count("step") == 2 and "loss" in texts and "tokens/s" in texts, texts
    for axis in ("x-axis", "y-axis"):
        for g in root.iter("{http://www.w3.org/2000/svg}g"):
            if g.get("class") == axis:
                labels = [t.text for t in g.findall("s:text", NS)]
                assert len(labels) >= 3, (axis, labels)
                for label in labels:
                    float(label.rstrip("kM"))

    # --out and errors.
    out = os.path.join(tmp, "custom.svg")
    subprocess.run([mammoth, "plot", metrics, "--out", out], check=True)
    ET.parse(out)
    bad = os.path.join(tmp, "bad.jsonl")
    with open(bad, "w") as f:
        f.write('{"step": 1, "loss": 2.0}\n{"step": 2, "loss": \n')
    r = subprocess.run([mammoth, "plot", bad], capture_output=True, text=True)
    assert r.returncode != 0 and "bad.jsonl:2" in r.stderr, r.stderr
    print("PASS")


if __name__ == "__main__":
    main()
