"""The SGLang patch series shipped with the guard, and what an installed SGLang makes of it.

``patches/sglang-<line>/`` (in the wheel: ``sglang_dsv4_guard/patches/``) holds the
guard's fixes as ``git format-patch`` files for one line of SGLang releases, listed in
order in its ``series`` file, whose first line names the releases it is for::

    # releases: 0.5.16 0.5.17 0.5.18 0.5.19 0.5.20 0.5.21

:func:`check_series` says for each patch whether the installed SGLang already carries
it, would take it cleanly, or why not. It only reads: the files a patch touches are
copied into a temporary directory and GNU ``patch`` runs there, patch after patch, so a
later patch is judged on top of the earlier ones. Nothing is written into site-packages.
"""

from __future__ import annotations

import collections
import importlib.metadata
import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from sglang_dsv4_guard.host.judgement import imported_package_dir, judge_imported

__all__ = ["PatchStatus", "Series", "all_series", "apply_lines", "apply_series", "check_series",
           "patches_root", "series_for", "sglang_site", "status_report", "summary_line"]

# How each state reads in a sentence.
STATE_WORDS = {"carried": "already carried", "applies": "would apply",
               "conflicts": "would not apply", "unknown": "not checked"}
_RELEASES = re.compile(r"^#\s*releases:\s*(.+)$", re.MULTILINE)
_TARGET = re.compile(r"^\+\+\+ b/(\S+)", re.MULTILINE)
_SUBJECT = re.compile(r"^Subject: (?:\[PATCH[^\]]*\] )?(.+(?:\n .+)*)", re.MULTILINE)
STRIP = 2  # a/python/sglang/... -> sglang/... under site-packages


@dataclass(frozen=True)
class Series:
    """One ``patches/sglang-<line>/`` directory."""

    name: str
    directory: Path
    releases: tuple[str, ...]
    patches: tuple[Path, ...]


@dataclass(frozen=True)
class PatchStatus:
    """What the installed SGLang makes of one patch.

    ``state`` is ``"carried"`` (already applied), ``"applies"`` (would apply; ``reason``
    names any hunk that needed fuzz), ``"conflicts"`` (would not apply; ``reason`` quotes
    ``patch``) or ``"unknown"`` (could not be checked; ``reason`` says why).
    """

    patch: str
    subject: str
    state: str
    reason: str = ""


def patches_root() -> Path | None:
    """The directory of series: in the wheel, else the source checkout's ``patches/``."""
    here = Path(__file__).resolve().parent
    for candidate in (here.parent / "patches", here.parent.parent / "patches"):
        if any(candidate.glob("sglang-*/series")):
            return candidate
    return None


def _read_series(directory: Path) -> Series:
    text = (directory / "series").read_text()
    found = _RELEASES.search(text)
    releases = tuple(found.group(1).split()) if found else ()
    names = [line.strip() for line in text.splitlines()
             if line.strip() and not line.lstrip().startswith("#")]
    return Series(directory.name, directory, releases, tuple(directory / n for n in names))


def all_series(root: Path | None = None) -> list[Series]:
    """Every series under ``root`` (default :func:`patches_root`), by name."""
    root = root or patches_root()
    if root is None:
        return []
    return [_read_series(d) for d in sorted(root.glob("sglang-*")) if (d / "series").is_file()]


def series_for(version: str, root: Path | None = None) -> Series | None:
    """The series whose ``releases`` line names ``version``, or ``None``."""
    return next((s for s in all_series(root) if version in s.releases), None)


def sglang_site() -> Path | None:
    """The directory holding the importable ``sglang`` package (without importing it)."""
    package = imported_package_dir()
    return None if package is None else package.resolve().parent


def subject(patch: Path) -> str:
    """The patch's subject line, without ``[PATCH n/m]``."""
    found = _SUBJECT.search(patch.read_text())
    return " ".join(found.group(1).split()) if found else patch.name


def touched_files(patch: Path) -> list[str]:
    """The files ``patch`` changes, relative to site-packages (``sglang/...``)."""
    return [p.split("/", STRIP - 1)[-1] for p in _TARGET.findall(patch.read_text())]


def _needs_gnu_patch() -> str:
    """Empty when ``patch`` is GNU patch, else why the series cannot be checked.

    BSD and busybox ``patch`` reject GNU options such as ``--no-backup-if-mismatch``;
    with them every patch would wrongly read as "would not apply".
    """
    found = shutil.which("patch")
    if found is None:
        return "needs GNU patch; no patch on PATH"
    try:
        done = subprocess.run([found, "--version"], capture_output=True, text=True,
                              check=False, timeout=30)
    except (OSError, subprocess.SubprocessError) as error:
        return f"needs GNU patch; {found} --version failed: {error}"
    first = (done.stdout + done.stderr).strip().splitlines()[:1]
    if done.returncode == 0 and first and "GNU patch" in first[0]:
        return ""
    return f"needs GNU patch; {found} is {first[0] if first else 'not GNU patch'!r}"


def _patch(cwd: Path, patch: Path, *flags: str) -> tuple[bool, str]:
    done = subprocess.run(["patch", f"-p{STRIP}", "--batch", "--forward", "--no-backup-if-mismatch",
                           "-r", "-", "-i", str(patch.resolve()), *flags], cwd=cwd,
                          capture_output=True, text=True, check=False)
    return done.returncode == 0, (done.stdout + done.stderr).strip()


def _reason(output: str) -> str:
    lines = [line for line in output.splitlines() if "FAILED" in line or "can't find" in line
             or "No file to patch" in line or "Reversed" in line]
    return "; ".join(lines[:3]) or (output.splitlines() or ["patch failed"])[0]


def _copy_touched(series: Series, site: Path, work: Path) -> list[Path]:
    """Copy every file the series touches from ``site`` into ``work``; the copies."""
    copies = []
    for rel in sorted({f for p in series.patches for f in touched_files(p)}):
        source, copy = site / rel, work / rel
        if source.is_file():
            copy.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(source, copy)
            copies.append(copy)
    return copies


def _carried(series: Series, work: Path) -> set[str]:
    """The patches the files in ``work`` already carry.

    Walked from the last patch back, each carried one is taken out again, so an earlier
    patch is judged on the text it produced, not on what later patches made of it.
    """
    carried = set()
    for patch in reversed(series.patches):
        if _patch(work, patch, "--dry-run", "--reverse")[0]:
            _patch(work, patch, "--reverse")
            carried.add(patch.name)
    return carried


def check_series(series: Series, site: Path) -> list[PatchStatus]:
    """Each patch of ``series`` judged against the ``sglang`` package under ``site``."""
    missing = _needs_gnu_patch()
    if missing:
        return [PatchStatus(p.name, subject(p), "unknown", missing) for p in series.patches]
    statuses: list[PatchStatus] = []
    with tempfile.TemporaryDirectory(prefix="sglang-dsv4-guard-patches-") as tmp:
        work = Path(tmp)
        _copy_touched(series, site, work)
        carried = _carried(series, work)
        copies = _copy_touched(series, site, work)  # the installed text again
        for patch in series.patches:
            if patch.name in carried:
                statuses.append(PatchStatus(patch.name, subject(patch), "carried"))
                continue
            before = {copy: copy.read_bytes() for copy in copies}
            applied, output = _patch(work, patch)
            if applied:
                fuzz = [line for line in output.splitlines() if "fuzz" in line]
                statuses.append(PatchStatus(patch.name, subject(patch), "applies",
                                            "; ".join(fuzz)))
                continue
            for copy, content in before.items():  # undo any hunk that did apply
                copy.write_bytes(content)
            needs = [s.patch for s in statuses if s.state in ("conflicts", "unknown")
                     and _builds_on(patch, series.directory / s.patch)]
            reason = f"needs {', '.join(needs)}" if needs else _reason(output)
            statuses.append(PatchStatus(patch.name, subject(patch), "conflicts", reason))
    return statuses


def apply_series(series: Series, work: Path) -> None:
    """Apply ``series`` to the ``sglang`` tree under ``work``, in place; ``RuntimeError``
    naming the patch that does not apply."""
    missing = _needs_gnu_patch()
    if missing:
        raise RuntimeError(f"cannot apply {series.name}: {missing}")
    for patch in series.patches:
        applied, output = _patch(work, patch)
        if not applied:
            raise RuntimeError(f"{series.name}/{patch.name} does not apply to {work}: "
                               f"{_reason(output)}")


def _hunk_lines(patch: Path) -> dict[str, tuple[set[str], set[str]]]:
    """Per touched file: the lines the patch adds, and the lines it expects to find."""
    lines: dict[str, tuple[set[str], set[str]]] = {}
    current: tuple[set[str], set[str]] = (set(), set())
    for line in patch.read_text().splitlines():
        if line.startswith("+++ b/"):
            current = lines.setdefault(line[6:], (set(), set()))
        elif line.startswith(("---", "+++", "@@")) or len(line.strip()) < 12:
            continue
        elif line.startswith("+"):
            current[0].add(line[1:])
        elif line.startswith((" ", "-")):
            current[1].add(line[1:])
    return lines


def _builds_on(later: Path, earlier: Path) -> bool:
    """Whether ``later`` expects lines that only ``earlier`` adds (in the same file)."""
    earlier_lines = _hunk_lines(earlier)
    return any(expects & earlier_lines[path][0] for path, (_, expects)
               in _hunk_lines(later).items() if path in earlier_lines)


def apply_lines(series: Series, site: Path, statuses: list[PatchStatus]) -> list[str]:
    """How to apply the patches ``statuses`` says are not carried yet, in order."""
    needed = [series.directory / s.patch for s in statuses if s.state != "carried"]
    if not needed:
        return ["every patch is carried; nothing to apply"]
    return ["to apply what is not carried yet, in this order:",
            *(f"  patch -p{STRIP} --forward -d {site} -i {p}" for p in needed),
            f"in an SGLang checkout: git am --keep-non-patch {' '.join(map(str, needed))}",
            "(README, section 'Patches for SGLang')"]


_TREE_VERSION = re.compile(r"^__version__\s*=\s*(?:version\s*=\s*)?['\"]([^'\"]+)['\"]",
                           re.MULTILINE)


def tree_version(site: Path) -> str | None:
    """The release of the ``sglang`` tree under ``site``, read from that tree itself.

    Its ``_version.py`` / ``version.py``, else a ``sglang-*.dist-info`` next to it;
    never the first SGLang metadata on ``sys.path``, which may belong to another tree.
    """
    for name in ("_version.py", "version.py"):
        source = site / "sglang" / name
        found = _TREE_VERSION.search(source.read_text()) if source.is_file() else None
        if found:
            return found.group(1)
    for dist in importlib.metadata.distributions(path=[str(site)]):
        if (dist.metadata["Name"] or "").lower() == "sglang":
            return str(dist.version)
    return None


def _installed() -> tuple[str | None, Path | None, str]:
    """The release whose series applies to the importable tree, its site, and a note
    when the labels and the code disagree. Judged by the code (:mod:`.judgement`), as
    ``install()`` judges it, so a new release with known checks gets its twin's series;
    code matching no known release falls back to the tree's own label."""
    site = sglang_site()
    host = judge_imported()
    if host.behaves_as is not None:
        return str(host.behaves_as), site, (f"note: {host.message}" if host.message else "")
    labelled = host.metadata
    version = tree_version(site) if site is not None else None
    if version is None:
        return (str(labelled) if labelled is not None else None), site, ""
    note = ""
    if labelled is not None and str(labelled) != version:
        note = (f"note: the SGLang tree imported from {site} is {version}, but the first "
                f"SGLang metadata on sys.path says {labelled}; judging the tree ({version})")
    return version, site, note


def status_report() -> tuple[list[str], bool]:
    """The lines ``sglang-dsv4-guard patches`` prints, and whether all is well."""
    version, site, note = _installed()
    if version is None or site is None:
        return ["patches: SGLang is not installed; nothing to check"], False
    series = series_for(version)
    if series is None:
        known = ", ".join(f"{s.name} ({' '.join(s.releases)})" for s in all_series()) or "none"
        return [f"patches: no series for SGLang {version}; shipped: {known}"], False
    lines = [f"SGLang {version} at {site / 'sglang'}", *([note] if note else []),
             f"series {series.name} (for {', '.join(series.releases)}): {series.directory}"]
    statuses = check_series(series, site)
    for status in statuses:
        lines.append(f"  {status.patch}: {STATE_WORDS[status.state]}"
                     + (f" ({status.reason})" if status.reason else ""))
        lines.append(f"      {status.subject}")
    lines.extend(apply_lines(series, site, statuses))
    return lines, all(s.state in ("applies", "carried") for s in statuses)


def summary_line() -> str:
    """One line for ``doctor``: the series for the installed release and its state."""
    version, site, note = _installed()
    if version is None or site is None:
        return "patches: SGLang is not installed"
    series = series_for(version)
    if series is None:
        return f"patches: no series shipped for SGLang {version}"
    statuses = check_series(series, site)
    counts = collections.Counter(status.state for status in statuses)
    shown = ", ".join(f"{n} {STATE_WORDS[state]}" for state, n in counts.items())
    return (f"patches: series {series.name}, {len(statuses)} patches: {shown} "
            "(sglang-dsv4-guard patches)" + (f"; {note}" if note else ""))
