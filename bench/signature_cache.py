"""How many copy signatures a full curation holds at once (issue 25), from the pairs it stored.

A full run scores its candidate pairs in blocks of ``copy_pairs.SCORE_BLOCK``, in key order, and keeps
each image's signature (about 1 KB) in the calling process. Before, every signature stayed until the
scoring ended: all the images with a pair. Now (``CopyScores._forget_signatures_below``) an image's
signature goes once a block's last pair starts after it. This replays the blocks over the pairs a kept
home stored (``curation_pairs``, sorted as they were scored) and prints the most held at once, both ways.

Usage: PYTHONPATH=.:plugins python bench/signature_cache.py HOME (a home kept by
bench/curate_scale.py --keep-homes, after its full run).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def held_at_once(a: np.ndarray, b: np.ndarray, block: int) -> tuple[int, int]:
    """(most held with the signatures dropped as blocks pass, most held when kept to the end).

    ``a`` < ``b`` are the pairs' image positions in sha256 order, the pairs sorted by (a, b); every position
    below the largest is in a pair, so keeping every signature to the end holds all of them.
    """
    blocks = np.arange(len(a)) // block
    n = int(max(a.max(), b.max())) + 1
    first = np.full(n, np.iinfo(np.int64).max)
    np.minimum.at(first, a, blocks)
    np.minimum.at(first, b, blocks)
    last_a = a[np.minimum(np.arange(1, blocks[-1] + 2) * block, len(a)) - 1]  # each block's last first image
    positions = np.arange(n)
    most = 0
    cut = 0
    for k in range(int(blocks[-1]) + 1):
        most = max(most, int(np.count_nonzero((first <= k) & (positions >= cut))))
        cut = int(last_a[k])
    return most, n


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("home")
    args = parser.parse_args()
    from tasks.curation.copy_pairs import PAIRS_TABLE, SCORE_BLOCK
    from tasks.data import lake
    from tasks.settings import load_settings

    settings = load_settings("sit", home=Path(args.home))
    uri = settings.table_uri(PAIRS_TABLE)
    pairs = lake.read(uri, lake.current_version(uri), columns=["sha256_a", "sha256_b"])
    pairs = pairs.sort_by([("sha256_a", "ascending"), ("sha256_b", "ascending")])
    shas = pc.unique(pa.concat_arrays([pairs.column("sha256_a").combine_chunks(),
                                       pairs.column("sha256_b").combine_chunks()])).sort()
    a = pc.index_in(pairs.column("sha256_a"), value_set=shas).to_numpy().astype(np.int64)
    b = pc.index_in(pairs.column("sha256_b"), value_set=shas).to_numpy().astype(np.int64)
    dropped, kept = held_at_once(a, b, SCORE_BLOCK)
    print(f"{len(a):,} pairs over {len(shas):,} images, blocks of {SCORE_BLOCK:,}: at most {dropped:,} signatures "
          f"held at once when dropped as blocks pass, {kept:,} when kept to the end ({dropped / kept:.0%})")


if __name__ == "__main__":
    main()
