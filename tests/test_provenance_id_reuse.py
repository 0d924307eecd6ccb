"""A registration the guard saw is credited only to the very tensor registered: a tensor
assigned directly later, even one that CPython places at the registered tensor's freed
address (the same ``id()``), is not called registered. SGLang's real pool class, pools by
``build_pair``."""

from __future__ import annotations

import unittest

import torch
from helpers import GuardTestCase
from sglang.test.ci.ci_register import register_cpu_ci

from sglang_dsv4_guard.state.provenance import registered_by
from sglang_dsv4_guard.testing import build_pair

register_cpu_ci(est_time=31, suite="stage-a-test-cpu")


class TestRegistrationIdentity(GuardTestCase):
    """Provenance keyed by the tensor itself, not by its id()."""

    def test_reused_id_not_credited(self) -> None:
        """Two direct assignments after a seen registration (the registered tensor freed
        by the first, its id free for the second): the pool's mapping is not credited."""
        self.install_guard("on", load_entry_points=False)
        _, draft = build_pair(mapping="clone")  # the draft alone holds its registered tensor
        draft.full_to_swa_index_mapping = torch.arange(16)
        draft.full_to_swa_index_mapping = torch.arange(16)
        self.assertIsNone(registered_by(draft, draft.full_to_swa_index_mapping))


if __name__ == "__main__":
    unittest.main()
