"""The project's own image statistics against fastdup's, on the same images in one run.

2,000 real digits as 8x8 grey PNGs (scikit-learn's 1,797 plus the first 203 mirrored, so every
file differs), held as bytes the way curation reads them from the raw table:

* ``own``: ``tasks.curation.curation_features.decode_stats`` per image (one decode; mean,
  contrast, min, max, and the Laplacian variance on the 64 px grid: ``tasks.curation.image_stats``);
* ``fastdup``: what curation did before: the exported copy per image (``export_copy``: 8x8
  upscaled to 32x32 PNG, written to a folder) and one ``fastdup`` statistics run over the folder
  (``run_stats_only=True``, then ``img_stats()``), fastdup imported before the clock starts.

Usage: FASTDUP_PRODUCTION=1 python bench/image_stats.py [--images 2000] [--repeat 3]
(prints a Markdown table; the best of ``--repeat`` runs of each)
"""

from __future__ import annotations

import argparse
import io
import shutil
import sys
import tempfile
import time
from pathlib import Path

from PIL import Image, ImageOps

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tasks.curation.curation_features import decode_stats, export_copy  # noqa: E402
from tasks.data.sample_data import digits_arrays  # noqa: E402


def digits(n: int) -> list[bytes]:
    images, _ = digits_arrays()
    out = []
    for i in range(n):
        img = Image.fromarray(images[i % len(images)], mode="L")
        if i >= len(images):
            img = ImageOps.mirror(img)
        buf = io.BytesIO()
        img.save(buf, format="PNG")
        out.append(buf.getvalue())
    return out


def own(images: list[bytes]) -> float:
    t0 = time.perf_counter()
    for data in images:
        decode_stats(data)
    return time.perf_counter() - t0


def with_fastdup(images: list[bytes]) -> float:
    import fastdup
    import pandas as pd

    work = Path(tempfile.mkdtemp(prefix="bench-stats-"))
    try:
        t0 = time.perf_counter()
        (work / "images").mkdir()
        files = []
        for i, data in enumerate(images):
            exported, ext = export_copy(data)
            path = work / "images" / f"{i:05d}{ext}"
            path.write_bytes(exported)
            files.append(str(path))
        fd = fastdup.create(work_dir=str(work / "fastdup"), input_dir=str(work / "images"))
        fd.run(annotations=pd.DataFrame({"filename": files}), run_stats_only=True, overwrite=True, verbose=False)
        stats = fd.img_stats()
        assert len(stats) == len(images), len(stats)
        return time.perf_counter() - t0
    finally:
        shutil.rmtree(work, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=2000)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    import fastdup  # noqa: F401  (its import is not part of either path's time)

    images = digits(args.images)
    t_own = min(own(images) for _ in range(args.repeat))
    t_fd = min(with_fastdup(images) for _ in range(args.repeat))
    print("| path | seconds | ms per image | vs fastdup |")
    print("|---|---|---|---|")
    print(f"| fastdup: export + statistics run | {t_fd:.2f} | {1000 * t_fd / len(images):.2f} | 1.00x |")
    print(f"| own: decode_stats (Pillow + numpy) | {t_own:.2f} | {1000 * t_own / len(images):.2f} | {t_own / t_fd:.2f}x |")


if __name__ == "__main__":
    main()
