"""The installed set is the pinned one, and the only requirements it leaves unmet are the documented overrides.

alibi-detect and fastdup are installed with ``pip install --no-deps`` (requirements-alibi-detect.txt,
requirements-fastdup.txt) so that their Pillow pins do not hold Pillow back (docs/data.md,
"Pillow"). ``--no-deps`` also means pip checks nothing else for them: this test reads every
installed distribution's Requires-Dist (importlib.metadata) and fails on any unmet one that is
not in ``OVERRIDES``, so a new conflict, or a requirement of theirs nobody installed, cannot
sneak in. An override that is no longer needed fails too (the docs would be stale).
"""

from __future__ import annotations

import importlib.metadata as md
import re
import sysconfig
from pathlib import Path

from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name

REPO = Path(__file__).resolve().parents[1]

# (who requires, requirement as its metadata says): each one is written down in docs/data.md.
OVERRIDES = {
    ("alibi-detect", "pillow<11.0.0,>=5.4.1"),  # Pillow runs at requirements.txt's pin (13.x)
    ("fastdup", "pillow==10.3.0"),  # only when fastdup is installed (make venv WITH_FASTDUP=1)
}
PINNED_FILES = ("requirements.txt", "requirements-dev.txt", "requirements-alibi-detect.txt", "requirements-fastdup.txt")


def installed() -> dict[str, md.Distribution]:
    """The environment's own distributions: site-packages only (setuptools puts its vendored copies on sys.path)."""
    paths = sorted({sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]})
    return {canonicalize_name(d.metadata["Name"]): d for d in md.distributions(path=paths)}


def unmet(dists: dict[str, md.Distribution]) -> set[tuple[str, str]]:
    """(distribution, requirement) for every Requires-Dist of an installed distribution this set does not meet."""
    env = {**default_environment(), "extra": ""}
    out = set()
    for name, dist in dists.items():
        for line in dist.requires or []:
            req = Requirement(line)
            if req.marker is not None and not req.marker.evaluate(env):
                continue  # another platform's or an extra's requirement
            have = dists.get(canonicalize_name(req.name))
            if have is None or not req.specifier.contains(have.version, prereleases=True):
                spec = ",".join(sorted(str(s) for s in req.specifier))
                out.add((name, f"{canonicalize_name(req.name)}{spec}"))
    return out


def pins(path: Path) -> dict[str, str]:
    """name -> version of every ``name==version`` line of a requirements file."""
    found = {}
    for line in path.read_text().splitlines():
        match = re.match(r"^([A-Za-z0-9._-]+)(?:\[[A-Za-z0-9,._-]+\])?==(\S+)", line)  # name[extras]==version too
        if match:
            found[canonicalize_name(match.group(1))] = match.group(2)
    return found


def test_only_the_documented_overrides_are_unmet():
    dists = installed()
    expected = {(who, req) for who, req in OVERRIDES if who in dists}
    assert "alibi-detect" in dists, "requirements-alibi-detect.txt is not installed"
    assert unmet(dists) == expected


def test_every_requirement_line_is_pinned_and_installed_at_its_pin():
    dists = installed()
    for file in PINNED_FILES:
        lines = [ln.split("#")[0].strip() for ln in (REPO / file).read_text().splitlines()]
        loose = [ln for ln in lines if ln and not ln.startswith("-") and "==" not in ln]
        assert loose == [], f"{file}: not pinned"
        if file == "requirements-fastdup.txt" and "fastdup" not in dists:
            continue  # make venv WITH_FASTDUP=0
        for name, version in pins(REPO / file).items():
            assert name in dists, f"{file}: {name} is not installed"
            assert SpecifierSet(f"=={version}").contains(dists[name].version), (file, name, dists[name].version)


def test_the_lock_pins_every_requirement_line_at_the_same_version():
    lock = pins(REPO / "constraints.txt")
    for file in PINNED_FILES:
        for name, version in pins(REPO / file).items():
            assert lock.get(name) == version, f"{file}: {name}=={version}, constraints.txt: {lock.get(name)}"


def test_the_check_sees_a_planted_conflict():
    dists = installed()
    planted = {**dists, "planted": _Fake("planted", ["pillow<2", "numpy>=1; extra == 'x'", "no-such-package>=1"])}
    found = unmet(planted) - unmet(dists)
    assert found == {("planted", "pillow<2"), ("planted", "no-such-package>=1")}


class _Fake:
    """A distribution's metadata, as much of it as ``unmet`` reads."""

    def __init__(self, name: str, requires: list[str]):
        self.metadata = {"Name": name}
        self.requires = requires
        self.version = "1.0"
