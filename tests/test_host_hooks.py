"""The guard inside SGLang's own HookRegistry, next to other plug-ins' hooks.

Each test runs SGLang's real ``load_plugins()`` in a fresh interpreter, with fake plug-in
distributions (a ``*.dist-info`` with ``entry_points.txt`` for ``sglang.srt.plugins``) on
``PYTHONPATH`` next to the guard's own entry point.
"""

from __future__ import annotations

import json
import tempfile
import textwrap
import unittest
from pathlib import Path

from helpers import GuardTestCase, fresh_python
from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=160, suite="stage-a-test-cpu")

UTILS = "sglang.srt.disaggregation.utils.setup_state_kv_args"

# Fake plug-ins: module name -> source. Each records its calls in CALLS.
REPLACER = f"""
import sglang.srt.disaggregation.utils as utils
from sglang.srt.plugins.hook_registry import HookRegistry, HookType
CALLS = []
_SGLANG = {{"fn": utils.setup_state_kv_args}}  # a module global would be rebound too

def replacement(*args, **kwargs):
    CALLS.append("replacement")
    return _SGLANG["fn"](*args, **kwargs)

def activate():
    HookRegistry.register("{UTILS}", replacement, HookType.REPLACE)
"""

AROUNDER = f"""
from sglang.srt.plugins.hook_registry import HookRegistry, HookType
CALLS = []

def timer(original_fn, *args, **kwargs):
    CALLS.append("timer")
    return original_fn(*args, **kwargs)

def activate():
    HookRegistry.register("{UTILS}", timer, HookType.AROUND)
"""

# Another name for the same function, applied after the guard's target (its name sorts
# after "sglang.srt..."): SGLang's _propagate_patch then rebinds every holder of the
# guard's wrapper to the replacement.
OUTSIDER = """
from sglang.srt.disaggregation.utils import setup_state_kv_args
from sglang.srt.plugins.hook_registry import HookRegistry, HookType
CALLS = []

def replacement(*args, **kwargs):
    CALLS.append("outsider")
    return None

def activate():
    HookRegistry.register("zz_outsider.setup_state_kv_args", replacement, HookType.REPLACE)
"""

# A REPLACE on the guard's own target that never calls SGLang's function.
DISPLACER = f"""
from sglang.srt.plugins.hook_registry import HookRegistry, HookType
CALLS = []

def replacement(*args, **kwargs):
    CALLS.append("displacer")
    return None

def activate():
    HookRegistry.register("{UTILS}", replacement, HookType.REPLACE)
"""

PROBE = r"""
import contextlib, io, json, logging, sys
logging.basicConfig(level=logging.INFO, stream=sys.stderr)
import importlib
doctor = io.StringIO()
if "--doctor" in sys.argv:
    from sglang_dsv4_guard.cli import main
    with contextlib.redirect_stdout(doctor):
        main(["doctor"])
if "--early" in sys.argv:
    from sglang_dsv4_guard.entry import activate
    activate()
from sglang.srt.plugins import load_plugins
load_plugins()
import sglang.srt.disaggregation.prefill as prefill
from sglang_dsv4_guard.testing import new_kv_args, three_mismatch_pair
try:
    prefill.setup_state_kv_args(new_kv_args(), *three_mismatch_pair())
    raised = None
except Exception as exc:
    raised = type(exc).__name__
calls = {name: importlib.import_module(name).CALLS for name in sys.argv[1].split(",") if name}
print(json.dumps({"raised": raised, "calls": calls, "doctor": doctor.getvalue()}))
"""


# An AROUND hook on each bootstrap queue's own binding of the function: with the guard
# patched in before load_plugins(), it wraps the guard's wrapper from outside.
QUEUE_AROUNDER = """
from sglang.srt.plugins.hook_registry import HookRegistry, HookType
CALLS = []

def timer(original_fn, *args, **kwargs):
    CALLS.append("timer")
    return original_fn(*args, **kwargs)

def activate():
    for queue in ("prefill", "decode"):
        HookRegistry.register(f"sglang.srt.disaggregation.{queue}.setup_state_kv_args", timer,
                              HookType.AROUND)
"""

# Each bootstrap queue module calls SGLang's function by its own binding: the call is
# compiled as that module's code and run in its namespace, so the calling frame is
# SGLang's prefill (or decode) module, under every hook applied to the binding.
BY_ROLE = r"""
import json, logging, sys
logging.basicConfig(level=logging.CRITICAL)
from sglang_dsv4_guard.entry import activate
activate()  # patched before load_plugins(): the other plug-in's hooks wrap the guard
from sglang.srt.plugins import load_plugins
load_plugins()
import sglang.srt.disaggregation.decode as decode
import sglang.srt.disaggregation.prefill as prefill
from sglang_dsv4_guard.dedup.markers import fingerprint
from sglang_dsv4_guard.testing import new_kv_args, three_mismatch_pair
out = {}
for role, module in (("prefill", prefill), ("decode", decode)):
    call = compile("setup_state_kv_args(kv, *pools)", module.__file__, "exec")
    try:
        exec(call, vars(module), {"kv": new_kv_args(), "pools": three_mismatch_pair()})
    except Exception as exc:
        report = exc.report
        out[role] = {"caller": report.context["caller"], "role": report.context.get("role"),
                     "fingerprint": fingerprint(report)}
print(json.dumps({"raised": None, "calls": {}, "by_role": out,
                  "doctor": ""}))
"""


# The connector methods the guard wraps lazily, as registry targets.
CONTACT = "sglang.srt.disaggregation.common.conn.CommonKVManager.try_ensure_parallel_info"
CONNECTOR_TARGETS = (CONTACT,
                     "sglang.srt.disaggregation.nixl.conn.NixlKVManager._add_remote_peer",
                     "sglang.srt.disaggregation.mori.conn.MoriKVManager._add_remote_peer")
# A plug-in registering an AROUND hook on each: what registering the guard's would do.
CONNECTOR_HOOKER = f"""
from sglang.srt.plugins.hook_registry import HookRegistry, HookType
CALLS = []

def around(original_fn, *args, **kwargs):
    CALLS.append("around")
    return original_fn(*args, **kwargs)

def activate():
    for target in {CONNECTOR_TARGETS!r}:
        HookRegistry.register(target, around, HookType.AROUND)
"""

# A scheduler process as SGLang's loader meets it (its module imported), then a (second)
# cached first-contact call on SGLang's real method: which connector modules are imported before
# and after load_plugins(), the registry's targets, and the files of every frame called.
CONNECTORS_PROBE = r"""
import json, logging, sys
logging.basicConfig(level=logging.INFO, stream=sys.stderr)
import sglang.srt.managers.scheduler
MODULES = ("common", "nixl", "mooncake", "mori")
def imported():
    return {m: f"sglang.srt.disaggregation.{m}.conn" in sys.modules for m in MODULES}
before = imported()
from sglang.srt.plugins import load_plugins
from sglang.srt.plugins.hook_registry import HookRegistry
load_plugins()
after = imported()
from sglang.srt.disaggregation.common import conn
manager = object.__new__(conn.CommonKVManager)
manager.prefill_info_table = {"prefill:8998": None}
manager.try_ensure_parallel_info("prefill:8998")  # the guard's first call vets the table
files = []
sys.setprofile(lambda frame, event, arg: files.append(frame.f_code.co_filename)
               if event == "call" else None)
answer = manager.try_ensure_parallel_info("prefill:8998")
sys.setprofile(None)
calls = {name: __import__(name).CALLS for name in sys.argv[1].split(",") if name}
print(json.dumps({"raised": None, "calls": calls, "before": before, "after": after,
                  "answer": answer, "targets": sorted(HookRegistry._hooks), "files": files,
                  "doctor": ""}))
"""

def run_with(plugins: dict[str, str], *argv: str,
             probe: str = PROBE) -> tuple[dict[str, object], str]:
    """Run ``probe`` with the guard on and ``plugins`` installed as distributions."""
    with tempfile.TemporaryDirectory() as site:
        for name, source in plugins.items():
            Path(site, f"{name}.py").write_text(textwrap.dedent(source))
            dist = Path(site, f"{name}_fake-1.0.dist-info")
            dist.mkdir()
            (dist / "METADATA").write_text(
                f"Metadata-Version: 2.1\nName: {name}-fake\nVersion: 1.0\n")
            (dist / "entry_points.txt").write_text(
                f"[sglang.srt.plugins]\n{name} = {name}:activate\n")
        done = fresh_python(probe, ",".join(plugins), *argv,
                            env={"SGLANG_DSV4_GUARD": "1"}, path_first=site)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1]), done.stderr


class TestHookRegistry(GuardTestCase):
    """The guard registers with SGLang's HookRegistry and says when another hook displaces it."""

    def test_alone_the_guard_is_an_around_hook(self) -> None:
        """SGLang applies the guard's AROUND hook and logs it under plugin=dsv4_guard; the
        call goes through the guard (DSV4GuardError), with no warning about the chain."""
        result, stderr = run_with({})
        self.assertEqual(result["raised"], "DSV4GuardError")
        self.assertIn(f"Applied 1 hook(s) to {UTILS} (from: plugin=dsv4_guard", stderr)
        self.assertIn("registered an AROUND hook on", stderr)
        self.assertNotIn("NOT in the call chain", stderr)

    def test_another_around_hook_runs_with_the_guard(self) -> None:
        """Another plug-in's AROUND hook: SGLang warns about two AROUND hooks naming both
        plug-ins, both run, and the guard still reports (no warning from the guard)."""
        result, stderr = run_with({"arounder": AROUNDER})
        self.assertEqual(result["raised"], "DSV4GuardError")
        self.assertEqual(result["calls"], {"arounder": ["timer"]})
        self.assertIn(f"Multiple AROUND hooks on '{UTILS}' (2 hooks", stderr)
        self.assertIn("plugin=arounder, dist=arounder-fake", stderr)
        self.assertIn("plugin=dsv4_guard", stderr)
        self.assertNotIn("NOT in the call chain", stderr)
        self.assertNotIn("is not SGLang's function", stderr)

    def test_caller_is_sglangs_queue_under_another_around_hook(self) -> None:
        """Under another plug-in's AROUND hook, a report names SGLang's own calling module
        (prefill or decode bootstrap queue), not the plug-in's hook, and the two sides'
        reports carry their role and differ in fingerprint."""
        result, _ = run_with({"otherplug": QUEUE_AROUNDER}, probe=BY_ROLE)
        by_role = result["by_role"]
        assert isinstance(by_role, dict)
        self.assertEqual(by_role["prefill"]["caller"], "prefill server (PrefillBootstrapQueue)")
        self.assertEqual(by_role["decode"]["caller"], "decode server (DecodePreallocQueue)")
        self.assertEqual([by_role[r]["role"] for r in ("prefill", "decode")],
                         ["prefill", "decode"])
        self.assertNotEqual(by_role["prefill"]["fingerprint"], by_role["decode"]["fingerprint"])

    def test_replace_on_the_same_target_is_wrapped_and_named(self) -> None:
        """A REPLACE on setup_state_kv_args goes under the guard: the guard still runs and
        reports, and a WARNING names the plug-in whose replacement now sits under it."""
        result, stderr = run_with({"replacer": REPLACER})
        self.assertEqual(result["raised"], "DSV4GuardError")
        self.assertEqual(result["calls"], {"replacer": ["replacement"]})
        self.assertIn("setup_state_kv_args under the guard is not SGLang's function but "
                      f"replace on {UTILS} by replacer.replacement "
                      "(plugin=replacer, dist=replacer-fake)", stderr)

    def test_replace_that_takes_the_guard_out_is_named(self) -> None:
        """A REPLACE applied after the guard's hook takes it out of the chain: right after
        apply_hooks() a WARNING names it, and doctor listed it as a problem beforehand."""
        result, stderr = run_with({"zz_outsider": OUTSIDER}, "--doctor")
        self.assertIsNone(result["raised"])
        self.assertEqual(result["calls"], {"zz_outsider": ["outsider"]})
        self.assertIn("sglang-dsv4-guard is NOT in the call chain of "
                      "sglang.srt.disaggregation.utils.setup_state_kv_args", stderr)
        self.assertIn("replace on zz_outsider.setup_state_kv_args by zz_outsider.replacement "
                      "(plugin=zz_outsider, dist=zz_outsider-fake)", stderr)
        doctor = str(result["doctor"])
        self.assertIn("problem: other plug-in hook: replace on zz_outsider.setup_state_kv_args"
                      " by zz_outsider.replacement (plugin=zz_outsider, dist=zz_outsider-fake):"
                      " applied after the guard's hook: takes the guard out of the call chain",
                      doctor)
        self.assertIn("doctor: problems found", doctor)


    def test_guard_installed_before_the_loader_alone_is_in_the_chain(self) -> None:
        """activate() before load_plugins() patches; when the loader runs it again and no
        other plug-in hooks the target, the patched wrapper is recognised as the guard's:
        the call goes through the guard and no WARNING says it is out of the chain."""
        result, stderr = run_with({}, "--early")
        self.assertEqual(result["raised"], "DSV4GuardError")
        self.assertNotIn("NOT in the call chain", stderr)

    def test_guard_installed_before_the_loader_is_still_checked(self) -> None:
        """activate() before load_plugins() patches; when the loader runs it again with the
        same settings and another plug-in's REPLACE takes the patched guard out, a WARNING
        after apply_hooks() says so and names it."""
        result, stderr = run_with({"displacer": DISPLACER}, "--early")
        self.assertIsNone(result["raised"])
        self.assertEqual(result["calls"], {"displacer": ["displacer"]})
        self.assertIn("sglang-dsv4-guard is NOT in the call chain of "
                      "sglang.srt.disaggregation.utils.setup_state_kv_args", stderr)
        self.assertIn(f"replace on {UTILS} by displacer.replacement "
                      "(plugin=displacer, dist=displacer-fake)", stderr)



class TestConnectorsStayLazy(GuardTestCase):
    """Why the guard registers no connector method with SGLang's registry (the guard's
    sglang_dsv4_guard/hook_registry.py):
    in a scheduler process as SGLang's loader meets it, the guard's lazy wrappers cost the
    per-request call no frame but the guard's own and import nothing; a registered hook on
    the same methods puts the registry's frame in every call, imports the NIXL connector a
    Mooncake or MORI server never imports, and fails on MORI's (``mori`` needs ROCm)."""

    def test_lazy_wrappers_and_what_registering_would_do(self) -> None:
        lazy, stderr = run_with({}, probe=CONNECTORS_PROBE)
        self.assertEqual(lazy["targets"], [UTILS])
        self.assertEqual(lazy["before"], {"common": True, "nixl": False, "mooncake": False,
                                          "mori": False})
        self.assertEqual(lazy["after"], lazy["before"])
        self.assertIs(lazy["answer"], True)
        files = lazy["files"]
        assert isinstance(files, list)
        self.assertEqual([Path(f).name for f in files], ["wrapper.py"], files)
        self.assertIn("sglang_dsv4_guard", files[0])
        self.assertNotIn("Failed to apply hooks", stderr)

        hooked, stderr = run_with({"connhook": CONNECTOR_HOOKER}, probe=CONNECTORS_PROBE)
        self.assertEqual(hooked["calls"], {"connhook": ["around", "around"]})  # both calls
        self.assertIs(hooked["answer"], True)
        self.assertTrue(hooked["after"]["nixl"])  # type: ignore[index]
        files = hooked["files"]
        assert isinstance(files, list)
        self.assertTrue(any(Path(f).as_posix().endswith("sglang/srt/plugins/hook_registry.py")
                            for f in files), files)  # SGLang's, not the guard's namesake
        self.assertGreater(len(files), len(lazy["files"]))  # type: ignore[arg-type]
        self.assertIn(f"Failed to apply hooks to {CONNECTOR_TARGETS[2]}", stderr)


if __name__ == "__main__":
    unittest.main()
