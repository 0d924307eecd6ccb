"""Patching SGLang: targets as data, resolved where defined, restored by identity.

- A :class:`PatchTarget` is a module name and a qualified name inside it; every target
  is declared in :mod:`sglang_dsv4_guard.host.targets`.
- :func:`apply` resolves the attribute on the object that defines it (walking a
  class's MRO), replaces it with a wrapper, and rebinds every stale
  ``from module import name`` binding in ``sys.modules``. A ``classmethod`` or
  ``staticmethod`` is wrapped as its function and the wrapper put in as the same kind;
  another plug-in's proxy of one is called bound, so its wrapper still runs.
- :func:`restore` puts the original back only where our wrapper still stands, in
  the owner and in every module that holds the wrapper (bindings made after
  install included), and reports what someone else patched on top of us.
- :class:`PostImportHooks` runs a callback right after a module is imported, so a
  target is patched lazily, the moment SGLang imports it, and never imported by us.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.abc
import importlib.machinery
import importlib.util
import logging
import sys
import threading
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

from sglang_dsv4_guard.errors import DSV4GuardInstallError
from sglang_dsv4_guard.host.targets import PatchTarget
from sglang_dsv4_guard.log import LOGGER_NAME

__all__ = ["AppliedPatch", "PatchTarget", "PostImportHooks", "apply", "apply_all", "is_ours",
           "restore"]

logger = logging.getLogger(LOGGER_NAME)

WRAPPER_MARK = "__sglang_dsv4_guard_original__"

# Our wrappers whose patch is applied and not yet restored. Only these count as ours
# (the one rule, used by the hook registry's chain walk too): WRAPPER_MARK alone cannot
# tell, because functools.wraps (SGLang's _wrap_fn included) copies it onto another
# plug-in's wrapper of ours.
_LIVE: weakref.WeakSet[Callable[..., Any]] = weakref.WeakSet()


_DESCRIPTORS = (classmethod, staticmethod)


def _function(value: object) -> object:
    """The function a class attribute calls: a ``classmethod``'s or ``staticmethod``'s own
    (those exact types), else the value itself."""
    return value.__func__ if type(value) in _DESCRIPTORS else value  # type: ignore[attr-defined]


def _binding(value: object) -> type | None:
    """``classmethod`` or ``staticmethod`` when ``value`` binds as one: the descriptor
    itself or another plug-in's proxy of it (wrapt's answers ``isinstance`` as the object
    it wraps); ``None`` for anything else."""
    return next((kind for kind in _DESCRIPTORS if isinstance(value, kind)), None)


def _wrappable(value: object) -> bool:
    return callable(value) if _binding(value) is None else callable(
        getattr(value, "__func__", None))


def _called(owner: Any, original: Any) -> Callable[..., Any]:
    """What the wrapper calls in place of ``original`` (a classmethod or staticmethod,
    or another plug-in's proxy of one): the descriptor's own function, or for a proxy, the
    proxy bound at call time, so that the other plug-in's wrapper still runs."""
    kind = _binding(original)
    if kind is None or type(original) is kind:
        return _function(original)  # type: ignore[return-value]
    def function(*args: Any, **kwargs: Any) -> Any:
        if kind is classmethod:  # the class it is called on comes first
            return original.__get__(None, args[0])(*args[1:], **kwargs)
        return original.__get__(None, owner)(*args, **kwargs)

    with contextlib.suppress(Exception):  # its name and doc, where the proxy gives them
        functools.update_wrapper(function, original.__func__)
    return function


def is_ours(fn: object) -> bool:
    """Whether ``fn`` (or the classmethod holding it) is a wrapper of ours that is applied
    and not yet restored."""
    try:
        return _function(fn) in _LIVE
    except TypeError:  # unhashable or not weak-referenceable: not one of our functions
        return False


@dataclass
class AppliedPatch:
    """One applied patch and every place it was bound (``original`` and ``wrapper`` as
    they stand in the owner: for a classmethod, the ``classmethod`` objects)."""

    target: PatchTarget
    owner: Any
    attr: str
    original: Callable[..., Any]
    wrapper: Callable[..., Any]
    rebound: list[str] = field(default_factory=list)


def resolve(target: PatchTarget, module: ModuleType) -> tuple[Any, str, Callable[..., Any]]:
    """The object that defines the target, the attribute name and the current value."""
    *path, attr = target.qualname.split(".")
    obj: Any = module
    for part in path:
        obj = getattr(obj, part, None)
        if obj is None:
            raise DSV4GuardInstallError(f"{target.module} has no {'.'.join(path)}", str(target))
    owners = obj.__mro__ if isinstance(obj, type) else (obj,)
    for owner in owners:
        namespace = vars(owner)
        if attr not in namespace:
            continue
        if _wrappable(namespace[attr]):
            return owner, attr, namespace[attr]
        raise DSV4GuardInstallError(
            f"{target} is not a function, classmethod or staticmethod in the installed SGLang "
            f"(found {type(namespace[attr]).__name__})", str(target))
    raise DSV4GuardInstallError(f"{target} does not exist in the installed SGLang", str(target))


def _namespace(module: object) -> dict[str, Any] | None:
    """``module.__dict__`` read without running any of the module's code, or ``None``.

    Only real module objects are scanned. ``type()`` and ``object.__getattribute__``
    bypass the module's own attribute hooks, so a module still waiting for
    :class:`importlib.util.LazyLoader` is read as it stands and never forced to load
    (it cannot hold a binding before it has run).
    """
    if not issubclass(type(module), ModuleType):
        return None
    try:
        namespace = object.__getattribute__(module, "__dict__")
    except Exception as exc:  # an exotic module type: nothing of ours can be bound there
        logger.debug("sglang-dsv4-guard skipped sys.modules entry %r: %s", type(module), exc)
        return None
    return namespace if isinstance(namespace, dict) else None


def _modules_holding(value: object) -> list[tuple[str, dict[str, Any], str]]:
    """(``sys.modules`` key, namespace, name) of every module binding ``value`` to a name."""
    found = []
    for key, module in list(sys.modules.items()):
        namespace = _namespace(module)
        if namespace is None:
            continue
        for name, held in list(namespace.items()):
            if held is value:
                found.append((key, namespace, name))
    return found


def apply(target: PatchTarget, module: ModuleType,
          make_wrapper: Callable[[Callable[..., Any]], Callable[..., Any]]) -> AppliedPatch:
    """Wrap ``target`` in ``module``; for a module-level function, rebind stale imports too."""
    owner, attr, original = resolve(target, module)
    if is_ours(original):
        raise DSV4GuardInstallError(f"{target} is already wrapped by sglang-dsv4-guard",
                                    str(target))
    function = _called(owner, original)
    made = make_wrapper(function)
    setattr(made, WRAPPER_MARK, function)
    wrapper: Any = made
    kind = _binding(original)
    if kind is not None:  # it binds as it did: a classmethod stays one
        wrapper = kind(made)
        setattr(wrapper, WRAPPER_MARK, original)  # what the owner held, to put back
    setattr(owner, attr, wrapper)
    _LIVE.add(made)
    patch = AppliedPatch(target, owner, attr, original, wrapper, [str(target)])
    rebound: list[tuple[dict[str, Any], str]] = []
    try:
        if isinstance(owner, ModuleType):
            for key, namespace, name in _modules_holding(original):
                namespace[name] = wrapper
                rebound.append((namespace, name))
                patch.rebound.append(f"{key}.{name}")
    except BaseException:  # KeyboardInterrupt included: never leave a half-applied patch
        for namespace, name in rebound:
            namespace[name] = original
        setattr(owner, attr, original)
        _LIVE.discard(made)
        raise
    return patch


def apply_all(module: ModuleType, targets: Sequence[tuple[
        PatchTarget, Callable[[Callable[..., Any]], Callable[..., Any]]]]) -> list[AppliedPatch]:
    """Apply every target or none: on any failure, restore what was applied, then re-raise."""
    applied: list[AppliedPatch] = []
    try:
        for target, make_wrapper in targets:
            applied.append(apply(target, module, make_wrapper))
    except BaseException:
        for patch in reversed(applied):
            for note in restore(patch):
                logger.warning("sglang-dsv4-guard rollback: %s", note)
        raise
    return applied


def restore(patch: AppliedPatch) -> list[str]:
    """Undo ``patch`` wherever our wrapper still stands; return what was left alone."""
    left: list[str] = []
    _LIVE.discard(_function(patch.wrapper))  # type: ignore[arg-type]
    if vars(patch.owner).get(patch.attr) is patch.wrapper:
        setattr(patch.owner, patch.attr, patch.original)
    else:
        left.append(f"{patch.target} was replaced after sglang-dsv4-guard wrapped it; "
                    "the newer object was left in place")
    if isinstance(patch.owner, ModuleType):
        for _, namespace, name in _modules_holding(patch.wrapper):
            namespace[name] = patch.original
    return left


class _CallbackLoader(importlib.abc.Loader):
    """Delegates to the real loader, then runs the callbacks on the new module."""

    def __init__(self, loader: importlib.abc.Loader,
                 on_loaded: Callable[[ModuleType], None]) -> None:
        self._loader = loader
        self._on_loaded = on_loaded

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return self._loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        self._loader.exec_module(module)  # an import error is SGLang's: let it rise
        self._on_loaded(module)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._loader, name)


class PostImportHooks(importlib.abc.MetaPathFinder):
    """A ``sys.meta_path`` finder that calls back once a watched module has executed."""

    def __init__(self) -> None:
        self._callbacks: dict[str, Callable[[ModuleType], None]] = {}
        self._busy = threading.local()

    def watch(self, name: str, callback: Callable[[ModuleType], None]) -> None:
        """Call ``callback(module)`` when ``name`` is imported (now, if it already is)."""
        module = sys.modules.get(name)
        if module is not None:
            callback(module)
            return
        self._callbacks[name] = callback
        if self not in sys.meta_path:
            sys.meta_path.insert(0, self)

    def unwatch_all(self) -> None:
        """Forget every callback and leave ``sys.meta_path``."""
        self._callbacks.clear()
        while self in sys.meta_path:
            sys.meta_path.remove(self)

    @property
    def pending(self) -> tuple[str, ...]:
        """The modules still awaited."""
        return tuple(self._callbacks)

    def find_spec(self, fullname: str, path: Sequence[str] | None = None,
                  target: ModuleType | None = None) -> importlib.machinery.ModuleSpec | None:
        callback = self._callbacks.get(fullname)
        busy: set[str] = self._busy.__dict__.setdefault("names", set())
        if callback is None or fullname in busy:
            return None
        busy.add(fullname)
        try:
            spec = importlib.util.find_spec(fullname)
        finally:
            busy.discard(fullname)
        if spec is None or spec.loader is None:
            return None

        def on_loaded(module: ModuleType) -> None:
            self._callbacks.pop(fullname, None)
            try:
                callback(module)
            except DSV4GuardInstallError:
                raise  # strict mode refuses: the import fails with the guard's reason
            except Exception:
                logger.warning("sglang-dsv4-guard could not patch %s after its import; "
                               "SGLang runs unguarded there", fullname, exc_info=True)

        spec.loader = _CallbackLoader(spec.loader, on_loaded)
        return spec
