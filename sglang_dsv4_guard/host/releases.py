"""What each supported SGLang release does, as data.

The guard predicts SGLang's verdict from a snapshot of the pools. The checks differ
between releases, so the differences live here, in one place, keyed by release:

- ``npu_gate``: 0.5.16 and 0.5.17 skip the DSV4 draft block on NPU (``not is_npu()``).
- ``paged_geometry``: the fields of the paged-mode geometry tuple and the message
  prefix. 0.5.23 adds the request-window capacity (target) / SWA ring size (draft).
- ``mapping_always_set``: from 0.5.22 ``__init__`` sets ``full_to_swa_index_mapping``
  to ``None``; before, a never-registered pool has no such attribute and SGLang's
  identity test raises ``AttributeError``.

``MoriKVManager._send_swa_dsa_state`` takes 8 parameters up to 0.5.21 and 11 from
0.5.22; the MORI wrapper binds arguments by name from the installed signature, so
that difference needs no entry here.
"""

from __future__ import annotations

from dataclasses import dataclass

from packaging.version import Version

__all__ = [
    "SUPPORTED_MAX",
    "SUPPORTED_MIN",
    "HostProfile",
    "is_supported",
    "profile_for",
]

SUPPORTED_MIN = Version("0.5.16")
SUPPORTED_MAX = Version("0.5.23")


@dataclass(frozen=True)
class GeometryField:
    """One element of a geometry tuple: the pool attribute read on each side."""

    name: str
    target_attr: str
    draft_attr: str
    source: str


@dataclass(frozen=True)
class HostProfile:
    """The behaviour of one SGLang release's ``setup_state_kv_args`` and MORI path."""

    version: Version
    npu_gate: bool
    paged_geometry: tuple[GeometryField, ...]
    paged_geometry_prefix: str
    mapping_always_set: bool
    # How reports name the host when it is not simply ``version`` (a new release, or a
    # label on other code: "code matching 0.5.17 (labelled 0.5.23)"); empty: ``version``.
    label: str = ""

    @property
    def name(self) -> str:
        """The release as reports name it."""
        return self.label or str(self.version)


_PAGE = GeometryField("page_size", "page_size", "page_size", "server flag --page-size")
_WINDOW = GeometryField("sliding_window", "sliding_window", "sliding_window",
                        "model config sliding_window (ModelConfig.window_size)")
_REQUEST_ROWS = GeometryField("request rows", "request_window.capacity", "swa_req_ring_size",
                              "sliding_window + --speculative-num-draft-tokens under "
                              "--enable-encoder-swa-bounded-replay (target request window / "
                              "draft SWA ring)")


def profile_for(version: Version) -> HostProfile:
    """The profile of ``version``. Callers check :func:`is_supported` first."""
    if version >= Version("0.5.23"):
        geometry: tuple[GeometryField, ...] = (_PAGE, _WINDOW, _REQUEST_ROWS)
        prefix = "DSV4 target and draft pools must share SWA geometry: "
    else:
        geometry = (_PAGE, _WINDOW)
        prefix = "DSV4 target and draft pools must share paged SWA geometry: "
    return HostProfile(
        version=version,
        npu_gate=version < Version("0.5.18"),
        paged_geometry=geometry,
        paged_geometry_prefix=prefix,
        mapping_always_set=version >= Version("0.5.22"),
    )


def is_supported(version: Version) -> bool:
    """Whether the guard knows ``version``'s checks (0.5.16 to 0.5.23 inclusive)."""
    return SUPPORTED_MIN <= Version(version.base_version) <= SUPPORTED_MAX

