"""Alignment-tolerant copy score for candidate pairs of near-duplicate images.

The curation embedding (``tasks.curation.curation_features.pixel_embedding``: grey pixels area-averaged
to 8x8, cosine) finds candidate pairs cheaply but cannot tell a shifted or cropped copy from a
different image of the same class. This module scores ONE candidate pair at a time (about
0.3-0.5 ms per pair on one core, numpy only; operators are cached per pair of image sizes), so
it re-scores the pairs the embedding proposes (``tasks.curation.copy_pairs``), it does not search a
collection. ``VERSION`` names the score: change it with anything that changes a score, so
that stored scores (the ``curation_pairs`` table) are never misread.

Signature (``copy_signature``, once per image)
    The upright grey ('L') pixels (alpha composited on black, as curation does). An image whose
    longer side is above ``GRID`` = 16 px is reduced, aspect kept, to a longer side of 16 px
    (PIL's antialiased bilinear filter); a smaller one is kept at its native size, because a
    tiny image's copies were resampled on its own pixel grid and that is where they are
    modelled (8x8 digits stay 8x8). Packed as a float32 vector
    ``[stored_h, stored_w, native_h, native_w, was_jpeg, pixels...]``.
    Why 16 px: the copy decision rests on the coarse layout, the hardest distinct images of a
    class differ there already, and the search's cost grows with the cube of the side (24 px
    would cost ~3x). Both images of a pair are compared on a 16x16 grid, each brought to it by
    PIL's bilinear resize (a non-square image is stretched; pairs whose aspect ratios differ
    by more than ``MAX_ASPECT_RATIO`` are not copies and score 0).

Score (``copy_score``)
    1. Alignment and degradation search. One image is the template ``T`` (on the grid), the
       other is warped, ``Y = Ry X Rx^T``, with per axis ``R = to_grid . resample(n -> m) .
       warp(scale, shift) . degrade``: ``warp`` reads the image at ``c + s (i - c) + d``,
       scales s = 1.00 ... 0.88 (a zoom into a 0-12% crop; the other direction covers
       1.00 ... 1.14) and shifts d up to +-6% of the side, with linear interpolation on the
       native grid (how a small copy was made) or Keys cubic on a reduced 16 px grid (a
       continuous shift); ``degrade`` is a Gaussian blur (sigma 0, 0.4, 0.7 px) or a down-and-up
       bilinear resampling to 50, 62.5 or 75% (a re-enlarged thumbnail); ``resample(n -> m)``
       brings the warped image to the template's stored size first (a rescaled copy was
       resampled from the original's grid). The warped image may also be a variant of itself:
       highlights clipped at 204-238 (a 1.07-1.25x brightening saturates; tried when the
       template reaches 250) or, when the template was a JPEG and the warped image is stored
       at native size, re-encoded as JPEG at quality 50-95 (at 8 px a JPEG's block quantisation
       changes a digit as much as the difference between two near-identical digits; it cannot
       be modelled on a reduced grid). Both directions are searched, so the score is symmetric.
       Scale and translation are separable, so an alignment is a pair of small matrices and
       the weighted NCCs of all (y op, x op) pairs come from a few batched matrix products.
       Search: coarse (scales every 0.04, shifts every 2% of the side, no degradation or
       down-up 62.5%), then every degradation and variant at the best alignment, then scales
       +-0.02 and shifts +-1% (steps 0.01) around it.
    2. Comparison window. When both images were reduced, template and warped image are blurred
       alike after the warp by a Gaussian of ``SIGMA`` = 1 grid px (texture near the 16 px
       Nyquist limit cannot be re-sampled consistently; blurring after the warp keeps the
       borders of both sides consistent). The NCC is weighted: the outer grid row and column
       get weight 0 and the next 0.5 (a shifted copy's replicated edge strip).
    3. Detail normalisation. A copy's residual (1 - NCC) grows with how much fine detail the
       image has: under a misregistration of delta px it is about delta^2 rho / 2, with
       rho = mean squared gradient / variance of the grid image (px^-2). So the residual is
       measured in units of the pair's detail: ``score = sign(c) |c| ** (RHO0 / rho)``,
       rho = the larger of the two images' (a degraded copy lost its original's detail),
       clipped to [``RHO_MIN``, ``RHO_MAX``] = [0.2, 1.0] (below, smooth images, JPEG and
       quantisation residuals dominate; above, near-noise textures, aliasing does). For
       rho = RHO0 = 0.25 (a typical digit) the score is the NCC. Without this no single
       threshold fits 8 px digits (residuals of copies and of distinct digits both
       ~0.001-0.005) and 128 px photo tiles (copies up to ~0.01, distinct >= 0.03) at once.

    Flat images (no variance on the grid) score 1.0 against each other and 0.0 against anything
    else. The score lies in [-1, 1] and ``copy_score(a, b) == copy_score(b, a)``.

Measured in ``bench/dedup_calibration.py`` (candidate ``aligned``; results in
``bench/results/dedup_calibration.json``).
"""

from __future__ import annotations

import io
import math
from functools import lru_cache

import numpy as np
from PIL import Image, ImageOps

VERSION = "aligned-v1"
GRID = 16  # px, side of the comparison grid and the longest stored side
MARGIN = 1  # grid px at each border with weight 0 ...
TAPER = 1  # ... then this many px ramping up to 1
SIGMA = 1.0  # grid px, Gaussian applied after the warp to both sides when both images were reduced
FINE_SCALES = tuple(np.round(np.arange(1.0, 0.8799, -0.01), 3))  # zoom-in factors (a 0-12% crop)
FINE_SHIFTS = tuple(np.round(np.arange(-0.06, 0.0601, 0.01), 3))  # fractions of the side
COARSE_SCALE_STEP = 4  # coarse pass: every 4th scale (0.04) ...
COARSE_SHIFT_STEP = 2  # ... every 2nd shift (2% of the side) ...
COARSE_BLURS = (0, 4)  # ... and these degradations (none, down-up to 62.5%)
REFINE_SCALE = 2  # refinement: +-2 fine scale steps ...
REFINE_SHIFT = 1  # ... and +-1 fine shift step around the best coarse alignment
BLURS = (("gauss", 0.0), ("gauss", 0.4), ("gauss", 0.7), ("downup", 0.5), ("downup", 0.625), ("downup", 0.75))
RHO0, RHO_MIN, RHO_MAX = 0.25, 0.2, 1.0  # px^-2, detail normalisation (see the module doc)
CLIP_LEVELS = (204.0, 215.0, 226.0, 238.0)  # highlight clip levels tried on the original (a 1.07-1.25x brightening)
CLIP_IF_MAX = 250.0  # ... when the other image reaches this level (it may have clipped highlights)
MAX_ASPECT_RATIO = 1.15  # pairs whose aspect ratios differ more are not copies: score 0
JPEG_QUALITIES = (50, 55, 60, 65, 70, 75, 80, 85, 90, 95)  # re-encodings tried on a small original against a JPEG
HEADER = 5  # stored_h, stored_w, native_h, native_w, 1 if the bytes were a JPEG


# ---------------------------------------------------------------- signature


def copy_signature(data: bytes) -> np.ndarray:
    """The image's grey pixels, reduced to a longest side of ``GRID`` px if larger (see the module doc)."""
    with Image.open(io.BytesIO(data)) as src:
        src.load()
        is_jpeg = src.format == "JPEG"
        img = ImageOps.exif_transpose(src)
        if img.mode in ("RGBA", "LA", "P", "PA"):
            rgba = img.convert("RGBA")
            img = Image.alpha_composite(Image.new("RGBA", rgba.size, (0, 0, 0, 255)), rgba)
        grey = img.convert("L")
    w, h = grey.size
    if max(w, h) > GRID:
        k = GRID / max(w, h)
        grey = grey.resize((max(1, round(w * k)), max(1, round(h * k))), Image.BILINEAR)
    x = np.asarray(grey, dtype=np.float32)
    return np.concatenate([np.array([x.shape[0], x.shape[1], h, w, is_jpeg], dtype=np.float32), x.ravel()])


def packed(sig: np.ndarray) -> bytes:
    """``sig`` as bytes for holding (``unpacked`` gives it back, equal): the header as float32, the pixels as
    uint8 when every one is a whole number 0..255 (always, from ``copy_signature``), else as float32.

    A curation holds the signatures of the images still ahead while it scores (up to most of a full run's
    images): as arrays of float32 about 1.1 KB each, packed about 0.3 KB.
    """
    head, pixels = np.ascontiguousarray(sig[:HEADER], dtype=np.float32), sig[HEADER:]
    small = pixels.astype(np.uint8)
    if np.array_equal(small, pixels):
        return b"\x01" + head.tobytes() + small.tobytes()
    return b"\x00" + head.tobytes() + np.ascontiguousarray(pixels, dtype=np.float32).tobytes()


def unpacked(data: bytes) -> np.ndarray:
    """The signature ``packed`` made, as ``copy_signature`` returned it (float32)."""
    head = np.frombuffer(data, dtype=np.float32, count=HEADER, offset=1)
    pixels = np.frombuffer(data, dtype=np.uint8 if data[0] == 1 else np.float32, offset=1 + 4 * HEADER)
    return np.concatenate([head, pixels.astype(np.float32)])


def _unpack(sig: np.ndarray) -> tuple[np.ndarray, bool, float, bool]:
    """(stored pixels 0..255; whether the image was reduced; native aspect h / w; whether it was a JPEG)."""
    sh, sw, h, w, is_jpeg = (int(v) for v in sig[:HEADER])
    x = sig[HEADER:HEADER + sh * sw].reshape(sh, sw).astype(np.float64)
    return x, max(h, w) > GRID, h / w, bool(is_jpeg)


@lru_cache(maxsize=1024)
def _jpeg_variants(pixels: bytes, shape: tuple[int, int]) -> tuple[np.ndarray, ...]:
    """A native-size grey image re-encoded as JPEG at each of ``JPEG_QUALITIES``, decoded."""
    img = Image.frombytes("L", (shape[1], shape[0]), pixels)
    out = []
    for q in JPEG_QUALITIES:
        buf = io.BytesIO()
        img.save(buf, format="JPEG", quality=q)
        with Image.open(buf) as dec:
            out.append(np.asarray(dec.convert("L"), dtype=np.float64))
    return tuple(out)


# ---------------------------------------------------------------- 1-D operators


@lru_cache(maxsize=256)
def _resize_matrix(n: int, m: int) -> np.ndarray:
    """(m, n): PIL's bilinear resize of a length-n signal to length m (antialiased when shrinking)."""
    if n == m:
        return np.eye(n)
    eye = Image.fromarray(np.eye(n, dtype=np.float32), mode="F")
    return np.asarray(eye.resize((m, n), Image.BILINEAR), dtype=np.float64).T


def _keys(t: np.ndarray, a: float = -0.5) -> np.ndarray:
    t = np.abs(t)
    return np.where(t <= 1, (a + 2) * t ** 3 - (a + 3) * t ** 2 + 1,
                    np.where(t < 2, a * t ** 3 - 5 * a * t ** 2 + 8 * a * t - 4 * a, 0.0))


def _sample_matrix(n: int, pos: np.ndarray, cubic: bool) -> np.ndarray:
    """(len(pos), n): the signal read at ``pos`` (linear or Keys cubic), edges repeated."""
    pos = np.clip(pos, 0, n - 1)
    out = np.zeros((len(pos), n))
    rows = np.arange(len(pos))
    base = np.floor(pos).astype(int)
    for off in ((-1, 0, 1, 2) if cubic else (0, 1)):
        idx = base + off
        wt = _keys(pos - idx) if cubic else np.maximum(0.0, 1.0 - np.abs(pos - idx))
        np.add.at(out, (rows, np.clip(idx, 0, n - 1)), wt)
    return out


def gauss_matrix(n: int, sigma: float) -> np.ndarray:
    """(n, n) Gaussian blur, edges repeated."""
    if sigma <= 0:
        return np.eye(n)
    x = np.arange(n)
    r = int(math.ceil(3 * sigma))
    ext = np.arange(-r, n + r)
    wt = np.exp(-0.5 * ((x[:, None] - ext[None, :]) / sigma) ** 2)
    out = np.zeros((n, n))
    np.add.at(out.T, np.clip(ext, 0, n - 1), wt.T)
    return out / out.sum(axis=1, keepdims=True)


def _degrade_matrix(n: int, kind: str, v: float) -> np.ndarray:
    if kind == "gauss":
        return gauss_matrix(n, v)
    m = max(1, round(n * v))
    return _resize_matrix(m, n) @ _resize_matrix(n, m)


@lru_cache(maxsize=1)
def _weights() -> np.ndarray:
    d = np.minimum(np.arange(GRID), GRID - 1 - np.arange(GRID))
    return np.clip((d - MARGIN + 1) / (TAPER + 1), 0.0, 1.0)


@lru_cache(maxsize=64)
def _to_grid(m: int, sigma: float) -> np.ndarray:
    """(GRID, m): a stored axis of length m onto the grid, then the post-warp blur."""
    return gauss_matrix(GRID, sigma) @ _resize_matrix(m, GRID)


class _Axis:
    """Every search operator for one axis: a warped image of stored length n onto a template of length m.

    ``RwT[s, b, k]`` is (n, GRID): (sqrt(weights) * R)^T for scale s, degradation b, shift k;
    ``r`` = R^T weights (weighted sums); ``gram`` = R^T diag(weights) R, flattened (weighted sums of squares).
    """

    def __init__(self, n: int, m: int, cubic: bool, sigma: float) -> None:
        w = _weights()
        post = _to_grid(m, sigma) @ _resize_matrix(n, m)
        c, i = (n - 1) / 2, np.arange(n)
        degrade = [_degrade_matrix(n, kind, v) for kind, v in BLURS]
        R = np.empty((len(FINE_SCALES), len(BLURS), len(FINE_SHIFTS), GRID, n))
        for si, s in enumerate(FINE_SCALES):
            for ki, d in enumerate(FINE_SHIFTS):
                warp = post @ _sample_matrix(n, c + s * (i - c) + d * n, cubic)
                for bi, deg in enumerate(degrade):
                    R[si, bi, ki] = warp @ deg
        Rw = R * np.sqrt(w)[:, None]
        self.RwT = np.ascontiguousarray(np.swapaxes(Rw, -1, -2))
        self.r = np.einsum("sbkga,g->sbka", R, w)
        self.gram = np.einsum("sbkga,sbkgc->sbkac", Rw, Rw).reshape(R.shape[:3] + (n * n,))
        nk = len(range(0, len(FINE_SHIFTS), COARSE_SHIFT_STEP))

        def coarse(a: np.ndarray) -> np.ndarray:
            sub = a[::COARSE_SCALE_STEP][:, list(COARSE_BLURS)][:, :, ::COARSE_SHIFT_STEP]
            return np.ascontiguousarray(sub.reshape((-1, nk) + a.shape[3:]))

        self.c_RwT, self.c_r, self.c_gram = coarse(self.RwT), coarse(self.r), coarse(self.gram)


@lru_cache(maxsize=32)
def _axis(n: int, m: int, cubic: bool, sigma: float) -> _Axis:
    return _Axis(n, m, cubic, sigma)


# ---------------------------------------------------------------- score


def _ncc(T: np.ndarray, X: np.ndarray, RyT, ry, gy, RxT, rx, wsum: float) -> np.ndarray:
    """Weighted NCC of the template with Ry X Rx^T for every (y op, x op) pair of each leading index: (c, Ky, Kx)."""
    c, ky = RyT.shape[:2]
    kx = RxT.shape[1]
    qy = (RyT @ T).reshape(c, ky, -1)
    Z = X @ RxT  # (c, Kx, ny, G)
    num = qy @ Z.reshape(c, kx, -1).transpose(0, 2, 1)
    tot = ry @ (X @ rx.transpose(0, 2, 1))
    ss = gy @ (Z @ Z.transpose(0, 1, 3, 2)).reshape(c, kx, -1).transpose(0, 2, 1)
    var = ss - tot ** 2 / wsum
    return num / np.sqrt(np.maximum(var, 1e-12))


def _template(x: np.ndarray, sigma: float) -> tuple[np.ndarray | None, float, float]:
    """(weighted, centred, unit template or None if flat; rho = weighted mean squared gradient / variance; sum of weights)."""
    w = _weights()
    W = np.outer(w, w)
    T = _to_grid(x.shape[0], sigma) @ x @ _to_grid(x.shape[1], sigma).T
    wsum = float(W.sum())
    T = T - (W * T).sum() / wsum
    var = float((W * T * T).sum())
    if var <= 1e-6 * wsum:
        return None, 0.0, wsum
    gy, gx = np.diff(T, axis=0), np.diff(T, axis=1)
    wm = np.sqrt(w[1:] * w[:-1])
    grad = float((np.outer(wm, w) * gy * gy).sum() + (np.outer(w, wm) * gx * gx).sum())
    return T * np.sqrt(W) / math.sqrt(var), grad / var, wsum


def _search(T: np.ndarray, wsum: float, x: np.ndarray, ay: _Axis, ax: _Axis, clip: bool, jpeg: bool) -> float:
    """Best NCC of template T against warps of x: coarse grid, then every degradation and variant, then a finer grid.

    Variants of x (the would-be original): highlights clipped (``clip``: the template may be a brightened copy) and
    JPEG re-encodings (``jpeg``: the template was a JPEG and x is stored at its native size).
    """
    variants = [x - x.mean()]
    if clip:
        variants += [v - v.mean() for v in (np.minimum(x, c) for c in CLIP_LEVELS if x.max() > c)]
    if jpeg:
        u8 = np.clip(np.rint(x), 0, 255).astype(np.uint8)
        variants += [v - v.mean() for v in _jpeg_variants(u8.tobytes(), u8.shape)]
    x = variants[0]
    ncc = _ncc(T, x, ay.c_RwT, ay.c_r, ay.c_gram, ax.c_RwT, ax.c_r, wsum)
    ci, yi, xi = np.unravel_index(int(np.argmax(ncc)), ncc.shape)
    best = float(ncc[ci, yi, xi])
    si = (ci // len(COARSE_BLURS)) * COARSE_SCALE_STEP
    yi, xi = yi * COARSE_SHIFT_STEP, xi * COARSE_SHIFT_STEP
    y1, x1 = slice(yi, yi + 1), slice(xi, xi + 1)
    for v in variants:
        ncc = _ncc(T, v, ay.RwT[si, :, y1], ay.r[si, :, y1], ay.gram[si, :, y1],
                   ax.RwT[si, :, x1], ax.r[si, :, x1], wsum).ravel()
        if float(ncc.max()) > best or v is variants[0]:
            bi, x = int(np.argmax(ncc)), v
            best = max(best, float(ncc[bi]))
    S = slice(max(0, si - REFINE_SCALE), si + REFINE_SCALE + 1)
    Ky = slice(max(0, yi - REFINE_SHIFT), yi + REFINE_SHIFT + 1)
    Kx = slice(max(0, xi - REFINE_SHIFT), xi + REFINE_SHIFT + 1)
    ncc = _ncc(T, x, ay.RwT[S, bi, Ky], ay.r[S, bi, Ky], ay.gram[S, bi, Ky],
               ax.RwT[S, bi, Kx], ax.r[S, bi, Kx], wsum)
    return max(best, float(ncc.max()))


def raw_and_rho(a: np.ndarray, b: np.ndarray) -> tuple[float, float]:
    """(best aligned NCC in [-1, 1], the pair's detail rho before clipping); NaN rho for flat or mismatched pairs."""
    (xa, ra, asp_a, ja), (xb, rb, asp_b, jb) = _unpack(a), _unpack(b)
    if abs(math.log(asp_a / asp_b)) > math.log(MAX_ASPECT_RATIO):
        return 0.0, float("nan")
    sigma = SIGMA if (ra and rb) else 0.0
    Ta, rho_a, wsum = _template(xa, sigma)
    Tb, rho_b, _ = _template(xb, sigma)
    if Ta is None or Tb is None:
        return (1.0 if Ta is None and Tb is None else 0.0), float("nan")
    best = max(
        _search(Ta, wsum, xb, _axis(xb.shape[0], xa.shape[0], rb, sigma), _axis(xb.shape[1], xa.shape[1], rb, sigma),
                xa.max() >= CLIP_IF_MAX, ja and not rb),
        _search(Tb, wsum, xa, _axis(xa.shape[0], xb.shape[0], ra, sigma), _axis(xa.shape[1], xb.shape[1], ra, sigma),
                xb.max() >= CLIP_IF_MAX, jb and not ra),
    )
    return min(1.0, max(-1.0, best)), max(rho_a, rho_b)


def copy_score(a: np.ndarray, b: np.ndarray) -> float:
    """Symmetric copy score in [-1, 1] of two ``copy_signature`` vectors (see the module doc)."""
    c, rho = raw_and_rho(a, b)
    if rho != rho:  # flat or aspect mismatch: already final
        return c
    k = RHO0 / min(RHO_MAX, max(RHO_MIN, rho))
    return math.copysign(abs(c) ** k, c)
