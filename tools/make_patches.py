"""Regenerate ``patches/sglang-<line>/``: the guard's fixes as a git series for SGLang.

The series is written against one released tree per release line (the unpacked wheel
or the installed package), in SGLang's upstream layout (``python/sglang/...``):

1. ``setup_state_kv_args`` raises every DSV4 target/draft mismatch in one error;
2. MORI warns once, when a decode peer registers, about a TP mismatch for ``swa``
   state (the per-request raise stays as it is);
3. the first failing check's values, and where the draft's mapping comes from.

Each edit is a text replacement on an anchor that must occur exactly once, so a
release that moved the code stops this tool instead of producing a wrong patch.
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

ROOT = Path(__file__).resolve().parent.parent
UTILS = "sglang/srt/disaggregation/utils.py"
MORI = "sglang/srt/disaggregation/mori/conn.py"
AUTHOR = "sglang-dsv4-guard <sglang-dsv4-guard@users.noreply.github.com>"
DATE = "2026-11-29T12:00:00+00:00"

# --- patch 1: every DSV4 target/draft mismatch in one error --------------------------

HELPER_HEAD = '''\
class _DSV4DraftChecks:
    """Collects the reasons a DeepSeek-V4 target/draft pool pair is rejected.

    The first failure keeps the exact message its check has always raised, so
    code matching that message sees no change. Every further failure adds one
    line, "also: <check>: <both pools' values>". Until the first failure the
    pools are read in the original order and without defaults, so a pool that
    lacks an attribute raises the same AttributeError as before; after it, a
    missing attribute is reported as a line instead of hiding the error found.
    """

    MISSING = object()

    def __init__(self, target, draft) -> None:
        self.pools = {"target": target, "draft": draft}
        self.lines: list[str] = []

    def read(self, role: str, name: str, owner=None, quiet: bool = False):
        owner = self.pools[role] if owner is None else owner
        attr = name.rpartition(".")[2]
        if not self.lines:
            return getattr(owner, attr)
        value = getattr(owner, attr, self.MISSING)
        if value is self.MISSING and not quiet:
            self.lines.append(f"also: the DSV4 {role} pool has no attribute {name!r}")
        return value

    def incomplete(self, *values) -> bool:
        return any(value is self.MISSING for value in values)

    def describe(self, mapping) -> str:
        if mapping is self.MISSING:
            return "never registered"
        if mapping is None:
            return "None"
        shape = tuple(getattr(mapping, "shape", ()))
        return f"{type(mapping).__name__}(shape={shape}) at {id(mapping):#x}"

    def fail(self, message: str, values: str = "") -> None:
        if not self.lines:
            self.lines.append(message)
        elif values:
            self.lines.append(f"also: {message}: {values}")
        else:
            self.lines.append(f"also: {message}")


def _dsv4_draft_mismatches(target, draft) -> list[str]:
    """Every reason setup_state_kv_args rejects this DSV4 target/draft pair.

    Empty when the pair is accepted. The checks and their order are those of
    the DSV4 block in setup_state_kv_args; the first entry is the message the
    first failing check raises on its own.
    """
    check = _DSV4DraftChecks(target, draft)
    try:
        ratios = check.read("draft", "compression_ratios")
        if not ratios or not all(ratio == 0 for ratio in ratios):
            check.fail("DSV4 draft state transfer expects SWA-only NextN layers")
        modes = (
            check.read("target", "_unified_kv"),
            check.read("draft", "_unified_kv"),
        )
        if check.incomplete(*modes):
            return check.lines
        if modes[0] != modes[1]:
            check.fail(
                "DSV4 target and draft pools must use the same unified-KV mode",
                f"target _unified_kv={modes[0]}, draft _unified_kv={modes[1]}",
            )
            # Geometry of two different modes cannot be compared.
            return check.lines
        if modes[0]:
            names = ("unified_swa_window", "unified_swa_ring_size", "unified_swa_pages")
            target_geometry = tuple(check.read("target", name) for name in names)
            draft_geometry = tuple(check.read("draft", name) for name in names)
            prefix = "DSV4 target and draft pools must share SWA ring geometry: "
        else:
            mappings = (
                check.read("target", "full_to_swa_index_mapping", quiet=True),
                check.read("draft", "full_to_swa_index_mapping", quiet=True),
            )
            if mappings[0] is not mappings[1] or check.incomplete(*mappings):
                check.fail(
                    "DSV4 target and draft pools must share the SWA index mapping",
                    f"target={check.describe(mappings[0])}, "
                    f"draft={check.describe(mappings[1])}",
                )
'''

PAGED_BEFORE_0523 = '''\
            target_geometry = (
                check.read("target", "page_size"),
                check.read("target", "sliding_window"),
            )
            draft_geometry = (
                check.read("draft", "page_size"),
                check.read("draft", "sliding_window"),
            )
            prefix = "DSV4 target and draft pools must share paged SWA geometry: "
'''

PAGED_0523 = '''\
            # Read in the order the single-error check read them.
            window = check.read("target", "request_window")
            page_size = check.read("target", "page_size")
            sliding_window = check.read("target", "sliding_window")
            capacity = window
            if window is not None and window is not check.MISSING:
                capacity = check.read("target", "request_window.capacity", window)
            target_geometry = (page_size, sliding_window, capacity)
            draft_geometry = (
                check.read("draft", "page_size"),
                check.read("draft", "sliding_window"),
                check.read("draft", "swa_req_ring_size"),
            )
            prefix = "DSV4 target and draft pools must share SWA geometry: "
'''

HELPER_TAIL = '''\
        if target_geometry != draft_geometry and not check.incomplete(
            *target_geometry, *draft_geometry
        ):
            check.fail(f"{prefix}target={target_geometry}, draft={draft_geometry}")
    except Exception as error:
        if not check.lines:
            raise  # the single-error check raised this too, at the same read
        check.lines.append(f"also: further DSV4 checks stopped: {error!r}")
    return check.lines


'''

CALL_SITE = '''\
        # Report every target/draft mismatch at once instead of one per launch.
        mismatches = _dsv4_draft_mismatches(token_to_kv_pool, draft_token_to_kv_pool)
        if mismatches:
            raise RuntimeError("\\n".join(mismatches))

        if token_to_kv_pool._unified_kv:
            draft_ptrs, draft_lens, draft_item_lens = (
                draft_token_to_kv_pool.get_unified_swa_ring_buf_infos()
            )
            draft_state_type = StateType.SWA_RING
        else:
            draft_ptrs, draft_lens, draft_item_lens = (
                draft_token_to_kv_pool.get_state_buf_infos()
            )
            draft_state_type = StateType.SWA
'''

CHECKS_START = "        if not draft_token_to_kv_pool.compression_ratios or not all(\n"
CHECKS_END = "            draft_state_type = StateType.SWA\n"

MESSAGE_1 = """\
[DSV4] setup_state_kv_args: report every target/draft mismatch at once

What: the DeepSeek-V4 target/draft block of setup_state_kv_args runs all of
its checks (SWA-only NextN draft, unified-KV mode, SWA ring geometry, SWA
index mapping, paged SWA geometry) and raises one RuntimeError listing every
failing check, instead of stopping at the first.

Why: each check names one problem, so a deployment with three mismatches
needs three relaunches of a many-GPU prefill/decode pair to find them all.

What stays the same:
- the first line of the error is exactly the message the first failing check
  raised before, so existing `except` clauses, tests and alerts still match;
  a pair failing one check gets exactly the old message;
- each further line starts with "also: " and names one more failing check
  with both pools' values;
- the checks, their order and their verdict are unchanged: a pair that was
  accepted is accepted with the same kv_args, and a pair that was rejected is
  rejected;
- until the first failure the pools are read in the old order without
  defaults, so a pool lacking an attribute (a mapping never registered before
  0.5.22) raises the same AttributeError as before.
"""

# --- patch 2: MORI warns when a decode peer with another TP registers -----------------

MORI_ANCHOR = "        self.decode_kv_args_table[engine_key] = register_info\n"
MORI_WARNING = '''\
        # _send_swa_dsa_state rejects the "swa" state of a non-MLA model when the
        # decode peer's TP size differs, request by request. Say it once, now. Only
        # a warning: other transfers to this peer work, and that check is unchanged.
        if (
            self.disaggregation_mode == DisaggregationMode.PREFILL
            and not self.is_mla_backend
            and register_info.decode_tp_size != self.attn_tp_size
            and "swa" in (getattr(self.kv_args, "state_types", None) or ())
        ):
            logger.warning(
                "Decode peer %s registered with decode_tp_size=%s, but this prefill "
                "server's attention TP size is %s. MORI cannot send the 'swa' state of "
                "a non-MLA model across different TP sizes, so every request to this "
                "peer will fail with 'PD state transfer does not support TP-mismatched "
                "non-MLA SWA models'. Fix: launch the decode server with attention TP "
                "size %s, or the prefill server with %s.",
                engine_key,
                register_info.decode_tp_size,
                self.attn_tp_size,
                self.attn_tp_size,
                register_info.decode_tp_size,
            )
'''

MESSAGE_2 = """\
[PD][MORI] warn at peer registration about a TP mismatch for SWA state

What: when a decode peer registers with the prefill server (_add_remote_peer)
and its TP size differs from this server's attention TP size, while this
manager is not MLA and carries an "swa" state component, log one WARNING for
that peer with both sizes and the fix.

Why: _send_swa_dsa_state cannot slice the "swa" state of a non-MLA model
across TP sizes and raises for every request, in the transfer worker, one
traceback per failed request. The peer's TP size is known when it registers,
long before the first request; saying it there, once, points the operator at
the cause instead of at a stream of identical failures.

What stays the same:
- nothing is rejected: the per-request check in _send_swa_dsa_state and its
  message are unchanged, and no start-up check is added (different prefill and
  decode TP sizes are supported for KV and other state; a start-up rejection,
  PR #15675, was declined for that reason);
- MLA models, managers without "swa" state, matching TP sizes and decode-side
  managers log nothing new;
- a peer that registers again is skipped as before, so the warning comes once
  per peer.
"""

# --- patch 3: the first failure's values, and where the mapping comes from -------------

FAIL_OLD = '''\
        if not self.lines:
            self.lines.append(message)
        elif values:
'''
FAIL_NEW = '''\
        if not self.lines:
            self.lines.append(message)
            if values:
                self.lines.append(f"  {values}")
        elif values:
'''
RATIO_OLD = '''\
            check.fail("DSV4 draft state transfer expects SWA-only NextN layers")
'''
RATIO_NEW = '''\
            check.fail(
                "DSV4 draft state transfer expects SWA-only NextN layers",
                f"draft compression_ratios={ratios!r} (NextN layers have ratio 0)",
            )
'''
MAPPING_OLD = '''\
                    f"target={check.describe(mappings[0])}, "
                    f"draft={check.describe(mappings[1])}",
                )
'''
MAPPING_NEW = '''\
                    f"target={check.describe(mappings[0])}, "
                    f"draft={check.describe(mappings[1])}; the draft must hold "
                    "the very tensor the target's SWATokenToKVPoolAllocator "
                    "registered, which it gets when the draft worker is handed "
                    "that allocator",
                )
'''

MESSAGE_3 = """\
[DSV4] setup_state_kv_args: show the first failing check's values

What: after the unchanged first line, the DSV4 target/draft error gets one
indented line with the values behind it, for the checks whose message carries
none: the draft's compression ratios, both unified-KV modes, both SWA index
mappings. The mapping line also says where the shared mapping comes from.

Why: "DSV4 target and draft pools must share the SWA index mapping" is an
identity test that says neither which side is wrong nor where the shared
tensor should come from. The causes are few: a draft worker that built its
own SWA allocator instead of being handed the target's, a copy or view of
the target's tensor, or a mapping registered on one side only. Naming each
side's mapping (None, never registered, or a tensor with its shape) and the
place the shared one is registered lets an operator tell them apart without
a debugger.

What stays the same: the first line, the verdict and kv_args. Kept apart from
the first patch so that reviewers who want a single failure to keep exactly
the old message can take that one alone.
"""


def _replace_once(text: str, old: str, new: str, where: str) -> str:
    count = text.count(old)
    if count != 1:
        sys.exit(f"{where}: anchor found {count} times, expected once:\n{old}")
    return text.replace(old, new)


def patch_1(text: str, release: str) -> str:
    start, end = text.find(CHECKS_START), text.find(CHECKS_END)
    if start < 0 or end < start or text.count(CHECKS_START) != 1:
        sys.exit(f"{UTILS}: the DSV4 draft checks of {release} were not found")
    block = text[start:end + len(CHECKS_END)]
    if "must share the SWA index mapping" not in block:
        sys.exit(f"{UTILS}: unexpected DSV4 draft block in {release}")
    paged = PAGED_0523 if "request_window" in block else PAGED_BEFORE_0523
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
