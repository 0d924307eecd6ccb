"""What the test runners must know of the suite: its property tests and its process tests.

``tools/matrix.py`` judges a run by these lists; ``tests/test_matrix_tool.py`` holds
them to the suite (every ``@given`` test is in ``PROPERTY_TESTS``), and ``make test``
holds ``PROCESS_TESTS`` to what the traced run saw (``tools/selection.py``): a test that
started a Python interpreter and is not listed, or a listed class none of whose tests
started one, fails the run.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["FIXED_EXAMPLES", "NOT_SCALED", "PROCESS_TESTS", "PROPERTY_TESTS", "ProcessTest",
           "examples_asked", "process_test", "property_node_ids", "property_test"]

# Every property test (module::Class::test): a run that ran one and got no statistics
# from it fails.
PROPERTY_TESTS = ("test_parity_property::TestParity::test_guard_agrees_with_sglang",
                  "test_mori::TestMoriParity::test_parity",
                  "test_autoshare::TestAutoshareHidesNothing::test_other_rejections_unchanged",
                  "test_check_fix_property::TestCheckFixProperty::"
                  "test_the_cheapest_minimal_change_is_chosen",
                  "test_fixes_runtime::TestFlagsAccepted::test_every_flag_accepted",
                  "test_pd_conditions::TestParityWithSGLang::test_runner_agrees_with_one_real_call",
                  "test_pd_transfer::TestSendExtraParity::test_parity",
                  "test_pd_contract_property::TestContractAgreesWithSGLang::test_rows_agree_with_sglang",
                  "test_peers::TestNixlRegistrationParity::test_parity",
                  "test_peers::TestMooncakeRegistrationParity::test_parity",
                  "test_mori::TestMoriRegistrationParity::test_parity",
                  "test_first_contact_runtime::TestFirstContactParity::test_parity",
                  "test_check_agrees_with_runtime::TestPairConditionsAgree::"
                  "test_check_and_registration_agree")
# Property tests that draw a fixed, small number of examples (each example costs several
# SGLang resolutions), with the number the ci profile draws; under dev, a quarter of it
# (examples_asked; the tests draw it through tests/helpers.py fixed_examples).
FIXED_EXAMPLES = {
    "test_check_fix_property::TestCheckFixProperty::test_the_cheapest_minimal_change_is_chosen":
        6,
    "test_pd_contract_property::TestContractAgreesWithSGLang::test_rows_agree_with_sglang": 20,
    "test_peers::TestNixlRegistrationParity::test_parity": 40,
    "test_peers::TestMooncakeRegistrationParity::test_parity": 30,
    "test_mori::TestMoriRegistrationParity::test_parity": 24,
    "test_first_contact_runtime::TestFirstContactParity::test_parity": 25,
    "test_check_agrees_with_runtime::TestPairConditionsAgree::"
    "test_check_and_registration_agree": 20}

# Those that draw their ci count under every profile.
NOT_SCALED = ("test_check_fix_property::TestCheckFixProperty::"
              "test_the_cheapest_minimal_change_is_chosen",)


def examples_asked(test: str, profile: str) -> int | None:
    """The examples a ``FIXED_EXAMPLES`` test draws under ``profile`` (``None``: not one)."""
    if test not in FIXED_EXAMPLES:
        return None
    ci = FIXED_EXAMPLES[test]
    return ci if profile == "ci" or test in NOT_SCALED else max(2, ci // 4)


_LOADER = ("srt/plugins/__init__.py", "srt/plugins/hook_registry.py")
_SCHEDULERS = "starts scheduler-like processes as SGLang's launcher does"
# The files the guard's judgement digests (host/digests.py), and the release's label.
_DIGESTED = ("_version.py", "srt/disaggregation/utils.py",
             "srt/mem_cache/deepseek_v4_memory_pool.py", "srt/disaggregation/mori/conn.py")


@dataclass(frozen=True)
class ProcessTest:
    """Why a test class starts Python interpreters, and the SGLang code its children
    drive for that reason: a file under ``sglang/``, or ``path::name`` for one top-level
    function or class of it; empty for the guard's own process code."""

    why: str
    drives: tuple[str, ...] = ()


# Test classes (or whole files, or single tests) that start Python interpreters. Each pays SGLang's
# import (~10 s) per interpreter: `make check-fast` leaves them out, and `make test`
# counts, for their children, the code declared here (a child's import and platform
# probes differ in every release; what the children get from the wrapped functions is
# asserted in-process on every release: tests/test_process_fixtures.py).
PROCESS_TESTS: dict[str, ProcessTest] = {
    # The launch identity and the markers are the guard's own code: SGLang's loader only
    # runs its entry point, which TestLoadPlugins and TestHookRegistry assert on every
    # release whose loader differs; so these run on the base release alone.
    **{f"tests/test_report_once.py::{name}": ProcessTest(_SCHEDULERS) for name in (
        "TestAtExit", "TestSpawnedSchedulers")},
    **{f"tests/test_launch_identity.py::{name}": ProcessTest(_SCHEDULERS)
       for name in ("TestLaunchIdentityRule", "TestPreStartedPool",
                    "TestTwoPidNamespaces", "TestManyStaleLaunches",
                    "TestTwoServersRunningFromOneLauncher")},
    # SGLang's report paths the schedulers drive are asserted in-process on every release
    # (their own tests); what decides the export there is TestServerArgsDecide's, in-process;
    # the loader only runs the guard's entry point (as above).
    "tests/test_metrics.py::TestScrape": ProcessTest(
        _SCHEDULERS + ", then serves and scrapes SGLang's /metrics", (
            "srt/utils/common.py::set_prometheus_multiproc_dir",
            "srt/utils/common.py::add_prometheus_middleware")),
    "tests/test_metrics.py::TestFaults": ProcessTest(
        "imports prometheus_client afresh (its mode is fixed at import) for each fault"),
    "tests/test_sglang_loader.py::TestLoadPlugins": ProcessTest(
        "runs SGLang's plug-in loader (load_plugins) in a fresh interpreter", _LOADER),
    **{f"tests/test_scheduler_handler.py::{name}": ProcessTest(
        "runs SGLang's run_scheduler_process in a spawned child",
        ("srt/managers/scheduler.py::run_scheduler_process",)) for name in (
        "TestSchedulerPrintsTheReportOnce", "TestKilledLaunchStillPrintsTheReport")},
    "tests/test_host_hooks.py::TestHookRegistry": ProcessTest(
        "loads the guard through SGLang's hook registry in a fresh interpreter", _LOADER),
    # The scheduler's own imports were read on 0.5.16, 0.5.18, 0.5.21 and 0.5.23: none
    # imports the NIXL, Mooncake or MORI connector.
    "tests/test_host_hooks.py::TestConnectorsStayLazy": ProcessTest(
        "imports the scheduler in a fresh interpreter to show no connector is imported",
        _LOADER),
    "tests/test_plugin_example.py::TestExamplePlugin": ProcessTest(
        "loads the example plug-in through a real entry point in a fresh interpreter",
        _LOADER),
    "tests/test_host.py::TestHostInAFreshProcess": ProcessTest(
        "judges a source tree over another wheel, which needs a fresh import", _LOADER),
    "tests/test_host_sources.py::TestUnreadableSourceInAFreshProcess": ProcessTest(
        "installs the guard over an unreadable SGLang source in a fresh interpreter",
        _LOADER),
    # SGLANG_PLUGINS is read by the loader (the same code in every release).
    "tests/test_doctor_plugins.py::TestDoctorReadsSglangPlugins": ProcessTest(
        "runs doctor and SGLang's loader in fresh interpreters", _LOADER),
    "tests/test_json_logs.py::TestJsonThroughSGLangLoggingConfig": ProcessTest(
        "configures SGLang's logging from a file, once per interpreter",
        ("srt/utils/common.py::configure_logger",)),
    "tests/test_harness.py::TestMoriImportRetried": ProcessTest(
        "imports MORI's connector afresh", ("srt/disaggregation/mori/conn.py",)),
    "tests/test_mori.py::TestLazyPatch": ProcessTest(
        "imports MORI's connector afresh", ("srt/disaggregation/mori/conn.py",)),
    "tests/test_harness.py::TestSkipsFailInCi": ProcessTest(
        "runs a test file as SGLang's CI runs it: python3 <file>",
        ("test/test_utils.py::CustomTestCase", "srt/utils/common.py::retry")),
    "tests/test_errors_and_inputs.py::TestErrorsTravel": ProcessTest(
        "sends the guard's errors across a spawn pool"),
    "tests/test_errors_and_inputs.py::TestUnpicklablePluginValueTravels": ProcessTest(
        "sends the guard's errors across a spawn pool"),
    "tests/test_doctor_isolation.py::TestDoctorIsolatesPlugins": ProcessTest(
        "runs doctor in a fresh interpreter, as an operator does"),
    # What SGLang's resolution may fetch or write: the whole of ServerArgs and ModelConfig.
    "tests/test_check_process.py::TestCheckProcessTouchesNothing": ProcessTest(
        "runs check's child interpreter, whose environment it controls", (
            "srt/server_args.py", "srt/configs/model_config.py",
            "srt/arg_groups/serving_hook.py::handle_crash_dump_env",
            "srt/arg_groups/model_path_hook.py::handle_modelscope_paths",
            "srt/utils/hf_transformers_utils.py")),
    "tests/test_check_memory.py::TestCheckMemory": ProcessTest(
        "runs check's child on huge config.json files and reads its peak memory", (
            "srt/server_args.py", "srt/configs/model_config.py",
            "srt/mem_cache/deepseek_v4_memory_pool.py")),
    # The guard's own limit refuses the config before SGLang reads it: no release's code
    # decides the outcome (the parser only reads the two lines first).
    "tests/test_check_memory.py::TestCheckMemoryRefused": ProcessTest(
        "runs check's child on a config.json beyond the guard's limits"),
    "tests/test_check_process.py::TestDoctorProcessTouchesNothing": ProcessTest(
        "runs doctor in a fresh interpreter, as an operator does", _LOADER),
    # doctor's series line is the guard's own (each release's series is asserted
    # in-process by TestPatchesCommand everywhere).
    "tests/test_patch_series.py::TestDoctorPatchesLine": ProcessTest(
        "runs doctor in a fresh interpreter, as an operator does", _LOADER),
    "tests/test_matrix_tool.py::TestHarnessParts": ProcessTest(
        "starts SGLang's fork worker", ("test/ci/ci_register.py",
                                        "test/ci/ci_utils.py::run_unittest_files")),
    "tests/test_check_process.py::TestCheckChildLifecycle": ProcessTest(
        "runs check's child interpreter: its import path, time limit and SIGTERM"),
    "tests/test_check_output.py::TestImportWarningsInAFreshProcess": ProcessTest(
        "needs the warnings SGLang's import emits once per process",
        ("srt/layers/quantization/awq/awq.py", "srt/layers/quantization/gguf.py")),
    # SGLang only supplies a log line for the child to die on.
    "tests/test_check_output.py::TestChildDiedKeepsOutput": ProcessTest(
        "runs check's child and kills it mid-check"),
    # Single tests of otherwise in-process classes.
    "tests/test_check_inputs.py::TestBadInput::test_no_traceback_in_a_fresh_process":
        ProcessTest("runs the check command in a fresh interpreter on bad input"),
    "tests/test_plugin_faults.py::TestBadFindings::test_g090_bad_finding_fields_in_check_command":
        ProcessTest("runs check's child with a plug-in that builds bad findings",
                    ("srt/server_args.py",)),
    "tests/test_errors_and_inputs.py::TestMappingComparisonMemory::"
    "test_20m_entries_differing_everywhere_stay_under_an_eighth": ProcessTest(
        "measures the comparison's peak memory in an interpreter of its own"),
    **{f"tests/test_host.py::{name}": ProcessTest(
        "runs tools/digests.py on the installed release", _DIGESTED) for name in (
        "TestJudgedByCode::test_tool_computes_the_stored_code_digests",
        "TestPatchedTreeJudged::test_tool_computes_the_stored_patched_code_digests")},
    "tests/test_patch_series.py::TestJudgesTheImportedTree::"
    "test_tree_without_metadata_over_another_release": ProcessTest(
        "judges a source tree over another release in a fresh interpreter", _DIGESTED),
    "tests/test_selection.py::TestPlacing::"
    "test_interpreters_through_multiprocessing_and_shells_are_counted": ProcessTest(
        "starts a spawn child and a Python under sh, to show the tracer counts them"),
    "tests/test_patch_series.py::TestShippedInTheWheel::"
    "test_non_editable_install_finds_the_series": ProcessTest(
        "installs the guard's wheel and runs it in a fresh interpreter"),
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
    for entry in (node_id, f"{path}::{cls}", path):
        if entry in PROCESS_TESTS:
            return entry
    return None
