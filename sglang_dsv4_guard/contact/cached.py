"""Whether the first-contact wrapper may answer decode's cached case itself.

SGLang's first statement answers it (``if bootstrap_addr in self.prefill_info_table:
return True``; what running it in the wrapper saves: docs/operating.md, First contact).
The wrapper may run it only where it is SGLang's own: the function being wrapped must be
a plain function (not another plug-in's wrapper, whose source ``inspect`` would unwrap to
SGLang's) whose first statement after its docstring has the digest a known release stores
for ``first_contact.cached`` (``host/pd_digests.json``, written by ``tools/pd_digests.py``).
Any other source keeps the plain wrapper.
"""

from __future__ import annotations

import ast
import inspect
import textwrap
import types
from collections.abc import Callable
from typing import Any

from sglang_dsv4_guard.host.pd_digests import SITES, Located, first_statement, known_releases

__all__ = ["CACHED_SITE", "answers_cached", "cached_digest"]

#: The digested site: SGLang's first statement of ``try_ensure_parallel_info``.
CACHED_SITE = SITES["first_contact.cached"]


def cached_digest(original: Callable[..., Any]) -> str | None:
    """The digest of ``original``'s first statement, read from its own code object's
    source (never unwrapped); ``None`` when it is not a plain function or its source
    cannot be read."""
    if type(original) is not types.FunctionType:
        return None
    code = original.__code__
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(code)))
    except (OSError, TypeError, SyntaxError, ValueError):
        return None
    fn = tree.body[0] if tree.body else None
    if not isinstance(fn, ast.FunctionDef) or fn.name != code.co_name:
        return None
    node = first_statement(fn)
    return None if node is None else Located(CACHED_SITE, node, (), (), (), code.co_filename).digest


def answers_cached(original: Callable[..., Any]) -> bool:
    """Whether ``original``'s first statement is the cached answer of a release the
    guard knows (then the wrapper runs that statement itself)."""
    digest = cached_digest(original)
    return digest is not None and any(
        stored.get(CACHED_SITE.key) == digest for stored in known_releases().values())
