"""The guard's exceptions. Each carries the object at fault as an attribute.

Each survives ``pickle``, ``copy`` and ``deepcopy`` (same type, message and fields),
so one raised in a process-pool worker reaches the parent as itself: ``__reduce__``
returns the constructor's own arguments plus the instance ``__dict__`` (PEP 678
notes, ``dsv4_guard_report`` and anything else set on it after construction).
"""

from __future__ import annotations

import dataclasses
import logging
import pickle
from typing import Any

from sglang_dsv4_guard.findings import Finding, Report, to_jsonable
from sglang_dsv4_guard.log import LOGGER_NAME

_log = logging.getLogger(LOGGER_NAME)

__all__ = ["DSV4GuardError", "DSV4GuardInstallError", "DSV4GuardStartupRefused", "SettingError"]


class DSV4GuardError(RuntimeError):
    """SGLang's error (or, in strict mode, the guard's), with the full report below it.

    The message's first line is exactly SGLang's message, so code matching SGLang's
    text still matches. ``report`` and ``findings`` hold the structured data;
    ``host_error`` is SGLang's own exception (also the ``__cause__``), or ``None``.
    """

    def __init__(self, first_line: str, report: Report, rendered: str | None,
                 host_error: BaseException | None = None) -> None:
        message = first_line if not rendered else f"{first_line}\n{rendered}"
        super().__init__(message)
        self.first_line = first_line
        self.rendered = rendered
        self.report = report
        self.host_error = host_error

    def __reduce__(self) -> tuple[Any, ...]:
        report, host_error = self.report, self.host_error
        try:
            pickle.dumps((report, host_error))
        except Exception as exc:  # a plug-in's value (a lock, a handle) that cannot travel
            _log.debug("sglang-dsv4-guard: report not picklable (%s); observation values "
                       "are reduced to their capped JSON form", type(exc).__name__)
            report, host_error = _portable(report), _portable_error(host_error)
        state = dict(self.__dict__)
        state.update(report=report, host_error=host_error)
        return (type(self), (self.first_line, report, self.rendered, host_error), state)

    @property
    def findings(self) -> tuple[Finding, ...]:
        """The report's findings."""
        return self.report.findings


def _portable(report: Report) -> Report:
    """``report`` with every observation value in its capped JSON form (always picklable)."""
    return dataclasses.replace(report, context=dict(report.context), findings=tuple(
        dataclasses.replace(f, observations=tuple(
            dataclasses.replace(o, value=to_jsonable(o.value)) for o in f.observations))
        for f in report.findings))


def _portable_error(error: BaseException | None) -> BaseException | None:
    try:
        pickle.dumps(error)
    except Exception:  # SGLang's own exception carrying something unpicklable
        return RuntimeError(str(error))
    return error


class DSV4GuardInstallError(RuntimeError):
    """The guard cannot install (strict mode only; otherwise it warns and stays inert).

    ``reason`` says why, ``target`` names the patch target at fault, if any.
    """

    def __init__(self, reason: str, target: str | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.target = target

    def __reduce__(self) -> tuple[Any, ...]:
        return type(self), (self.reason, self.target), dict(self.__dict__)


class DSV4GuardStartupRefused(SystemExit):
    """Raised by the SGLang plug-in entry point in strict mode when the guard cannot install.

    A ``SystemExit`` so that SGLang's ``load_plugins()``, which catches and logs every
    ``Exception``, cannot swallow it: the scheduler process stops with the message.
    """

    def __init__(self, error: DSV4GuardInstallError) -> None:
        super().__init__(f"sglang-dsv4-guard (strict mode) refused to start: {error.reason}")
        self.error = error

    def __reduce__(self) -> tuple[Any, ...]:
        return type(self), (self.error,), dict(self.__dict__)


class SettingError(ValueError):
    """A setting has a value the guard does not accept.

    ``variable`` is the environment variable or keyword, ``value`` what it held and
    ``accepted`` the accepted values.
    """

    def __init__(self, variable: str, value: object, accepted: tuple[str, ...],
                 consequence: str) -> None:
        super().__init__(
            f"{variable} must be one of {', '.join(accepted)} (got {value!r}); {consequence}"
        )
        self.variable = variable
        self.value = value
        self.accepted = accepted
        self.consequence = consequence

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.variable, self.value, self.accepted, self.consequence),
                dict(self.__dict__))
