"""The curation's own page: written by every curation, escaped, bounded, with the decisions' sections."""

from __future__ import annotations

import html
import io
import json
import logging
from html.parser import HTMLParser
from pathlib import Path

from PIL import Image

from tasks.curation import report_html
from tasks.curation.curate import curate
from tasks.curation.report import run_dir
from tasks.curation.report_html import write_page
from tasks.data.ingest import ingest_landing
from tasks.data.sample_data import write_digits
from tests.factories.curation import LABELS, digit, encode, plant, sha

HOSTILE = "<script>alert(1)</script>\"'><img src=x onerror=alert(2)>"


class _Tags(HTMLParser):
    """Every tag with its attributes, as a browser's parser would see them."""

    def __init__(self) -> None:
        super().__init__()
        self.tags: list[tuple[str, dict[str, str | None]]] = []

    def handle_starttag(self, tag, attrs):
        self.tags.append((tag, dict(attrs)))


def tags(text: str) -> list[tuple[str, dict[str, str | None]]]:
    parser = _Tags()
    parser.feed(text)
    return parser.tags


def test_each_curation_writes_its_page_with_every_drop_and_thumbnails(settings, tmp_path, caplog):
    landing = tmp_path / "landing"
    write_digits(landing, limit=40)
    copy = plant(landing, "eleven_resaved.png", LABELS[11], encode(digit(11), "PNG", compress_level=1))
    raw = ingest_landing(settings, run_id="ing", logical_date="2026-11-21", landing=landing).raw_version
    with caplog.at_level(logging.INFO, logger="tasks.curation.curate"):
        result = curate(settings, raw, run_id="page", logical_date="2026-11-21")

    page = Path(result.report_html)
    assert f"curate: page {page}" in [r.getMessage() for r in caplog.records]  # the task log links it
    assert page == run_dir(settings, raw, settings.section_hash("curation")) / "index.html" and page.is_file()
    body = json.loads(Path(result.report_path).read_text())
    text = page.read_text()
    dropped = {d["sha256"]: d for d in body["dropped"]}
    assert copy in dropped and dropped[copy]["reason"] == "exact_duplicate"
    sources = [a["src"] for t, a in tags(text) if t == "img"]
    for d in body["dropped"]:  # each drop: its reason, detail, and both thumbnails
        assert f"thumbs/{d['sha256']}.png" in sources and f"thumbs/{d['kept_sha256']}.png" in sources
        assert html.escape(d["reason"]) in text and html.escape(d["detail"] or "") in text
    for src in sources:
        with Image.open(page.parent / src) as thumb:
            assert max(thumb.size) == report_html.THUMB_SIDE
    decisions = body.get("decisions") or {}
    for key, title in (("abstained", "Abstained (rule did not act)"),
                       ("possible_copies", "Possible copies (kept, not dropped)"),
                       ("possible_outliers", "Possible bad images (kept, not dropped)")):
        section = text.split(f"<h2>{title}</h2>")[1].split("<h2>")[0]
        entries = decisions.get(key) or []
        assert (section.startswith("<p>none</p>") if not entries
                else section.count("<tr>") == len(entries) + 1), (key, section[:200])
    assert f"<td>{html.escape(str(LABELS[11]))}</td><td>" in text  # the class row of the counts table

    # Answering the same curation again keeps the page; a lost page is rebuilt (without thumbnails).
    again = curate(settings, raw, run_id="page-2", logical_date="2026-11-21")
    assert again.report_html == result.report_html and page.read_text() == text
    page.unlink()
    third = curate(settings, raw, run_id="page-3", logical_date="2026-11-21")
    assert Path(third.report_html).is_file() and copy[:12] in Path(third.report_html).read_text()


def _png(value: int) -> bytes:
    buf = io.BytesIO()
    Image.new("L", (8, 8), value).save(buf, format="PNG")
    return buf.getvalue()


def test_labels_and_details_are_escaped_and_the_decisions_are_shown(tmp_path):
    a, b = sha(b"a"), sha(b"b")
    body = {
        "raw_table": "raw_images", "raw_version": 3, "curated_version": 4, "kept": 1,
        "counts_by_split_and_label": {"train": {HOSTILE: 1}}, "dropped_by_reason": {"near_duplicate": 1},
        "dropped": [{"sha256": a, "kept_sha256": b, "reason": "near_duplicate", "detail": HOSTILE, "label": HOSTILE,
                     "component": b},
                    {"sha256": "../../outside", "kept_sha256": None, "reason": HOSTILE, "detail": None,
                     "label": HOSTILE, "component": "x"}],
        "decisions": {"abstained": [{"rule": "near_duplicate", "label": HOSTILE, "why": "threshold inside the bulk"}],
                      "possible_copies": [{"sha256": a, "partner": b, "score": 0.998713, "label": HOSTILE}],
                      "possible_outliers": [{"sha256": b, "reason": "blurry", "detail": "blur 3.1 < limit 9.5",
                                             "label": HOSTILE}]},
    }
    images = {a: _png(10), b: _png(200), "../../outside": _png(50)}
    page = write_page(tmp_path / "run", body, images, tmp_path / "report.json")
    text = page.read_text()
    found = tags(text)
    assert {t for t, _ in found} <= {"html", "head", "meta", "title", "style", "body", "h1", "h2", "p", "a", "table",
                                     "tr", "th", "td", "img", "code", "span", "ul", "li"}
    assert not any(t == "script" for t, _ in found)
    pair = [f"thumbs/{a}.png", f"thumbs/{b}.png"]
    assert [a_["src"] for t, a_ in found if t == "img"] == pair + pair  # the drop, then the possible copy
    assert all(set(attrs) <= {"src", "alt", "href", "charset", "class"} for _, attrs in found)
    assert text.count(html.escape(HOSTILE)) >= 6  # class row, detail, the unsafe row and the three decisions
    assert "threshold inside the bulk" in text and "0.9987" in text and "blur 3.1 &lt; limit 9.5" in text
    assert sorted(p.name for p in (tmp_path / "run" / "thumbs").iterdir()) == sorted([f"{a}.png", f"{b}.png"])
    assert not (tmp_path / "outside.png").exists()
    assert "<a href='../report.json'>" in text


def test_what_the_page_shows_is_bounded(tmp_path, monkeypatch):
    monkeypatch.setattr(report_html, "MAX_ROWS", 3)
    monkeypatch.setattr(report_html, "MAX_THUMBNAILS", 2)
    shas = [sha(bytes([i])) for i in range(10)]
    body = {"kept": 0, "dropped_by_reason": {"blurry": 10},
            "dropped": [{"sha256": s, "kept_sha256": None, "reason": "blurry", "detail": "blur 1", "label": "0",
                         "component": None} for s in shas],
            "decisions": {"abstained": [{"rule": "r", "label": str(i), "why": "w"} for i in range(5)]}}
    page = write_page(tmp_path / "run", body, {s: _png(i * 20) for i, s in enumerate(shas)}, tmp_path / "r.json")
    text = page.read_text()
    assert len(list((tmp_path / "run" / "thumbs").iterdir())) == 2
    assert text.count("blur 1") == 3 and "7 more not listed here" in text and "2 more in the JSON report" in text
    assert "<h2>Possible copies (kept, not dropped)</h2><p>none</p>" in text
    assert "<p>kept 0, dropped 10</p>" in text
