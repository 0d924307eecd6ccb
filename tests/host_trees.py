"""Build a disguised copy of the imported ``sglang`` package for host-judgement tests.

The copy is a farm of symbolic links to the real files, except the files a test
replaces (a bumped ``_version.py``, a changed check); ``__pycache__`` directories are
never linked, so nothing compiled from a changed file lands in the real package.
"""

from __future__ import annotations

from pathlib import Path

from sglang.test.ci.ci_register import register_cpu_ci

from sglang_dsv4_guard.host.judgement import imported_package_dir

# SGLang's run_suite.py collects every *.py next to the tests and requires a registry in
# each; a disabled one marks a helper module (listed as skipped, never run).
register_cpu_ci(est_time=1, suite="stage-a-test-cpu",
                disabled="helper module of the sglang-dsv4-guard tests, not a test")


def real_package() -> Path:
    """The ``sglang`` package directory this process imports."""
    package = imported_package_dir()
    assert package is not None, "SGLang is not installed"
    return package.resolve()


def _farm(source: Path, target: Path, replacements: dict[str, str | bytes]) -> None:
    target.mkdir(parents=True)
    for child in source.iterdir():
        if child.name == "__pycache__":
            continue
        inside = {rel.split("/", 1)[1]: text for rel, text in replacements.items()
                  if "/" in rel and rel.split("/", 1)[0] == child.name}
        if inside:
            _farm(child, target / child.name, inside)
        elif child.name not in replacements:
            (target / child.name).symlink_to(child)
    for rel, text in replacements.items():
        if "/" not in rel and isinstance(text, bytes):
            (target / rel).write_bytes(text)
        elif "/" not in rel:
            (target / rel).write_text(text)


def disguised_tree(root: Path, version: str | None = None, metadata: str | None = None,
                   edits: dict[str, tuple[str, str]] | None = None,
                   files: dict[str, bytes] | None = None) -> Path:
    """``root/sglang``: the imported package, its ``_version.py`` saying ``version`` (if
    given), each ``edits[relative path] = (old, new)`` applied (``old`` must occur), each
    ``files[relative path]`` written as those bytes, and
    ``root/sglang-<metadata>.dist-info`` when ``metadata`` is given. Returns ``root``."""
    package = real_package()
    replacements: dict[str, str | bytes] = dict(files or {})
    if version is not None:
        replacements["_version.py"] = f"__version__ = version = {version!r}\n"
    for rel, (old, new) in (edits or {}).items():
        text = (package / rel).read_text()
        assert old in text, f"{rel} of this release has no {old!r}: the edit would not change it"
        replacements[rel] = text.replace(old, new)
    _farm(package, root / "sglang", replacements)
    if metadata is not None:
        info = root / f"sglang-{metadata}.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: sglang\nVersion: {metadata}\n")
    return root
