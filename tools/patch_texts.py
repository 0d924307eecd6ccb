"""The text of the SGLang patch series: the code each patch adds and its commit message.

Kept apart from ``tools/make_patches.py``, which applies these edits to a released tree
and writes the series. Every line of code here is ours; SGLang's own lines appear only
as the anchors (``*_START``, ``*_END``, ``*_ANCHOR``, ``*_OLD``) the edits are placed by.
"""

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
        fields = [f"shape={tuple(getattr(mapping, 'shape', ()))}"]
        for name in ("dtype", "device"):
            if hasattr(mapping, name):
                fields.append(f"{name}={getattr(mapping, name)}")
        return f"{type(mapping).__name__}({', '.join(fields)})"

    def relation(self, target, draft) -> str:
        """How two different mapping tensors relate, without memory addresses."""
        try:
            same = target.untyped_storage().data_ptr() == draft.untyped_storage().data_ptr()
        except (AttributeError, TypeError, RuntimeError):
            return ""
        if same:
            return "; the draft's is a view of the target's storage, not the tensor itself"
        return "; the draft's is a separate tensor (a copy or its own mapping)"

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
                    f"draft={check.describe(mappings[1])}"
                    + check.relation(*mappings),
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
  with one failing check, that first line is unchanged;
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
                    f"draft={check.describe(mappings[1])}"
                    + check.relation(*mappings),
                )
'''
MAPPING_NEW = '''\
                    f"target={check.describe(mappings[0])}, "
                    f"draft={check.describe(mappings[1])}"
                    + check.relation(*mappings)
                    + "; the draft must hold the very tensor the target's "
                    "SWATokenToKVPoolAllocator registered, which it gets when the "
                    "draft worker is handed that allocator",
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
side's mapping (None, never registered, or a tensor with its shape, dtype
and device, and whether the draft's is a view of the target's storage or a
separate tensor) and the
place the shared one is registered lets an operator tell them apart without
a debugger.

What stays the same: the first line, the verdict and kv_args. Kept apart from
the first patch so that reviewers who want a single failure to keep exactly
the old message can take that one alone.
"""
