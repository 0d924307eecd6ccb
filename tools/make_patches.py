"""Regenerate ``patches/sglang-<line>/``: the guard's fixes as a git series for SGLang.

The series is written against one released tree per release line (the unpacked wheel
or the installed package), in SGLang's upstream layout (``python/sglang/...``):

1. ``setup_state_kv_args`` raises every DSV4 target/draft mismatch in one error;
2. MORI warns once, when a decode peer registers, about a TP mismatch for ``swa``
   state (the per-request raise stays as it is);
3. the first failing check's values, and where the draft's mapping comes from.

The code and commit messages are in ``tools/patch_texts.py``. Each edit is a text
replacement on an anchor that must occur exactly once, so a release that moved the
code stops this tool instead of producing a wrong patch.
The commits get a fixed author and date so regenerating gives identical files.

Usage: ``python tools/make_patches.py --tree .matrix/0.5.16/site --release 0.5.16
[--covers 0.5.16,0.5.17,0.5.18,0.5.19,0.5.20,0.5.21 --context 1] [--out patches]``.
``--tree`` is the directory holding ``sglang/``. The result is checked by
``tests/test_patch_series.py`` and, applied with ``patch -p2``, by ``tests/patched_tree/``
(``make test``).
"""

from __future__ import annotations

import argparse
import functools
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

from patch_texts import (  # tools/ is not a package
    CALL_SITE,
    CHECKS_END,
    CHECKS_START,
    FAIL_NEW,
    FAIL_OLD,
    HELPER_HEAD,
    HELPER_TAIL,
    MAPPING_NEW,
    MAPPING_OLD,
    MESSAGE_1,
    MESSAGE_2,
    MESSAGE_3,
    MORI_ANCHOR,
    MORI_WARNING,
    PAGED_0523,
    PAGED_BEFORE_0523,
    RATIO_NEW,
    RATIO_OLD,
)

ROOT = Path(__file__).resolve().parent.parent
UTILS = "sglang/srt/disaggregation/utils.py"
MORI = "sglang/srt/disaggregation/mori/conn.py"
AUTHOR = "sglang-dsv4-guard <sglang-dsv4-guard@users.noreply.github.com>"
DATE = "2026-11-29T12:00:00+00:00"

def _replace_once(text: str, old: str, new: str, where: str) -> str:
    count = text.count(old)
    if count != 1:
        sys.exit(f"{where}: anchor found {count} times, expected once:\n{old}")
    return text.replace(old, new)


def _comment_before(block: str, code: str) -> str:
    """SGLang's comment lines right above the line starting with ``code``, kept verbatim
    so the check they explain carries them into the helper."""
    lines = block.splitlines(keepends=True)
    for index, line in enumerate(lines):
        if line.lstrip().startswith(code):
            start = index
            while start and lines[start - 1].lstrip().startswith("#"):
                start -= 1
            return "".join(lines[start:index])
    return ""


def patch_1(text: str, release: str) -> str:
    start, end = text.find(CHECKS_START), text.find(CHECKS_END)
    if start < 0 or end < start or text.count(CHECKS_START) != 1:
        sys.exit(f"{UTILS}: the DSV4 draft checks of {release} were not found")
    block = text[start:end + len(CHECKS_END)]
    if "must share the SWA index mapping" not in block:
        sys.exit(f"{UTILS}: unexpected DSV4 draft block in {release}")
    paged = PAGED_0523 if "request_window" in block else PAGED_BEFORE_0523
    paged = _comment_before(block, "request_window = ") + paged
    text = text[:start] + CALL_SITE + text[end + len(CHECKS_END):]
    helper = HELPER_HEAD + paged + HELPER_TAIL
    return _replace_once(text, "def setup_state_kv_args(", helper + "def setup_state_kv_args(",
                         UTILS)


def patch_2(text: str) -> str:
    return _replace_once(text, MORI_ANCHOR, MORI_ANCHOR + MORI_WARNING, MORI)


def patch_3(text: str) -> str:
    for old, new in ((FAIL_OLD, FAIL_NEW), (RATIO_OLD, RATIO_NEW), (MAPPING_OLD, MAPPING_NEW)):
        text = _replace_once(text, old, new, UTILS)
    return text


def _git(repo: Path, *args: str) -> str:
    name, email = AUTHOR[:-1].split(" <")
    env = dict(os.environ, GIT_AUTHOR_NAME=name, GIT_AUTHOR_EMAIL=email,
               GIT_COMMITTER_NAME=name, GIT_COMMITTER_EMAIL=email,
               GIT_AUTHOR_DATE=DATE, GIT_COMMITTER_DATE=DATE)
    done = subprocess.run(["git", "-c", "core.autocrlf=false", *args], cwd=repo, env=env,
                          check=True, capture_output=True, text=True)
    return done.stdout


def generate(tree: Path, release: str, covers: list[str], out: Path, context: int = 3) -> Path:
    """Write the series for ``tree`` (holding ``sglang/``) into ``out/sglang-<release>``.

    ``context`` is the diff's lines of context: 3 for one release; fewer for a series
    that must apply with ``git apply`` (no fuzz) to several releases whose code
    around the edits differs (the hunks still anchor on the unique lines they change).
    """
    target = out / f"sglang-{release}"
    with tempfile.TemporaryDirectory() as tmp:
        repo = Path(tmp)
        _git(repo, "init", "-q")
        for rel in (UTILS, MORI):
            dest = repo / "python" / rel
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(tree / rel, dest)
        _git(repo, "add", "-A")
        _git(repo, "commit", "-q", "-m", f"sglang {release} as released")
        steps: list[tuple[str, Callable[[str], str], str]] = [
            (UTILS, functools.partial(patch_1, release=release), MESSAGE_1),
            (MORI, patch_2, MESSAGE_2),
            (UTILS, patch_3, MESSAGE_3),
        ]
        for rel, edit, message in steps:
            path = repo / "python" / rel
            path.write_text(edit(path.read_text()))
            _git(repo, "commit", "-q", "-a", "-m", message)
        shutil.rmtree(target, ignore_errors=True)
        target.mkdir(parents=True)
        _git(repo, "format-patch", "-q", "--zero-commit", "--signature=sglang-dsv4-guard",
             f"-U{context}", "-o", str(target.resolve()), "HEAD~3")
    names = sorted(p.name for p in target.glob("*.patch"))
    (target / "series").write_text(
        f"# releases: {' '.join(covers)}\n"
        f"# generated from the sglang {release} wheel by tools/make_patches.py "
        f"(--context {context}); apply in this order\n" + "".join(f"{name}\n" for name in names))
    return target


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tree", required=True, type=Path, help="directory holding sglang/")
    parser.add_argument("--release", required=True, help="the release of --tree, e.g. 0.5.20")
    parser.add_argument("--covers", help="comma-separated releases this series is for "
                        "(default: --release alone)")
    parser.add_argument("--out", type=Path, default=ROOT / "patches")
    parser.add_argument("--context", type=int, default=3,
                        help="lines of diff context (1 for a series covering several releases)")
    args = parser.parse_args(argv)
    covers = [v.strip() for v in (args.covers or args.release).split(",") if v.strip()]
    print(generate(args.tree, args.release, covers, args.out, args.context))
    return 0


if __name__ == "__main__":
    sys.exit(main())
