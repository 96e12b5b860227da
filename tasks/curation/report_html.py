"""The curation's own page: ``index.html`` in the run folder, rendered from the JSON report body.

It needs no fastdup (whose galleries are optional): counts kept and dropped per class and per
reason, every dropped image with its reason, detail and a thumbnail of it and of the image kept
in its place, then the decisions the rules did not take (``decisions.abstained``: a rule that
abstained for a class and why; ``decisions.possible_copies`` (with thumbnails of both images) and
``decisions.possible_outliers``: images kept although they may be copies or bad images), "none"
when the report has no such entry.

Labels and details are user data: every string is HTML-escaped and no file name is built from
one (thumbnails are named by sha256, checked to be 64 hex digits). What the page shows is
bounded: ``MAX_ROWS`` dropped images and decisions each (the rest are counted, and the
``curation_report`` table holds them all), ``MAX_THUMBNAILS`` thumbnail files of at most
``THUMB_SIDE`` px; an image that does not decode shows "no thumbnail".
"""

from __future__ import annotations

import html
import io
import logging
import os
import re
import shutil
from pathlib import Path
from typing import Any

from PIL import Image, ImageOps

log = logging.getLogger("tasks.curation.curate")

PAGE = "index.html"
THUMBS = "thumbs"
THUMB_SIDE = 64  # px, longer side; tiny images (8x8 digits) are enlarged without smoothing
MAX_THUMBNAILS = 400  # thumbnail files per page (dropped images and their kept representatives)
MAX_ROWS = 1000  # dropped images, abstentions and possible copies listed, each
_SHA = re.compile(r"^[0-9a-f]{64}$")
IMAGE_COLUMNS = ("sha256", "partner")  # entry fields that name an image (possible copies)

STYLE = ("body{font-family:sans-serif;margin:1.5em}table{border-collapse:collapse;margin-bottom:1.5em}"
         "td,th{border:1px solid #ccc;padding:3px 6px;text-align:left;vertical-align:middle}"
         "img{image-rendering:pixelated}.muted{color:#777}")


def write_page(folder: Path, body: dict[str, Any], images: dict[str, bytes] | None, report_path: Path) -> Path:
    """Write ``folder/index.html`` (and its thumbnails) for the report ``body``; returns the page's path.

    ``images``: sha256 -> stored bytes of the images to show (None: no thumbnails at all).
    Rewritten whole each time, so a page never mixes two runs.
    """
    folder.mkdir(parents=True, exist_ok=True)
    thumbs = folder / THUMBS
    shutil.rmtree(thumbs, ignore_errors=True)
    shown = _thumbnails(thumbs, pictured(body), images or {})
    page = folder / PAGE
    tmp = page.with_suffix(".html.tmp")
    tmp.write_text(render(body, shown, os.path.relpath(report_path, folder), _gallery_links(body, folder)),
                   encoding="utf-8")
    tmp.replace(page)
    return page


def render(body: dict[str, Any], thumbs: dict[str, str], report_link: str, galleries: dict[str, str]) -> str:
    """The page's HTML; ``thumbs``: sha256 -> relative thumbnail path (images without one say so)."""
    e = _esc
    title = f"curation of {body.get('raw_table', '')} v{body.get('raw_version', '')}"
    head = (f"<!doctype html><html><head><meta charset='utf-8'><title>{e(title)}</title>"
            f"<style>{STYLE}</style></head><body><h1>{e(title)}</h1>"
            f"<p>curated version {e(body.get('curated_version'))} of {e(body.get('curated_table', ''))}; "
            f"config {e(body.get('config_hash', ''))}; run {e(body.get('run_id', ''))}; "
            f"embedding {e((body.get('curation') or {}).get('embedding', ''))}. "
            f"<a href='{e(report_link)}'>JSON report</a></p>")
    links = "".join(f"<li><a href='{e(path)}'>{e(name)}</a></li>" for name, path in sorted(galleries.items()))
    parts = [head,
             _counts_section(body),
             _dropped_section(body.get("dropped") or [], thumbs),
             _decisions_section((body.get("decisions") or {}).get("abstained"), "Abstained (rule did not act)",
                                ("rule", "label", "why")),
             _decisions_section((body.get("decisions") or {}).get("possible_copies"),
                                "Possible copies (kept, not dropped)", ("sha256", "partner", "score", "label"),
                                thumbs),
             _decisions_section((body.get("decisions") or {}).get("possible_outliers"),
                                "Possible bad images (kept, not dropped)", ("sha256", "reason", "detail", "label")),
             f"<h2>fastdup galleries</h2><ul>{links}</ul>" if links else "",
             "</body></html>"]
    return "\n".join(parts)


def _esc(value: Any) -> str:
    return html.escape("" if value is None else str(value), quote=True)


def _counts_section(body: dict[str, Any]) -> str:
    """Kept and dropped per class (dropped split by reason), then the totals per reason."""
    kept: dict[str, int] = {}
    for by_label in (body.get("counts_by_split_and_label") or {}).values():
        for label, n in by_label.items():
            kept[str(label)] = kept.get(str(label), 0) + int(n)
    dropped: dict[str, dict[str, int]] = {}
    for d in body.get("dropped") or []:
        per = dropped.setdefault(str(d.get("label")), {})
        per[str(d.get("reason"))] = per.get(str(d.get("reason")), 0) + 1
    reasons = sorted({r for per in dropped.values() for r in per} | set(body.get("dropped_by_reason") or {}))
    header = "".join(f"<th>{_esc(r)}</th>" for r in reasons)
    rows = []
    for label in sorted(set(kept) | set(dropped)):
        per = dropped.get(label, {})
        cells = "".join(f"<td>{per.get(r, 0)}</td>" for r in reasons)
        rows.append(f"<tr><td>{_esc(label)}</td><td>{kept.get(label, 0)}</td><td>{sum(per.values())}</td>{cells}</tr>")
    totals = "".join(f"<td>{int(n)}</td>" for n in ((body.get("dropped_by_reason") or {}).get(r, 0) for r in reasons))
    return (f"<h2>Kept and dropped per class</h2><p>kept {_esc(body.get('kept'))}, dropped "
            f"{sum((body.get('dropped_by_reason') or {}).values())}</p>"
            f"<table><tr><th>class</th><th>kept</th><th>dropped</th>{header}</tr>{''.join(rows)}"
            f"<tr><th>all</th><td>{_esc(body.get('kept'))}</td><td>{len(body.get('dropped') or [])}</td>{totals}</tr>"
            "</table>")


def _dropped_section(dropped: list[dict[str, Any]], thumbs: dict[str, str]) -> str:
    if not dropped:
        return "<h2>Dropped images</h2><p>none</p>"
    rows = []
    for d in dropped[:MAX_ROWS]:
        rows.append(f"<tr><td>{_thumb(d.get('sha256'), thumbs)}</td><td>{_esc(d.get('label'))}</td>"
                    f"<td>{_esc(d.get('reason'))}</td><td>{_esc(d.get('detail'))}</td>"
                    f"<td><code>{_esc(str(d.get('sha256'))[:12])}</code></td>"
                    f"<td>{_thumb(d.get('kept_sha256'), thumbs) if d.get('kept_sha256') else 'none'}</td>"
                    f"<td><code>{_esc(str(d.get('kept_sha256') or '')[:12])}</code></td></tr>")
    more = (f"<p class='muted'>{len(dropped) - MAX_ROWS} more not listed here (every one is in the JSON report "
            "and the curation_report table)</p>") if len(dropped) > MAX_ROWS else ""
    return ("<h2>Dropped images</h2><table><tr><th>image</th><th>class</th><th>reason</th><th>detail</th>"
            f"<th>sha256</th><th>kept instead</th><th>its sha256</th></tr>{''.join(rows)}</table>{more}")


def _decisions_section(entries: Any, title: str, columns: tuple[str, ...], thumbs: dict[str, str] | None = None) -> str:
    """A table of report entries; with ``thumbs``, the image columns (sha256, partner) show the image too."""
    if not entries or not isinstance(entries, list):
        return f"<h2>{_esc(title)}</h2><p>none</p>"
    listed = entries[:MAX_ROWS]
    header = "".join(f"<th>{_esc(c)}</th>" for c in columns)

    def cell(entry: Any, column: str) -> str:
        text = _esc(_cell(entry, column))
        if thumbs is None or column not in IMAGE_COLUMNS:
            return f"<td>{text}</td>"
        return f"<td>{_thumb(_cell(entry, column), thumbs)} <code>{text[:12]}</code></td>"

    rows = "".join("<tr>" + "".join(cell(e, c) for c in columns) + "</tr>" for e in listed)
    more = f"<p class='muted'>{len(entries) - len(listed)} more in the JSON report</p>" if len(entries) > len(listed) else ""
    return f"<h2>{_esc(title)}</h2><table><tr>{header}</tr>{rows}</table>{more}"


def _cell(entry: Any, column: str) -> Any:
    value = entry.get(column) if isinstance(entry, dict) else None
    return f"{value:.4f}" if isinstance(value, float) else value


def _thumb(sha: Any, thumbs: dict[str, str]) -> str:
    path = thumbs.get(str(sha))
    return f"<img src='{_esc(path)}' alt='thumbnail'>" if path else "<span class='muted'>no thumbnail</span>"


def pictured(body: dict[str, Any]) -> list[str]:
    """The images the page shows, in page order and at most ``MAX_THUMBNAILS``: each listed drop and the image
    kept in its place, then each listed possible copy and its partner (sha256s; anything else is ignored)."""
    pairs = [(d.get("sha256"), d.get("kept_sha256")) for d in (body.get("dropped") or [])[:MAX_ROWS]]
    copies = (body.get("decisions") or {}).get("possible_copies")
    if isinstance(copies, list):
        pairs += [(c.get("sha256"), c.get("partner")) for c in copies[:MAX_ROWS] if isinstance(c, dict)]
    wanted: dict[str, None] = {}
    for sha in (s for pair in pairs for s in pair):
        if isinstance(sha, str) and _SHA.match(sha):
            wanted.setdefault(sha)
    return list(wanted)[:MAX_THUMBNAILS]


def _thumbnails(folder: Path, wanted: list[str], images: dict[str, bytes]) -> dict[str, str]:
    """Thumbnail files of ``wanted`` images that are in ``images``: sha256 -> relative path."""
    out: dict[str, str] = {}
    for sha in (s for s in wanted if s in images):
        data = _thumbnail_png(images[sha])
        if data is None:
            continue
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"{sha}.png").write_bytes(data)
        out[sha] = f"{THUMBS}/{sha}.png"
    return out


def _thumbnail_png(data: bytes) -> bytes | None:
    """A PNG of at most THUMB_SIDE px on its longer side, or None when the image does not decode."""
    try:
        with Image.open(io.BytesIO(data)) as src:
            img = ImageOps.exif_transpose(src)
            img = img.convert("RGBA" if "A" in img.mode or img.mode == "P" else "RGB")
            w, h = img.size
            scale = THUMB_SIDE / max(w, h)
            size = (max(1, round(w * scale)), max(1, round(h * scale)))
            img = img.resize(size, Image.NEAREST if scale > 1 else Image.LANCZOS)
            buf = io.BytesIO()
            img.save(buf, format="PNG")  # optimize=True: 8x the time (0.67 ms a 64 px digit) for ~5% fewer bytes
            return buf.getvalue()
    except Exception as exc:  # a page for people: an image it cannot show costs one thumbnail, never the page
        log.debug("curate: no thumbnail (%s)", type(exc).__name__)
        return None


def _gallery_links(body: dict[str, Any], folder: Path) -> dict[str, str]:
    """fastdup's galleries (when they were made), as links relative to the page."""
    out = {}
    for name, path in (body.get("galleries") or {}).items():
        out[str(name)] = os.path.relpath(str(path), folder)
    return out


def existing_page(folder: Path) -> str:
    """The page's path when it was written, else ""."""
    page = folder / PAGE
    return str(page) if page.exists() else ""
