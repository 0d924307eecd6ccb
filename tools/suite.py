"""What the test runners must know of the suite: its property tests and its process tests.

``tools/matrix.py`` judges a run by these lists; ``tests/test_matrix_tool.py`` holds
them to the suite (every ``@given`` test is in ``PROPERTY_TESTS``), and ``make test``
holds ``PROCESS_TESTS`` to what the traced run saw (``tools/selection.py``): a test that
started a Python interpreter and is not listed, or a listed one that started none, fails
the run.
"""

from __future__ import annotations

__all__ = ["FIXED_EXAMPLES", "PROCESS_TESTS", "PROPERTY_TESTS", "process_test",
           "property_node_ids", "property_test"]

# Every property test (module::Class::test): a run that ran one and got no statistics
# from it fails.
PROPERTY_TESTS = ("test_parity_property::TestParity::test_guard_agrees_with_sglang",
                  "test_mori::TestMoriParity::test_parity",
                  "test_autoshare::TestAutoshareHidesNothing::test_other_rejections_unchanged",
                  "test_check_fix_property::TestCheckFixProperty::test_fixed_lines_pass_or_say_no_flag_fix",
                  "test_fixes_runtime::TestFlagsAccepted::test_every_flag_accepted",
                  "test_pd_conditions::TestParityWithSGLang::test_runner_agrees_with_one_real_call",
                  "test_pd_transfer::TestSendExtraParity::test_parity",
                  "test_pd_contract_property::TestContractAgreesWithSGLang::test_rows_agree_with_sglang",
                  "test_peers::TestNixlRegistrationParity::test_parity",
                  "test_peers::TestMooncakeRegistrationParity::test_parity",
                  "test_mori::TestMoriRegistrationParity::test_parity",
                  "test_first_contact_runtime::TestFirstContactParity::test_parity")
# Property tests that draw a fixed, small number of examples whatever the profile (each
# example costs several SGLang resolutions), with that number.
FIXED_EXAMPLES = {
    "test_check_fix_property::TestCheckFixProperty::test_fixed_lines_pass_or_say_no_flag_fix": 12,
    "test_pd_contract_property::TestContractAgreesWithSGLang::test_rows_agree_with_sglang": 20,
    "test_peers::TestNixlRegistrationParity::test_parity": 40,
    "test_peers::TestMooncakeRegistrationParity::test_parity": 30,
    "test_mori::TestMoriRegistrationParity::test_parity": 24,
    "test_first_contact_runtime::TestFirstContactParity::test_parity": 25}

_LOADER = "runs SGLang's plug-in loader (load_plugins) in a fresh interpreter"
_SCHEDULERS = "starts scheduler-like processes as SGLang's launcher does"
_CHECK = "runs check's child interpreter, whose environment it controls"
_DOCTOR = "runs doctor in a fresh interpreter, as an operator does"
# Test classes (or whole files) that start Python interpreters, and why. Each pays
# SGLang's import (~10 s) per interpreter, so `make check-fast` leaves them out; `make
# test` runs them on every release whose code they (and their children) drive differs.
PROCESS_TESTS: dict[str, str] = {
    **{f"tests/test_report_once.py::{name}": _SCHEDULERS for name in (
        "TestFingerprintAndMarkers", "TestHostileMarkerDirectory", "TestAtExit",
        "TestSpawnedSchedulers")},
    **{f"tests/test_launch_identity.py::{name}": _SCHEDULERS for name in (
        "TestLaunchIdentityRule", "TestSweep", "TestPreStartedPool", "TestTwoPidNamespaces",
        "TestManyStaleLaunches", "TestTwoServersRunningFromOneLauncher")},
    "tests/test_sglang_loader.py::TestLoadPlugins": _LOADER,
    **{f"tests/test_scheduler_handler.py::{name}": "runs SGLang's run_scheduler_process in "
       "a spawned child" for name in ("TestSchedulerPrintsTheReportOnce",
                                      "TestKilledLaunchStillPrintsTheReport")},
    "tests/test_host_hooks.py::TestHookRegistry": _LOADER,
    "tests/test_host_hooks.py::TestConnectorsStayLazy": "imports the scheduler in a fresh "
        "interpreter to show no connector is imported",
    "tests/test_plugin_example.py::TestExamplePlugin": "installs the example plug-in and "
        "loads it through a real entry point in a fresh interpreter",
    "tests/test_host.py::TestHostInAFreshProcess": "judges a source tree over another "
        "wheel, which needs a fresh import of SGLang",
    "tests/test_host_sources.py::TestUnreadableSourceInAFreshProcess": "installs the guard "
        "over an unreadable SGLang source in a fresh interpreter",
    "tests/test_doctor_plugins.py::TestDoctorReadsSglangPlugins": _DOCTOR,
    "tests/test_json_logs.py::TestJsonThroughSGLangLoggingConfig": "configures SGLang's "
        "logging from a file, once per interpreter",
    "tests/test_harness.py::TestMoriImportRetried": "imports MORI's connector afresh",
    "tests/test_mori.py::TestLazyPatch": "imports MORI's connector afresh",
    "tests/test_harness.py::TestSkipsFailInCi": "runs a test file as SGLang's CI runs it: "
        "python3 <file>",
    "tests/test_errors_and_inputs.py::TestErrorsTravel": "sends the guard's errors across "
        "a spawn pool",
    "tests/test_errors_and_inputs.py::TestUnpicklablePluginValueTravels": "sends the "
        "guard's errors across a spawn pool",
    "tests/test_doctor_isolation.py::TestDoctorIsolatesPlugins": _DOCTOR,
    "tests/test_check_process.py::TestCheckProcessTouchesNothing": _CHECK,
    "tests/test_check_process.py::TestDoctorProcessTouchesNothing": _DOCTOR,
    "tests/test_patch_series.py::TestDoctorPatchesLine": _DOCTOR,
    "tests/test_layers.py::TestPackageLayers": "runs tools/imports.py as a command",
    "tests/test_matrix_tool.py::TestHarnessParts": "starts SGLang's fork worker",
    "tests/test_check_process.py::TestCheckChildLifecycle": _CHECK,
    "tests/test_check_output.py::TestImportWarningsInAFreshProcess": "needs the warnings "
        "SGLang's import emits once per process",
    "tests/test_check_output.py::TestChildDiedKeepsOutput": _CHECK,
}


def property_test(node_id: str) -> str | None:
    """The ``PROPERTY_TESTS`` name of a pytest node id, if it is one."""
    path, _, rest = node_id.partition("::")
    name = f"{path.rsplit('/', 1)[-1].removesuffix('.py')}::{rest}"
    return name if name in PROPERTY_TESTS else None


def property_node_ids() -> list[str]:
    """``PROPERTY_TESTS`` as pytest node ids."""
    return [f"tests/{test.replace('::', '.py::', 1)}" for test in PROPERTY_TESTS]


def process_test(node_id: str) -> str | None:
    """The ``PROCESS_TESTS`` entry that holds a pytest node id, if one does."""
    path, _, rest = node_id.partition("::")
    cls = rest.split("::", 1)[0]
    for entry in (f"{path}::{cls}", path):
        if entry in PROCESS_TESTS:
            return entry
    return None
