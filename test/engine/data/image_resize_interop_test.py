"""Images of other sizes than the model's, through `train --images`' reader
(engine/data/image_folder.cc, via image_folder_tool), against transformers' ViTImageProcessor
(Pillow's bilinear resize, rescale, normalise): the same 8-bit pixels after the resize, so
model inputs within float rounding. Shrinking (antialiased: 4x and odd factors) and
enlarging, non-square, both orders of Pillow's two passes (vertical first when the height
shrinks by more than twice as many pixels as the width), RGB and grayscale, PNG and JPEG
(decoded by Pillow on the reference side, libjpeg-turbo on ours: the same bytes).

  image_resize_interop_test.py IMAGE_FOLDER_TOOL
"""
import os
import subprocess
import sys
import tempfile

import numpy as np
from PIL import Image
from transformers import ViTImageProcessor

tool = sys.argv[1]
rng = np.random.default_rng(3)
SIZE = 32
# (h, w): 128x128, 61x97 and 7x45 resample horizontally first, 97x61, 33x32, 300x17 and 64x40
# vertically first.
shapes = [(128, 128), (97, 61), (33, 32), (32, 40), (20, 20), (7, 45), (31, 31), (300, 17),
          (32, 32), (61, 97), (64, 40)]

with tempfile.TemporaryDirectory() as work:
    for channels, mode in [(3, "RGB"), (1, "L")]:
        root = os.path.join(work, mode)
        files = []
        for k, (h, w) in enumerate(shapes):
            cls = os.path.join(root, f"class{k % 2}")
            os.makedirs(cls, exist_ok=True)
            # Smooth gradients plus noise: both the filter's shape and its rounding show.
            y, x = np.mgrid[0:h, 0:w]
            base = (x * 255 / max(w - 1, 1) * 0.6 + y * 255 / max(h - 1, 1) * 0.4)
            img = np.clip(base[..., None] + rng.normal(0, 40, (h, w, 3)), 0, 255).astype(np.uint8)
            pil = Image.fromarray(img, "RGB").convert(mode)
            ext = "png" if k % 3 else "jpg"
            path = os.path.join(cls, f"img{k:02d}.{ext}")
            pil.save(path, quality=90) if ext == "jpg" else pil.save(path)
            files.append(path)
        out_path = os.path.join(work, f"{mode}.f32")
        run = subprocess.run([tool, root, str(channels), str(SIZE), out_path],
                             capture_output=True, text=True)
        assert run.returncode == 0, run.stderr
        ours = np.fromfile(out_path, dtype=np.float32).reshape(len(files), channels, SIZE, SIZE)
        resized = sum((h, w) != (SIZE, SIZE) for h, w in shapes)
        assert f"{resized} resized" in run.stdout, run.stdout
        # The tool reads class0's files then class1's, each sorted by name.
        order = sorted(files, key=lambda p: (os.path.basename(os.path.dirname(p)), p))
        proc = ViTImageProcessor(size={"height": SIZE, "width": SIZE})
        worst = 0.0
        for i, path in enumerate(order):
            im = Image.open(path)
            im.load()
            if channels == 3:
                want = proc(im.convert("RGB"), return_tensors="np")["pixel_values"][0]
            else:
                # ViTImageProcessor is made for RGB; for one channel the same steps by hand:
                # Pillow's bilinear resize, then (p / 255 - 0.5) / 0.5.
                r = np.asarray(im.resize((SIZE, SIZE), Image.BILINEAR), dtype=np.float64)
                want = ((r / 255.0 - 0.5) / 0.5)[None].astype(np.float32)
            diff = float(np.abs(ours[i] - want).max())
            # One 8-bit level is 2/255 = 0.0078 after normalisation; float rounding is ~1e-7.
            worst = max(worst, diff)
            assert diff < 1e-5, (path, diff)
        print(f"{mode}: {len(files)} images ({resized} resized to {SIZE}x{SIZE}), largest "
              f"difference from ViTImageProcessor {worst:.2e}")
print("PASS")
