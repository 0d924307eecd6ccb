"""Which SGLang is imported, judged by its code, not by the label on it.

Three witnesses: the installed distribution metadata (``importlib.metadata``), the
version the package's own ``_version.py`` names, and the code's digests
(:mod:`sglang_dsv4_guard.host.digests`) compared with those stored for every known
release in ``digests.json``. They disagree when a source tree sits on
``PYTHONPATH`` over another installed wheel, and for a release newer than the guard.

- The code matches its own release's code digests: that release's profile. When the
  metadata names another release, a WARNING names both.
- The code matches another known release (an unknown 0.5.24 whose checks did not change):
  that release's checks, with an INFO (unknown release) or WARNING (a known label on
  other code) naming the match.
- The code is a known release with the guard's own patch series (``patches/``) applied:
  its checks now report every mismatch, and the guard, which predicts them from the
  released checks, guards it as that release (INFO). Those code digests are stored too,
  under ``"patched"``.
- The code matches no known release: no profile; the guard stays inert (strict refuses)
  with a WARNING naming what changed against the closest known release.
- A file the code digests read is there but cannot be read, or Python could not compile
  it (sources are read as Python imports them, from bytes with their declared encoding):
  no profile, and the WARNING names the file and why, not a change of SGLang's checks.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import logging
from dataclasses import dataclass, replace
from pathlib import Path

from packaging.version import InvalidVersion, Version

from sglang_dsv4_guard.host.digests import (
    MORI,
    POOL,
    UTILS,
    Part,
    UnreadableSource,
    code_version,
    differences,
    digest_tree,
)
from sglang_dsv4_guard.host.releases import HostProfile, is_supported, profile_for

__all__ = ["DIGESTS_FILE", "HostJudgement", "forget_judgements", "imported_package_dir", "judge",
           "judge_imported", "load_known"]

DIGESTS_FILE = Path(__file__).with_name("digests.json")


@dataclass(frozen=True)
class HostJudgement:
    """What the guard concluded about the imported SGLang."""

    metadata: Version | None  # what importlib.metadata says
    code: Version | None  # what the package's own _version.py says
    behaves_as: Version | None  # the known release whose checks apply; None: stay inert
    level: int  # logging level of ``message``
    message: str  # empty when everything agrees
    changed: tuple[str, ...] = ()  # what differs from the closest known release
    unreadable: str = ""  # a file judged that cannot be read or parsed, and why

    @property
    def version(self) -> Version | None:
        """The host's own label: the code's version, else the metadata's."""
        return self.code or self.metadata

    @property
    def name(self) -> str:
        """The release as reports name it. A label that is a known release but not the
        one the code matches (``_version.py`` missing, metadata of another release) is
        not trusted: ``code matching 0.5.17 (labelled 0.5.23)``."""
        label, match = self.version, self.behaves_as
        if match is None or label == match:
            return str(label or match or "unknown")
        if label is None:
            return f"code matching {match}"
        if is_supported(label):
            return f"code matching {match} (labelled {label})"
        return str(label)  # a new release with a known release's checks

    def profile(self) -> HostProfile:
        """The checks of the release the code behaves as (its ``version``), named by
        :attr:`name` in reports."""
        if self.behaves_as is None:
            raise ValueError(f"no known release's checks apply: {self.message}")
        profile = profile_for(self.behaves_as)
        return replace(profile, label="" if self.name == str(profile.version) else self.name)


def _version(text: str | None) -> Version | None:
    try:
        return Version(text) if text else None
    except InvalidVersion:
        return None


def load_known(path: Path = DIGESTS_FILE,
               section: str = "releases") -> dict[Version, dict[str, Part]]:
    """The stored code digests of every known release, oldest first; with ``section``
    ``"patched"``, of every release with the guard's patch series applied."""
    data = json.loads(path.read_text(encoding="utf-8"))
    known = {Version(release): {key: Part(key, digest, what)
                                for key, (digest, what) in parts.items()}
             for release, parts in data.get(section, {}).items()}
    return dict(sorted(known.items()))


def imported_package_dir() -> Path | None:
    """The directory of the ``sglang`` package ``import sglang`` would load (not imported)."""
    try:
        spec = importlib.util.find_spec("sglang")
    except (ImportError, ValueError):
        return None
    locations = list(spec.submodule_search_locations or []) if spec else []
    return Path(locations[0]) if locations else None


def judge(package: Path, metadata: Version | None,
          known: dict[Version, dict[str, Part]] | None = None,
          patched: dict[Version, dict[str, Part]] | None = None) -> HostJudgement:
    """Judge the ``sglang`` package at ``package`` whose metadata says ``metadata``
    (``known``, ``patched``: the stored code digests, by default from the data file)."""
    known = load_known() if known is None else known
    patched = load_known(section="patched") if patched is None else patched
    try:
        code = _version(code_version(package))
    except UnreadableSource:  # only the label: the code's digests still decide
        code = None
    label = code or metadata
    sglang = f"SGLang {label or 'of unknown version'} ({package})"
    try:
        found = digest_tree(package)
    except UnreadableSource as exc:
        text = (f"{sglang}: {exc} (the guard reads it as Python imports it, to know SGLang's "
                "checks; they are not known)")
        return HostJudgement(metadata, code, None, logging.WARNING, text, unreadable=str(exc))
    matches = [v for v, parts in known.items() if not differences(found, parts)]
    both = (f"installed metadata says SGLang {metadata}, the imported code "
            f"({package}) says {code}")
    disagree = metadata is not None and code is not None and metadata != code
    if label in matches:
        message = f"{both}; using the code's release {code}" if disagree else ""
        return HostJudgement(metadata, code, label, logging.WARNING, message)
    sglang = f"{both}; {sglang}" if disagree else sglang  # every message below starts so
    if matches:
        twin = matches[-1]
        text = (f"{sglang} has the same checks as known release {twin} (code digests match); "
                f"guarding it as {twin}")
        unknown_label = label is None or label not in known
        level = logging.INFO if unknown_label and not disagree else logging.WARNING
        return HostJudgement(metadata, code, twin, level, text)
    carried = [v for v, parts in patched.items() if not differences(found, parts)]
    if carried:
        # Several releases can share a patched text; the label picks among them.
        base = label if label in carried else carried[-1]
        text = (f"{sglang} carries sglang-dsv4-guard's patch series for {base} (patches/); "
                f"guarding it as {base}")
        mislabelled = label is not None and label != base and label in known
        level = logging.WARNING if disagree or mislabelled else logging.INFO
        return HostJudgement(metadata, code, base, level, text)
    span = f"{next(iter(known))} to {list(known)[-1]}" if known else "none"
    # The closest of the releases and of the releases with our series (a patched tree
    # changed further is named against its patched release, not our own rewrite).
    candidates = [(v, "", parts) for v, parts in known.items()]
    candidates += [(v, " with sglang-dsv4-guard's patch series", parts)
                   for v, parts in patched.items()]
    order = {v: i for i, v in enumerate(known)}
    # Fewest differences; among equals the release the code names, then the newest.
    closest, suffix, parts = min(candidates, key=lambda c: (
        len(differences(found, c[2])), c[0] != label, -order.get(c[0], -1), c[1] != ""))
    changed = tuple(differences(found, parts))
    text = (f"{sglang} differs from every release the guard knows ({span}) in what the guard "
            f"depends on; against the closest, {closest}{suffix}: " + "; ".join(changed)
            + " (the guard does not know these checks: upgrade sglang-dsv4-guard, or run a "
            "release it knows)")
    return HostJudgement(metadata, code, None, logging.WARNING, text, changed)


# judge_imported() judgements of this process, by package path, metadata and the mtimes
# of every file read: install, doctor, check and patches judge once, not each time.
_JUDGEMENTS: dict[tuple[object, ...], HostJudgement] = {}
_READ = (UTILS, MORI, POOL, "_version.py")


def _mtimes(package: Path) -> tuple[int, ...]:
    stamps = []
    for path in [*(package / rel for rel in _READ), DIGESTS_FILE]:
        try:
            stamps.append(path.stat().st_mtime_ns)
        except OSError:
            stamps.append(-1)
    return tuple(stamps)


def forget_judgements() -> None:
    """Drop the memoised :func:`judge_imported` judgements (tests that fake the data)."""
    _JUDGEMENTS.clear()


def judge_imported() -> HostJudgement:
    """Judge the SGLang that ``import sglang`` would load in this process (memoised by
    package path, metadata and the mtimes of the files judged)."""
    try:
        metadata = _version(importlib.metadata.version("sglang"))
    except importlib.metadata.PackageNotFoundError:
        metadata = None
    package = imported_package_dir()
    if package is None:
        return HostJudgement(metadata, None, None, logging.WARNING, "SGLang is not installed")
    try:
        key = (str(package), metadata, _mtimes(package))
        if key not in _JUDGEMENTS:
            _JUDGEMENTS[key] = judge(package, metadata)
        return _JUDGEMENTS[key]
    except (OSError, ValueError, KeyError, TypeError) as exc:  # our data file, not SGLang
        return HostJudgement(metadata, None, None, logging.WARNING,
                           f"cannot judge the SGLang at {package}: {DIGESTS_FILE.name} is "
                           f"unreadable ({type(exc).__name__}: {exc})")
