"""``check -f``'s reader (``sglang_dsv4_guard.check.inputs``): deployment files read into
SGLang invocations and prefill/decode pairs, each argument with its line and span.

Pure and fast: nothing here starts SGLang. Every sample under ``examples/deployments/``
is read and its pairs, roles, exact arguments, environment, GPU, unresolved names and
the lines of its key flags are compared with what was extracted from it by hand
(:data:`HAND_EXTRACTED`, also for a test that runs ``check`` on both and compares the
findings); the shapes no sample has (heredocs, ``docker run -e``, a router that names a
decode as prefill, alias bombs ...) are written inline.
"""

from __future__ import annotations

import io
import os
import shlex
import tempfile
import textwrap
import unittest
from pathlib import Path

from helpers import GuardTestCase
from sglang.test.ci.ci_register import register_cpu_ci

from sglang_dsv4_guard.check.inputs import InputError, Inputs, Invocation, read_inputs
from sglang_dsv4_guard.check.inputs.model import MAX_FILE_BYTES, MAX_FILES, MAX_NODES

register_cpu_ci(est_time=30, suite="stage-a-test-cpu")

ROOT = Path(__file__).resolve().parent.parent
SAMPLES = ROOT / "examples" / "deployments"
MODEL = "/models/DeepSeek-V4"  # the samples' model path (a check run maps it to a local config)
EAGLE = ("--speculative-algorithm EAGLE --speculative-num-steps 3 --speculative-eagle-topk 1 "
         "--speculative-num-draft-tokens 4")

# Each sample's pair, as extracted by hand from the file: the pair's name, and per role
# the arguments SGLang gets (space-joined; no argument holds a space) and the env.
HAND_EXTRACTED: dict[str, dict[str, tuple[str, dict[str, str]]]] = {
    "examples/deployments/llmd-disaggregatedset.yaml: DisaggregatedSet/dsv4": {
        "prefill": (
            f"--model-path={MODEL} --trust-remote-code --tp-size=8 --disaggregation-mode=prefill "
            "--disaggregation-transfer-backend=mooncake --disaggregation-bootstrap-port=8998 "
            "--page-size=64 --speculative-algorithm=EAGLE --speculative-num-steps=3 "
            "--speculative-eagle-topk=1 --speculative-num-draft-tokens=4 --host=0.0.0.0 "
            "--port=8000", {"SGLANG_DISAGGREGATION_THREAD_POOL_SIZE": "8"}),
        "decode": (
            f"--model-path={MODEL} --trust-remote-code --tp-size=8 --disaggregation-mode=decode "
            "--disaggregation-transfer-backend=mooncake --speculative-algorithm=EAGLE "
            "--speculative-num-steps=3 --speculative-eagle-topk=1 "
            "--speculative-num-draft-tokens=4 --mem-fraction-static=0.82 --host=0.0.0.0 --port=8000",
            {}),
    },
    "examples/deployments/rbg-pd.yaml: RoleBasedGroup/dsv4-pd (router at line 19)": {
        "prefill": (
            f"--model-path {MODEL} --trust-remote-code --tp-size 8 --disaggregation-mode prefill "
            "--disaggregation-transfer-backend mooncake --disaggregation-bootstrap-port 8998 "
            f"{EAGLE} --host $(POD_IP) --port 8000", {"MODEL_PATH": MODEL}),
        "decode": (
            f"--model-path {MODEL} --trust-remote-code --tp-size 16 --disaggregation-mode decode "
            f"--disaggregation-transfer-backend mooncake {EAGLE} "
            "--dist-init-addr $(RBG_LWP_LEADER_ADDRESS):5000 --nnodes 2 "
            "--node-rank $(RBG_LWP_WORKER_INDEX) --port 8000", {"MODEL_PATH": MODEL}),
    },
    "examples/deployments/ome-runtime.yaml: ClusterServingRuntime/srt-dsv4-pd": {
        "prefill": (
            f"--model-path {MODEL} --trust-remote-code --tp-size 16 --disaggregation-mode prefill "
            f"--disaggregation-transfer-backend mooncake --kv-cache-dtype bf16 {EAGLE} "
            "--dist-init-addr $(LWS_LEADER_ADDRESS):5000 --nnodes 2 --node-rank 0 "
            "--host 0.0.0.0 --port 8080", {"MODEL_PATH": MODEL}),
        "decode": (
            f"--model-path {MODEL} --trust-remote-code --tp-size 16 --disaggregation-mode decode "
            f"--disaggregation-transfer-backend mooncake {EAGLE} "
            "--dist-init-addr $(LWS_LEADER_ADDRESS):5000 --nnodes 2 --node-rank 0 "
            "--host 0.0.0.0 --port 8080", {"MODEL_PATH": MODEL}),
    },
    "examples/deployments/dynamo-graph.yaml: DynamoGraphDeployment/dsv4-disagg": {
        "prefill": (
            f"--model-path {MODEL} --trust-remote-code --tp-size 8 --disaggregation-mode prefill "
            "--disaggregation-transfer-backend nixl --disaggregation-bootstrap-port 12345 "
            f"{EAGLE}", {"MODEL_DIR": MODEL}),
        "decode": (
            f"--model-path {MODEL} --trust-remote-code --tp-size 8 --disaggregation-mode decode "
            f"--disaggregation-transfer-backend nixl {EAGLE}", {"MODEL_DIR": MODEL}),
    },
    "examples/deployments/lws-pd.yaml: LeaderWorkerSet/dsv4-prefill leader, container "
    "sglang-leader + LeaderWorkerSet/dsv4-decode leader, container sglang-leader": {
        "prefill": (
            f"--model-path {MODEL} --trust-remote-code --tp-size 16 --disaggregation-mode prefill "
            "--disaggregation-transfer-backend mori --dist-init-addr $(LWS_LEADER_ADDRESS):20000 "
            "--nnodes 2 --node-rank 0 --port 30000",
            {"MODEL_DIR": MODEL, "SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT": "600"}),
        "decode": (
            f"--model-path {MODEL} --trust-remote-code --tp-size 16 --disaggregation-mode decode "
            "--disaggregation-transfer-backend mori --dist-init-addr $(LWS_LEADER_ADDRESS):20000 "
            "--nnodes 2 --node-rank 0 --port 30000",
            {"MODEL_DIR": MODEL, "SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT": "600"}),
    },
    "examples/deployments/docker-compose.yaml (router at line 55)": {
        "prefill": (
            f"--model-path {MODEL} --trust-remote-code --tp-size 8 --disaggregation-mode prefill "
            f"--disaggregation-transfer-backend nixl {EAGLE} --port 30000",
            {"SGLANG_DISAGGREGATION_THREAD_POOL_SIZE": "8",
             "CUDA_VISIBLE_DEVICES": "0,1,2,3,4,5,6,7"}),
        "decode": (
            f"--model-path {MODEL} --trust-remote-code --tp-size 8 --disaggregation-mode decode "
            "--disaggregation-transfer-backend nixl --speculative-algorithm EAGLE "
            "--speculative-num-steps 1 --speculative-eagle-topk 1 "
            "--speculative-num-draft-tokens 2 --port 30001",
            {"CUDA_VISIBLE_DEVICES": "8,9,10,11,12,13,14,15", "DRAFT_TOKENS": "2"}),
    },
    "examples/deployments/launch-pd.sh (router at line 27)": {
        "prefill": (
            f"--model-path {MODEL} --trust-remote-code --tp-size 8 {EAGLE} "
            "--disaggregation-mode prefill --disaggregation-transfer-backend mooncake "
            "--disaggregation-bootstrap-port 8998 --port 30000",
            {"MODEL": MODEL, "SGLANG_DISAGGREGATION_THREAD_POOL_SIZE": "8",
             "CUDA_VISIBLE_DEVICES": "0,1,2,3,4,5,6,7"}),
        "decode": (
            f"--model-path {MODEL} --trust-remote-code --tp-size 8 {EAGLE} "
            "--disaggregation-mode decode --disaggregation-transfer-backend nixl --port 30001",
            {"MODEL": MODEL, "SGLANG_DISAGGREGATION_THREAD_POOL_SIZE": "8",
             "CUDA_VISIBLE_DEVICES": "8,9,10,11,12,13,14,15"}),
    },
    "examples/deployments/args/prefill.args + examples/deployments/args/decode.args": {
        "prefill": (
            f"--model-path {MODEL} --trust-remote-code --tp-size 8 --disaggregation-mode prefill "
            f"--disaggregation-transfer-backend mooncake {EAGLE}", {}),
        "decode": (
            f"--model-path {MODEL} --trust-remote-code --tp-size 8 --disaggregation-mode=decode "
            f"--disaggregation-transfer-backend=mooncake {EAGLE}", {}),
    },
}
# What each sample states of its servers' GPU, and which launcher starts them.
GPUS = {"llmd-disaggregatedset.yaml": "NVIDIA-B200", "rbg-pd.yaml": "NVIDIA-H200",
        "ome-runtime.yaml": "NVIDIA-H100-80GB-HBM3", "dynamo-graph.yaml": "NVIDIA-H200",
        "lws-pd.yaml": "amd.com/gpu", "docker-compose.yaml": None, "launch-pd.sh": None,
        "prefill.args": None}
LAUNCHERS = {"dynamo-graph.yaml": "dynamo.sglang", "prefill.args": "args"}


def rel(text: str) -> str:
    """``text`` with the repository's absolute path taken out."""
    return text.replace(f"{ROOT}{os.sep}", "")


def read(*names: str) -> Inputs:
    """The samples named (paths under examples/deployments/), or the whole directory."""
    return read_inputs([str(SAMPLES / n) for n in names] or [str(SAMPLES)])


def inline(text: str, name: str = "deploy.yaml") -> Inputs:
    """``text`` (dedented) read from a file ``name`` of a throw-away directory."""
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, name)
        with open(path, "w", encoding="utf-8") as handle:
            handle.write(textwrap.dedent(text))
        return read_inputs([path])


def stdin(text: str) -> Inputs:
    return read_inputs(["-"], io.StringIO(textwrap.dedent(text)))


def by_name(inputs: Inputs) -> dict[str, tuple[Invocation, Invocation]]:
    return {rel(p.name): (p.prefill, p.decode) for p in inputs.pairs}


class TestSamples(GuardTestCase):
    """Each sample under examples/deployments/ reads as extracted by hand."""

    @classmethod
    def setUpClass(cls) -> None:
        super().setUpClass()
        cls.inputs = read()
        cls.pairs = by_name(cls.inputs)

    def test_pairs_found(self) -> None:
        """The directory holds one pair per sample (the args files pair across their two
        files) and one unpaired prefill, whose decode was never written."""
        self.assertEqual(sorted(self.pairs), sorted(HAND_EXTRACTED))
        self.assertEqual([(rel(i.file), i.role) for i, _ in self.inputs.unpaired],
                         [("examples/deployments/deployment-prefill-only.yaml", "prefill")])
        self.assertTrue(self.inputs.unpaired[0][1].startswith("no decode server in "))

    def test_exact_arguments_and_env(self) -> None:
        """Each pair's arguments and environment are what the file says, per role."""
        for name, roles in HAND_EXTRACTED.items():
            for role, invocation in zip(("prefill", "decode"), self.pairs[name], strict=True):
                with self.subTest(pair=name, role=role):
                    argv, env = roles[role]
                    self.assertEqual(invocation.argv, tuple(argv.split()))
                    self.assertEqual(dict(invocation.env), env)
                    self.assertEqual(invocation.role, role)

    def test_gpu_and_launcher(self) -> None:
        """The GPU product each manifest states (the raw string), and the launcher."""
        for name, (prefill, decode) in self.pairs.items():
            base = os.path.basename(prefill.file)
            with self.subTest(pair=name):
                self.assertEqual((prefill.gpu, decode.gpu), (GPUS[base], GPUS[base]))
                self.assertEqual(prefill.launcher, LAUNCHERS.get(base, "sglang.launch_server"))

    def test_lines_of_key_flags(self) -> None:
        """Each key flag points at the line it is typed on: list items, --k=v, folded
        `sh -c` scripts, continuations, a variable's assignment ($COMMON)."""
        lines = {
            "llmd-disaggregatedset.yaml": {"--page-size": (34, 59), "--disaggregation-mode": (31, 64),
                                           None: (26, 59)},
            "ome-runtime.yaml": {"--kv-cache-dtype": (45, 91), "--disaggregation-mode": (43, 95),
                                 "--speculative-num-draft-tokens": (47, 98), None: (39, 91)},
            "rbg-pd.yaml": {"--disaggregation-mode": (60, 97), "--tp-size": (59, 95),
                            None: (58, 89)},
            "launch-pd.sh": {"--disaggregation-transfer-backend": (17, 24),
                             "--speculative-algorithm": (11, 11), "--port": (19, 25),
                             None: (15, 22)},
            "docker-compose.yaml": {"--speculative-num-draft-tokens": (34, 50), None: (16, 46)},
            "prefill.args": {"--disaggregation-mode": (5, 4), None: (3, 2)},
        }
        for prefill, decode in self.pairs.values():
            base = os.path.basename(prefill.file)
            for flag, expected in lines.get(base, {}).items():
                with self.subTest(sample=base, flag=flag):
                    got = (prefill.line, decode.line) if flag is None else \
                        (prefill.line_of(flag), decode.line_of(flag))
                    self.assertEqual(got, expected)

    def test_every_span_holds_its_typed_text(self) -> None:
        """Every argument with a span is its typed text at that place of the file, on its
        line; a span is missing only where the text is not typed verbatim (a value from
        $MODEL, compose's default)."""
        missing = []
        for invocation in self.inputs.invocations:
            text = Path(invocation.file).read_text(encoding="utf-8")
            for token in invocation.tokens:
                if token.span is None:
                    missing.append((os.path.basename(invocation.file), token.typed))
                    continue
                start, end = token.span
                self.assertEqual(text[start:end], token.typed)
                self.assertEqual(text.count("\n", 0, start) + 1, token.line)
        self.assertEqual(sorted(set(missing)), [("docker-compose.yaml", MODEL),
                                                ("launch-pd.sh", MODEL)])

    def test_typed_differs_from_text_where_resolved(self) -> None:
        """$(VAR) and ${VAR:-default} resolve; the token keeps what was typed."""
        prefill = self.pairs["examples/deployments/ome-runtime.yaml: "
                             "ClusterServingRuntime/srt-dsv4-pd"][0]
        resolved = {t.typed: t.text for t in prefill.tokens if t.typed != t.text}
        self.assertEqual(resolved, {"${MODEL_PATH}": MODEL, "${PARALLELISM_SIZE:-16}": "16"})

    def test_unresolved_names(self) -> None:
        """What cannot be resolved is named with why: LWS's and RBG's run-time variables,
        valueFrom, envFromSecret, a compose variable without value, a variable the
        script sets without export."""
        expected = {
            "ome-runtime.yaml": {"$(LWS_LEADER_ADDRESS)", "SGLANG_TBO_DEBUG", "HF_TOKEN"},
            "rbg-pd.yaml": {"$(POD_IP)", "POD_IP", "$(RBG_LWP_LEADER_ADDRESS)",
                            "$(RBG_LWP_WORKER_INDEX)"},
            "dynamo-graph.yaml": {"envFromSecret hf-token-secret"},
            "docker-compose.yaml": {"HF_TOKEN"},
            "lws-pd.yaml": {"$(LWS_LEADER_ADDRESS)"},
        }
        for prefill, decode in self.pairs.values():
            base = os.path.basename(prefill.file)
            named = {line.split(" (line ")[0] for line in prefill.unresolved + decode.unresolved}
            with self.subTest(sample=base):
                self.assertEqual(named, expected.get(base, set()))
        ome = self.pairs["examples/deployments/ome-runtime.yaml: "
                         "ClusterServingRuntime/srt-dsv4-pd"][0]
        self.assertIn("$(LWS_LEADER_ADDRESS) (line 48): LeaderWorkerSet sets it", ome.unresolved[0])
        self.assertIn("SGLANG_TBO_DEBUG (line 38): set in the script without export",
                      " ".join(ome.unresolved))

    def test_leaders_stand_for_their_workers(self) -> None:
        """An LWS or OME leader and its worker are one server: only the leader is paired,
        every worker is among the invocations, and a worker whose flags differ is a note."""
        nodes = [(os.path.basename(i.file), i.node, i.role) for i in self.inputs.invocations
                 if i.node]
        self.assertEqual(sorted(nodes), sorted(
            [(f, n, r) for f in ("lws-pd.yaml", "ome-runtime.yaml")
             for n in ("leader", "worker") for r in ("prefill", "decode")]))
        for prefill, decode in self.pairs.values():
            self.assertNotEqual("worker", prefill.node)
            self.assertNotEqual("worker", decode.node)
        self.assertEqual([rel(n) for n in self.inputs.notes if "differs from its leader" in n],
                         ["examples/deployments/ome-runtime.yaml:116: ClusterServingRuntime/"
                          "srt-dsv4-pd decoderConfig worker, container ome-container differs "
                          "from its leader (line 91): --mem-fraction-static on the worker only"])

    def test_where_names_the_role_slot(self) -> None:
        """``where`` says the object, its role slot and container."""
        prefill, decode = self.pairs["examples/deployments/llmd-disaggregatedset.yaml: "
                                     "DisaggregatedSet/dsv4"]
        self.assertEqual((prefill.where, decode.where),
                         ("DisaggregatedSet/dsv4 role prefill, container sglang",
                          "DisaggregatedSet/dsv4 role decode, container sglang"))

    def test_one_file_reads_alone(self) -> None:
        """A sample named on its own gives the same pair as in the directory walk."""
        inputs = read("rbg-pd.yaml")
        self.assertEqual(list(by_name(inputs)), ["examples/deployments/rbg-pd.yaml: "
                                                 "RoleBasedGroup/dsv4-pd (router at line 19)"])


class TestShellScripts(GuardTestCase):
    """Scripts read as sh would run them."""

    SCRIPT = """\
        #!/bin/sh
        export A=1
        cd /srv && exec env SGLANG_X=2 /opt/conda/bin/python3.11 -m sglang.launch_server \\
          --model-path=/m --disaggregation-mode=prefill --tp "$TP"; echo done
        sglang serve --model-path /m --disaggregation-mode decode \\
          --kv-cache-dtype ${KV:-auto} 2>&1 | tee decode.log
        cat <<EOF > later.sh
        python -m sglang.launch_server --model-path /never --disaggregation-mode decode
        EOF
        docker run -e SGLANG_Y=3 --env=HF_HOME=/hf img python3 -m dynamo.sglang \\
          --model-path /m --disaggregation-mode decode
        """

    def invocations(self) -> list[Invocation]:
        return list(stdin(self.SCRIPT).invocations)

    def test_launchers_behind_wrappers(self) -> None:
        """``exec env A=B /path/python3.11 -m``, ``sglang serve`` and ``docker run ...
        python3 -m dynamo.sglang`` are found; a here-document's body is not run."""
        self.assertEqual([(i.launcher, i.role, i.line) for i in self.invocations()],
                         [("sglang.launch_server", "prefill", 3), ("sglang serve", "decode", 5),
                          ("dynamo.sglang", "decode", 10)])

    def test_arguments_end_at_the_command(self) -> None:
        """``;``, ``|`` and redirections end a server's arguments; ``--k=v`` stays one
        argument; continuations join lines; ${KV:-auto} takes its default."""
        first, second, _ = self.invocations()
        self.assertEqual(first.argv, ("--model-path=/m", "--disaggregation-mode=prefill", "--tp",
                                      "$TP"))
        self.assertEqual(second.argv, ("--model-path", "/m", "--disaggregation-mode", "decode",
                                       "--kv-cache-dtype", "auto"))
        self.assertEqual(second.line_of("--kv-cache-dtype"), 6)

    def test_environment_from_export_env_and_docker(self) -> None:
        """``export``, ``env A=B`` and ``docker run -e``/``--env=`` give the server's env."""
        first, second, third = self.invocations()
        self.assertEqual(dict(first.env), {"A": "1", "SGLANG_X": "2"})
        self.assertEqual(dict(second.env), {"A": "1"})
        self.assertEqual(dict(third.env), {"A": "1", "SGLANG_Y": "3", "HF_HOME": "/hf"})

    def test_unset_variable_is_named(self) -> None:
        """``"$TP"`` has no value: left as typed, one line naming it."""
        first = self.invocations()[0]
        self.assertEqual(first.unresolved, ("$TP (line 4): not set in the script (the "
                                            "environment it runs in is not known); left as "
                                            "typed",))

    def test_prefix_assignment_is_env_of_that_command_only(self) -> None:
        """``VAR=value cmd`` is in that server's env, not the next one's; a plain
        assignment is a shell variable the server does not see."""
        inputs = stdin("""\
            SGLANG_A=1 python3 -m sglang.launch_server --disaggregation-mode prefill &
            SGLANG_B=2
            python3 -m sglang.launch_server --disaggregation-mode decode --port $SGLANG_B &
            wait
            """)
        prefill, decode = inputs.invocations
        self.assertEqual((dict(prefill.env), dict(decode.env)), ({"SGLANG_A": "1"}, {}))
        self.assertEqual(decode.argv[-1], "2")
        self.assertIn("SGLANG_B (line 2): set in the script without export", decode.unresolved[0])

    def test_parameter_expansions(self) -> None:
        """``${A:-$B}``, ``${A:+x}``, ``${A:=x}`` and ``${A-x}`` as sh evaluates them (an
        empty unquoted result is no argument); ``${A:?}`` unset and a default naming an
        unset variable are left as typed; ``declare`` without ``-x`` does not export."""
        inputs = stdin("""\
            D=/d
            E=
            declare F=1
            declare -x G=2
            python3 -m sglang.launch_server --a ${X:-$D} --b ${X:-$NOPE} --c ${D:+alt} \\
              --d ${E:-e} --e ${E-e} --f ${Y:=y} --g $Y --h ${Z:?need}
            """)
        (invocation,) = inputs.invocations
        self.assertEqual(invocation.argv, ("--a", "/d", "--b", "${X:-$NOPE}", "--c", "alt",
                                           "--d", "e", "--e", "--f", "y", "--g", "y", "--h",
                                           "${Z:?need}"))
        self.assertEqual([u.split(" (")[0] for u in invocation.unresolved],
                         ["${X:-$NOPE}", "${Z:?need}"])
        self.assertEqual(dict(invocation.env), {"G": "2"})

    def test_arguments_from_a_variable_point_at_its_assignment(self) -> None:
        """``$ARGS`` splits into arguments; each points where it is typed in ARGS=..."""
        inputs = stdin("""\
            ARGS="--model-path /m
              --page-size 64"
            python3 -m sglang.launch_server $ARGS --disaggregation-mode prefill
            """)
        (invocation,) = inputs.invocations
        self.assertEqual(invocation.argv[:4], ("--model-path", "/m", "--page-size", "64"))
        self.assertEqual((invocation.line_of("--model-path"), invocation.line_of("--page-size"),
                          invocation.line_of("--disaggregation-mode")), (1, 2, 3))

    def test_a_commands_env_reaches_its_nested_script(self) -> None:
        """``A=B bash -c '...'`` and ``env A=B sh -c '...'``: the server inside has A."""
        inputs = stdin("""\
            SGLANG_C=3 bash -c "python3 -m sglang.launch_server --disaggregation-mode decode"
            env SGLANG_D=4 sh -c 'python3 -m sglang.launch_server --disaggregation-mode prefill'
            """)
        self.assertEqual([dict(i.env) for i in inputs.invocations],
                         [{"SGLANG_C": "3"}, {"SGLANG_D": "4"}])

    def test_nested_scripts(self) -> None:
        """``bash -c '...'`` and ``ssh host "..."`` are read as scripts: their servers are
        found, ``\\$P`` waits for the inner shell, ``$1`` is named."""
        inputs = stdin("""\
            bash -c 'export SGLANG_Z=1; python3 -m sglang.launch_server --disaggregation-mode decode'
            ssh node1 "python3 -m sglang.launch_server --disaggregation-mode prefill --port \\$P $1"
            """)
        decode, prefill = inputs.invocations
        self.assertEqual(dict(decode.env), {"SGLANG_Z": "1"})
        self.assertEqual(prefill.argv[-2:], ("$P", "$1"))
        self.assertEqual([u.split(" (")[0] for u in prefill.unresolved], ["$P", "$1"])
        self.assertEqual(len(inputs.pairs), 1)

    def test_shebang_file_without_extension_in_a_directory(self) -> None:
        """A directory walk reads ``*.sh`` and extensionless ``#!`` files, skips hidden
        directories and other files (a README), and notes a file without a server."""
        with tempfile.TemporaryDirectory() as tmp:
            files = {"run": "#!/bin/bash\npython3 -m sglang.launch_server --disaggregation-mode "
                            "prefill\n",
                     "other.sh": "echo nothing here\n",
                     "README.md": "python3 -m sglang.launch_server --disaggregation-mode decode\n",
                     ".hidden/d.sh": "python3 -m sglang.launch_server --disaggregation-mode decode\n",
                     "sub/d.yaml": "kind: Pod\nspec:\n  containers:\n  - command: [python3, -m, "
                                   "sglang.launch_server, --disaggregation-mode, decode]\n"}
            for name, text in files.items():
                os.makedirs(os.path.dirname(os.path.join(tmp, name)), exist_ok=True)
                Path(tmp, name).write_text(text)
            inputs = read_inputs([tmp])
            self.assertEqual(sorted(os.path.relpath(i.file, tmp) for i in inputs.invocations),
                             ["run", "sub/d.yaml"])
            self.assertEqual([os.path.relpath(n.split(":")[0], tmp) for n in inputs.notes],
                             ["other.sh"])
            # one prefill and one decode, each alone in its own directory: not paired
            self.assertEqual(len(inputs.pairs), 0)
            self.assertEqual(len(inputs.unpaired), 2)


class TestKubernetes(GuardTestCase):
    """Containers read as the kubelet builds them."""

    def test_kubernetes_variables(self) -> None:
        """``$(VAR)`` from the container's env (earlier entries too), ``$$(VAR)`` kept as
        ``$(VAR)``; valueFrom, envFrom and a Helm template named, left as typed."""
        inputs = inline("""\
            apiVersion: apps/v1
            kind: Deployment
            metadata: {name: x}
            spec:
              template:
                spec:
                  containers:
                  - name: s
                    command: ["python3", "-m", "sglang.launch_server", "--model-path",
                              "{{ .Values.model }}", "--disaggregation-mode", "$(MODE)",
                              "--tp-size", "$(TP)", "--x", "$$(KEEP)"]
                    env:
                    - {name: MODE, value: prefill}
                    - {name: TP, value: "$(HALF)$(HALF)"}
                    - {name: HALF, value: "4"}
                    - {name: CM, valueFrom: {configMapKeyRef: {name: cfg, key: k}}}
                    envFrom:
                    - configMapRef: {name: bulk}
            """)
        (invocation,) = inputs.invocations
        self.assertEqual(invocation.argv, ("--model-path", "{{ .Values.model }}",
                                           "--disaggregation-mode", "prefill", "--tp-size",
                                           "$(HALF)$(HALF)", "--x", "$(KEEP)"))
        self.assertEqual(invocation.role, "prefill")
        self.assertEqual([u.split(" (line")[0] for u in invocation.unresolved],
                         ["{{ .Values.model }}", "$(HALF)", "CM", "envFrom ConfigMap bulk"])

    def test_list_kind_json_and_entrypoint(self) -> None:
        """A ``List``'s items are objects of their own; JSON (tabs and all) reads as
        YAML; a container with only args on an SGLang image runs its entrypoint."""
        inputs = inline("""\
            {"kind": "List", "items": [
            \t{"kind": "Pod", "metadata": {"name": "p"}, "spec": {"containers": [
            \t\t{"name": "s", "image": "lmsysorg/sglang:v0.5.23",
            \t\t "args": ["--model-path", "/m", "--disaggregation-mode", "prefill"]}]}},
            \t{"kind": "Pod", "metadata": {"name": "d"}, "spec": {"containers": [
            \t\t{"name": "s", "command": ["python3", "-m", "sglang.launch_server"],
            \t\t "args": ["--model-path", "/m", "--disaggregation-mode", "decode"]}]}}]}
            """, "list.json")
        self.assertEqual([(i.where, i.launcher, i.line) for i in inputs.invocations],
                         [("Pod/p, container s", "entrypoint", 4),
                          ("Pod/d, container s", "sglang.launch_server", 6)])
        self.assertEqual([p.name.split(": ", 1)[1] for p in inputs.pairs],
                         ["Pod/p, container s + Pod/d, container s"])

    def test_gpu_product_from_affinity_and_several_products(self) -> None:
        """One product in a required nodeAffinity is the GPU; several are a note and no
        GPU; the amd.com/gpu resource is an AMD GPU."""
        def pod(name: str, values: str, resource: str = "nvidia.com/gpu") -> str:
            return textwrap.dedent(f"""\
                ---
                kind: Pod
                metadata: {{name: {name}}}
                spec:
                  affinity:
                    nodeAffinity:
                      requiredDuringSchedulingIgnoredDuringExecution:
                        nodeSelectorTerms:
                        - matchExpressions:
                          - {{key: nvidia.com/gpu.product, operator: In, values: [{values}]}}
                  containers:
                  - command: [python3, -m, sglang.launch_server, --disaggregation-mode, decode]
                    resources: {{limits: {{{resource}: 8}}}}
                """)
        inputs = inline(pod("a", "NVIDIA-B200") + pod("b", "NVIDIA-B200, NVIDIA-H200")
                        + pod("c", "", "amd.com/gpu"))
        self.assertEqual([i.gpu for i in inputs.invocations], ["NVIDIA-B200", None, "amd.com/gpu"])
        self.assertEqual([n.split(": ", 1)[1] for n in inputs.notes],
                         ["its nodeAffinity allows several GPU products (NVIDIA-B200, "
                          "NVIDIA-H200); no GPU is assumed"])

    def test_merge_keys_and_aliases(self) -> None:
        """Anchors, aliases and compose-style merge keys (``<<: *x``) are followed."""
        inputs = inline("""\
            x-common: &common
              image: lmsysorg/sglang
              environment: {SGLANG_A: "1"}
            services:
              prefill:
                <<: *common
                command: python3 -m sglang.launch_server --disaggregation-mode prefill
              decode:
                <<: *common
                environment: {SGLANG_A: "2"}
                command: python3 -m sglang.launch_server --disaggregation-mode decode
            """)
        self.assertEqual([dict(i.env) for i in inputs.invocations],
                         [{"SGLANG_A": "1"}, {"SGLANG_A": "2"}])
        self.assertEqual(len(inputs.pairs), 1)


class TestMoreShapes(GuardTestCase):
    """ConfigMap scripts, --config, router images, files a walk skips."""

    def test_config_map_scripts(self) -> None:
        """A ConfigMap's ``data`` scripts that start servers are read as scripts (a
        container mounts and runs them); ``--config`` is named as not read."""
        inputs = inline("""\
            apiVersion: v1
            kind: ConfigMap
            metadata: {name: scripts}
            data:
              prefill.sh: |
                #!/bin/bash
                exec python3 -m sglang.launch_server --model-path /m \\
                  --disaggregation-mode prefill --config /etc/sglang/extra.yaml
              decode.sh: |
                exec python3 -m sglang.launch_server --model-path /m --disaggregation-mode decode
            """)
        self.assertEqual([(i.where, i.line, i.line_of("--disaggregation-mode"))
                          for i in inputs.invocations],
                         [("ConfigMap/scripts data prefill.sh", 7, 8),
                          ("ConfigMap/scripts data decode.sh", 10, 10)])
        self.assertEqual(inputs.invocations[0].unresolved,
                         ("--config /etc/sglang/extra.yaml (line 8): SGLang reads more "
                          "arguments from this file when it starts; not read here",))
        self.assertEqual([p.name.split(": ", 1)[1] for p in inputs.pairs], ["ConfigMap/scripts"])

    def test_router_image_without_command_is_no_server(self) -> None:
        """Only args on a router image: its entrypoint is the router, not a server."""
        inputs = inline("""\
            kind: Pod
            spec:
              containers:
              - image: lmsysorg/sglang-router:v0.2.4
                args: [--pd-disaggregation, --prefill, http://p:1, --decode, http://d:2]
            """)
        self.assertEqual(inputs.invocations, ())

    def test_a_walk_skips_prose_and_unrendered_charts(self) -> None:
        """In a directory walk a ``.txt`` of prose is no args file, and a chart template
        that is not YAML until Helm renders it is a note; named alone it is an error."""
        with tempfile.TemporaryDirectory() as tmp:
            Path(tmp, "notes.txt").write_text("Don't run this before the decode is up.\n")
            chart = Path(tmp, "deployment.yaml")
            chart.write_text("kind: Deployment\nspec:\n  {{- if .Values.x }}\n  a: 1\n")
            inputs = read_inputs([tmp])
            self.assertEqual(sorted(os.path.basename(n.split(":")[0]) for n in inputs.notes),
                             ["deployment.yaml", "notes.txt"])
            self.assertIn("an unrendered Helm template (skipped", " ".join(inputs.notes))
            with self.assertRaises(InputError):
                read_inputs([str(chart)])


class TestPairing(GuardTestCase):
    """Pairs follow the manifest's structure."""

    SERVER = "python3 -m sglang.launch_server --model-path /m"

    def compose(self, services: dict[str, str]) -> Inputs:
        lines = ["services:"] + [f"  {name}:\n    command: {command}"
                                 for name, command in services.items()]
        return inline("\n".join(lines) + "\n")

    def test_router_lists_make_groups(self) -> None:
        """Two routers in one file: each pairs the servers its lists name (by host name,
        or by port when the host names none)."""
        inputs = self.compose({
            "pa": f"{self.SERVER} --disaggregation-mode prefill --port 1",
            "da": f"{self.SERVER} --disaggregation-mode decode --port 2",
            "pb": f"{self.SERVER} --disaggregation-mode prefill --port 3 --page-size 64",
            "db": f"{self.SERVER} --disaggregation-mode decode --port 4 --page-size 64",
            "ra": "python3 -m sglang_router.launch_router --pd-disaggregation "
                  "--prefill http://pa-0:1 8998 --decode http://127.0.0.1:2",
            "rb": "python3 -m sglang_router.launch_router --pd-disaggregation "
                  "--prefill=http://pb:3 --decode http://db:4",
        })
        pairs = [(p.prefill.where, p.decode.where, p.note) for p in inputs.pairs]
        self.assertEqual(pairs, [("service pa", "service da", ""), ("service pb", "service db", "")])
        self.assertEqual(inputs.notes, ())

    def test_router_naming_the_other_role_is_a_note(self) -> None:
        """A router that lists a prefill server as a decode says so; pairing still follows
        --disaggregation-mode."""
        inputs = self.compose({
            "p": f"{self.SERVER} --disaggregation-mode prefill --port 1",
            "d": f"{self.SERVER} --disaggregation-mode decode --port 2",
            "r": "python3 -m sglang_router.launch_router --pd-disaggregation "
                 "--prefill http://d:2 --decode http://p:1",
        })
        self.assertEqual([(p.prefill.where, p.decode.where) for p in inputs.pairs],
                         [("service p", "service d")])
        self.assertEqual(sorted(n.split(": ", 1)[1] for n in inputs.notes),
                         ["the router lists service d as prefill, but its "
                          "--disaggregation-mode is decode",
                          "the router lists service p as decode, but its "
                          "--disaggregation-mode is prefill"])

    def test_several_shapes_pair_each_with_each(self) -> None:
        """Two prefill shapes and one decode in one object: two pairs, each saying so."""
        inputs = self.compose({
            "p1": f"{self.SERVER} --disaggregation-mode prefill",
            "p2": f"{self.SERVER} --disaggregation-mode prefill --page-size 64",
            "d": f"{self.SERVER} --disaggregation-mode decode",
        })
        self.assertEqual(len(inputs.pairs), 2)
        self.assertEqual({p.note for p in inputs.pairs},
                         {f"2 prefill and 1 decode shapes in {inputs.pairs[0].prefill.file}: "
                          "each prefill is paired with each decode"})

    def test_replicas_count_once(self) -> None:
        """Servers that differ only in per-instance flags and GPUs are one shape."""
        inputs = stdin(f"""\
            CUDA_VISIBLE_DEVICES=0 {self.SERVER} --disaggregation-mode prefill --port 1 &
            CUDA_VISIBLE_DEVICES=1 {self.SERVER} --disaggregation-mode prefill --port 2 &
            CUDA_VISIBLE_DEVICES=2 {self.SERVER} --disaggregation-mode decode --port=3 &
            """)
        self.assertEqual([(p.prefill.line, p.decode.line, p.note) for p in inputs.pairs],
                         [(1, 3, "")])
        self.assertEqual(inputs.unpaired, ())

    def test_servers_without_a_role_are_unpaired_with_the_reason(self) -> None:
        """No --disaggregation-mode, or ``null``: unpaired, saying which; a Dynamo
        subComponentType is quoted as what the manifest names it."""
        inputs = inline("""\
            kind: DynamoGraphDeployment
            metadata: {name: g}
            spec:
              services:
                prefill:
                  subComponentType: prefill
                  extraPodSpec:
                    mainContainer:
                      command: [python3, -m, dynamo.sglang, --model-path, /m]
                decode:
                  subComponentType: decode
                  extraPodSpec:
                    mainContainer:
                      command: [python3, -m, dynamo.sglang, --disaggregation-mode, "null"]
            """)
        self.assertEqual([why for _, why in inputs.unpaired],
                         ["no --disaggregation-mode: not a prefill or decode server; the "
                          "manifest names it prefill",
                          "--disaggregation-mode is 'null' (prefill or decode pair); the "
                          "manifest names it decode"])

    def test_files_named_together_pair_only_when_unambiguous(self) -> None:
        """A prefill script and a decode script named together pair; with a second decode
        shape in a third file, which pairs is not known: all unpaired, saying so."""
        with tempfile.TemporaryDirectory() as tmp:
            paths = []
            for name, extra in (("p.sh", "prefill"), ("d.sh", "decode"),
                                ("d2.sh", "decode --page-size 64")):
                paths.append(os.path.join(tmp, name))
                Path(paths[-1]).write_text(f"{self.SERVER} --disaggregation-mode {extra}\n")
            two = read_inputs(paths[:2])
            three = read_inputs(paths)
        self.assertEqual([p.name for p in two.pairs], [f"{paths[0]} + {paths[1]}"])
        self.assertEqual(three.pairs, ())
        self.assertTrue(all("1 prefill and 2 decode shapes in the files named together"
                            in why for _, why in three.unpaired))


class TestBadInput(GuardTestCase):
    """Input that cannot be read: an InputError naming the file (and line), never a
    traceback or a hang."""

    def bad(self, text: str | bytes, name: str = "bad.yaml") -> str:
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, name)
            with open(path, "wb") as handle:
                handle.write(text if isinstance(text, bytes) else text.encode())
            with self.assertRaises(InputError) as caught:
                read_inputs([path])
        return str(caught.exception).replace(path, name)

    def test_missing_file(self) -> None:
        """A path that is not there is named, with what is accepted."""
        with self.assertRaises(InputError) as caught:
            read_inputs(["no/such/deploy.yaml"])
        self.assertTrue(str(caught.exception).startswith(
            "no/such/deploy.yaml: no such file or directory; give files (*.yaml"))

    def test_yaml_syntax_error_with_its_line(self) -> None:
        """A YAML syntax error names the file and line; ``{{`` hints at Helm."""
        self.assertTrue(self.bad("kind: Pod\nspec:\n  containers: [python3, -m\n  x: 1\n")
                        .startswith("bad.yaml:4: YAML syntax: "))
        self.assertIn("render a Helm chart with helm template first",
                      self.bad("kind: Pod\nspec:\n  {{- if .Values.x }}\n  a: 1\n"))

    def test_size_limit(self) -> None:
        """A file over 4 MiB is refused before it is read."""
        self.assertEqual(self.bad(b"#" * (MAX_FILE_BYTES + 1)),
                         f"bad.yaml: {MAX_FILE_BYTES + 1:,} bytes, larger than "
                         f"{MAX_FILE_BYTES:,} (4 MiB); deployment files are far smaller")

    def test_alias_bomb(self) -> None:
        """Aliases of aliases (a billion laughs) stop at the node budget, at once."""
        levels = ["a0: &a0 [x, x, x, x, x, x, x, x, x, x]"] + [
            f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 10)}]" for i in range(1, 9)]
        message = self.bad("\n".join(levels) + "\n")
        self.assertIn(f"more than {MAX_NODES:,} YAML nodes to read, counting each use of an "
                      "alias", message)

    def test_nesting_documents_and_nodes(self) -> None:
        """Nesting deeper than 64, more than 1,000 documents or 200,000 nodes: refused
        with the line where the limit was passed."""
        self.assertEqual(self.bad("a: " + "[" * 70 + "]" * 70 + "\n"),
                         "bad.yaml:1: YAML nested more than 64 deep; deployment manifests "
                         "nest far less")
        self.assertTrue(self.bad("---\na: 1\n" * 1001).startswith(
            "bad.yaml:2001: more than 1,000 YAML documents"))
        self.assertIn(f"more than {MAX_NODES:,} YAML nodes; deployment manifests hold far "
                      "fewer", self.bad("[" + "1, " * MAX_NODES + "1]\n"))

    def test_shell_syntax_and_encoding(self) -> None:
        """An unterminated quote names the script's line; bytes that are not UTF-8 name
        the file."""
        self.assertTrue(self.bad("echo hi\npython3 -m sglang.launch_server 'x\n", "run.sh")
                        .startswith("run.sh:2: shell syntax: unterminated single quote"))
        self.assertTrue(self.bad(b"\xff\xfe--tp-size 8\n", "x.args")
                        .startswith("x.args: not UTF-8 text (byte 0)"))

    def test_too_many_files(self) -> None:
        """More than 1,000 files found in directories are refused, naming the path."""
        with tempfile.TemporaryDirectory() as tmp:
            for i in range(MAX_FILES + 1):
                Path(tmp, f"{i}.args").write_text("--tp-size 1\n")
            with self.assertRaises(InputError) as caught:
                read_inputs([tmp])
        self.assertEqual(str(caught.exception), f"{tmp}: more than {MAX_FILES:,} files to "
                         "read; name fewer files or a narrower directory")

    def test_servers_arguments_pairs_and_nesting_bounded(self) -> None:
        """More than 1,000 servers, 4,096 arguments for one, 1,000 pairs or scripts
        nested more than 8 deep are refused, naming the file and line."""
        server = "python3 -m sglang.launch_server --disaggregation-mode"
        self.assertEqual(self.bad(f"{server} prefill\n" * 1001, "run.sh"),
                         "run.sh:1001: more than 1,000 SGLang servers to read; name fewer files")
        self.assertEqual(self.bad("--tp-size 1 " * 2049, "x.args"),
                         "x.args:1: more than 4,096 arguments for one server (check's limit)")
        services = [f"  s{i}:\n    command: {server} {role} --page-size {i}"
                    for role in ("prefill", "decode") for i in range(32)]
        self.assertTrue(self.bad("services:\n" + "\n".join(services) + "\n").endswith(
            "32 prefill and 32 decode shapes pair into more than 1,000 pairs; name fewer "
            "files or give each pair its own object"))
        script = f"{server} prefill"
        for _ in range(10):
            script = f"sh -c {shlex.quote(script)}"
        self.assertEqual(self.bad(script + "\n", "run.sh"),
                         "run.sh:1: scripts nested more than 8 deep (sh -c in sh -c ...); at "
                         "most that many are read")

    def test_stdin_and_no_path(self) -> None:
        """``-`` reads the stdin given; no path at all is an error naming -f."""
        inputs = stdin("--model-path /m --disaggregation-mode decode\n")
        self.assertEqual([(i.file, i.launcher, i.argv) for i in inputs.invocations],
                         [("<stdin>", "args", ("--model-path", "/m", "--disaggregation-mode",
                                               "decode"))])
        self.assertEqual(inputs.unpaired[0][1],
                         "no prefill server in <stdin> or the files named together")
        with self.assertRaises(InputError) as caught:
            read_inputs([])
        self.assertTrue(str(caught.exception).startswith("-f: no file named"))


class TestPurity(GuardTestCase):
    """The reader imports neither SGLang nor torch (only the standard library, PyYAML
    and its own package's modules)."""

    def test_imports(self) -> None:
        import ast
        import sys

        package = ROOT / "sglang_dsv4_guard" / "check" / "inputs"
        found = set()
        for path in package.glob("*.py"):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.Import):
                    found |= {a.name.split(".")[0] for a in node.names}
                elif isinstance(node, ast.ImportFrom) and node.module:
                    found.add(node.module if node.module.startswith("sglang_dsv4_guard")
                              else node.module.split(".")[0])
        ours = {m for m in found if m.startswith("sglang_dsv4_guard")}
        self.assertEqual(found - ours - set(sys.stdlib_module_names), {"yaml"})
        self.assertEqual({m for m in ours if not m.startswith("sglang_dsv4_guard.check.inputs")},
                         {"sglang_dsv4_guard.check.offline.parse"})


if __name__ == "__main__":
    unittest.main()
