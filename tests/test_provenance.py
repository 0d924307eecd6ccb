"""The guard observes SGLang's ``register_mapping`` transparently: recorded while installed,
undone by uninstall, observed again after a reinstall, SGLang's behaviour unchanged."""

from __future__ import annotations

import unittest

import torch
from helpers import GuardTestCase
from sglang.srt.mem_cache.deepseek_v4_memory_pool import DeepSeekV4TokenToKVPool
from sglang.test.ci.ci_register import register_cpu_ci

import sglang_dsv4_guard
from sglang_dsv4_guard.state.provenance import registered_by
from sglang_dsv4_guard.testing import build_pair

register_cpu_ci(est_time=32, suite="stage-a-test-cpu")

ORIGINAL = vars(DeepSeekV4TokenToKVPool)["register_mapping"]


class TestRegisterMappingObserved(GuardTestCase):
    """What the observer records, and that it leaves no trace once uninstalled."""

    def test_records_the_calling_line(self) -> None:
        """A registration made while installed is recorded with this file's line."""
        self.install_guard("on", load_entry_points=False)
        target, _ = build_pair()
        tensor = torch.arange(4)
        target.register_mapping(tensor)
        where = registered_by(target, target.full_to_swa_index_mapping)
        self.assertIsNotNone(where)
        self.assertIn("test_provenance.py:", str(where))

    def test_sglang_behaviour_unchanged(self) -> None:
        """Wrapped, register_mapping sets the same attribute, returns what SGLang's does
        and raises SGLang's own TypeError for a missing argument."""
        self.install_guard("on", load_entry_points=False)
        target, draft = build_pair()
        tensor = torch.arange(4)
        self.assertIs(target.register_mapping(tensor), ORIGINAL(draft, tensor))
        self.assertIs(target.full_to_swa_index_mapping, tensor)
        with self.assertRaises(TypeError):
            target.register_mapping()

    def test_uninstall_restores_and_reinstall_observes(self) -> None:
        """Uninstall puts SGLang's method back (nothing recorded then); a reinstall
        observes again."""
        self.install_guard("on", load_entry_points=False)
        sglang_dsv4_guard.uninstall()
        self.assertIs(vars(DeepSeekV4TokenToKVPool)["register_mapping"], ORIGINAL)
        target, _ = build_pair()
        self.assertIsNone(registered_by(target, target.full_to_swa_index_mapping))
        self.install_guard("on", load_entry_points=False)
        target, _ = build_pair()
        self.assertIsNotNone(registered_by(target, target.full_to_swa_index_mapping))

    def test_a_later_direct_assignment_is_not_credited(self) -> None:
        """A mapping set by assignment after a seen registration is not called registered."""
        self.install_guard("on", load_entry_points=False)
        target, _ = build_pair()
        target.full_to_swa_index_mapping = torch.arange(4)
        self.assertIsNone(registered_by(target, target.full_to_swa_index_mapping))


class _OverridingPool(DeepSeekV4TokenToKVPool):
    """A pool subclass whose register_mapping overrides SGLang's and calls super()."""

    def register_mapping(self, *args: object, **kwargs: object) -> object:
        return super().register_mapping(*args, **kwargs)


class TestSubclassOverride(GuardTestCase):
    """The registrar named through a pool subclass that overrides register_mapping."""

    def test_override_calling_super_names_the_caller(self) -> None:
        """A subclass override calling super(): the record names the line that called
        register_mapping (this test), neither the guard's wrapper nor the override."""
        self.install_guard("on", load_entry_points=False)
        target, _ = build_pair()
        target.__class__ = _OverridingPool
        tensor = torch.arange(4)
        target.register_mapping(tensor)
        where = str(registered_by(target, target.full_to_swa_index_mapping))
        self.assertTrue(where.endswith("(test_override_calling_super_names_the_caller)"),
                        where)


if __name__ == "__main__":
    unittest.main()
