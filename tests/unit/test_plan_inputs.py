"""The planner's input bounds (module_utils/revive_plan/inputs.py BOUNDS, docs/inputs.md): each value refused with
the input's name, its value and the allowed range, or accepted; bin/revive plan refuses generated bad values with
exit 2 and no traceback; vllm_plan through Ansible fails before the preflight writes a plan."""
from __future__ import annotations

import json
import os
import textwrap

import pytest
from fixtures.gpus import facts_file, lab_facts
from fixtures.models import write_model
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from revive_cli import plan as cli
from test_plan_module import run_play

from ansible.module_utils.revive_model import inspect_model
from ansible.module_utils.revive_plan import (
    Overrides,
    PackageSource,
    PlanInputError,
    PlanRefusal,
    PlanRequest,
    Serve,
    Workload,
    plan_release,
    synthetic_gpu_facts,
)
from ansible.module_utils.revive_plan.inputs import check_against_gpus
from ansible.module_utils.revive_releases import load_release_file

NAN, INF = float("nan"), float("inf")
REFUSED = [
    (Workload, "max_model_len", v) for v in (0, -5, 2 ** 31, 4096.0, True, "4096")
] + [
    (Workload, "concurrency", v) for v in (0, -1, 2 ** 31, 1.5, False, "32")
] + [
    (Workload, "slo_p95_e2e_s", v) for v in (0, 0.0, -1.0, NAN, INF, -INF, 1e7, True, "12")
] + [
    (Workload, "slo_output_tokens", v) for v in (0, -200, 2 ** 31, "200")
] + [
    (Workload, "typical_prompt_tokens", v) for v in (0, -1, 2 ** 31)
] + [
    (Workload, "metrics", v) for v in ("yes", 1)
] + [
    (Overrides, "tensor_parallel_size", v) for v in (-1, -8, 2 ** 31, 4.0, True, "4")
] + [
    (Overrides, "gpu_memory_utilization", v) for v in (0, 0.0, -0.5, 1.0001, 95, NAN, INF, "0.9")
] + [
    (Overrides, "max_num_seqs", v) for v in (0, -1, 2 ** 31, 64.0)
] + [
    (Overrides, "max_num_batched_tokens", v) for v in (-1, 2 ** 31, "8192")
] + [
    (Overrides, "swap_space", v) for v in (-1, -0.5, NAN, INF, 2 ** 21)
] + [
    (Overrides, "exclude_gpus", v) for v in ([-1], [1024], [True], ["3"], "3,5", 3)
] + [
    (Overrides, "vllm_version", v) for v in ("", 0.5)
] + [
    (Overrides, "allow_bf16_conversion", v) for v in ("no", 0)
] + [
    (Overrides, "allow_long_max_model_len", v) for v in ("yes", 1, None)
] + [
    (Serve, "base_port", v) for v in (0, -1, 65536, 8000.0, "8000")
] + [
    (Serve, "host", v) for v in ("", " ", None)
] + [
    (PackageSource, "type", v) for v in ("pypi", "")
]
ACCEPTED = [
    (Workload, "max_model_len", v) for v in (None, 1, 4096, 2 ** 31 - 1)
] + [
    (Workload, "concurrency", v) for v in (1, 32, 2 ** 31 - 1)
] + [
    (Workload, "slo_p95_e2e_s", v) for v in (1e-3, 12, 12.0, 1e6)
] + [
    (Overrides, "tensor_parallel_size", v) for v in (None, 0, 1, 8)  # 0: the planner chooses, as before
] + [
    (Overrides, "gpu_memory_utilization", v) for v in (None, 1e-6, 0.92, 1, 1.0)
] + [
    (Overrides, "max_num_batched_tokens", v) for v in (None, 0, 1, 8192)  # 0: the planner chooses, as before
] + [
    (Overrides, "swap_space", v) for v in (None, 0, 0.5, 16)
] + [
    (Overrides, "exclude_gpus", v) for v in ((), [], [0, 7], (3,))
] + [
    (Serve, "base_port", v) for v in (1, 8000, 65535)
] + [
    (PackageSource, "type", v) for v in ("index", "mirror", "wheelhouse")
]


@pytest.mark.parametrize("kind, name, value", REFUSED, ids=str)
def test_out_of_range_or_wrong_type_is_refused_naming_the_input(kind, name, value):
    section = {Workload: "workload", Overrides: "overrides", Serve: "serve", PackageSource: "package_source"}[kind]
    with pytest.raises(PlanInputError) as err:
        kind(**{name: value})
    assert err.value.field == f"{section}.{name}"
    message = err.value.message("--the-option")
    assert message.startswith(f"--the-option is {value!r}: it must be ") and "Fix: " in message
    assert str(err.value).startswith(f"{section}.{name} is ")


@pytest.mark.parametrize("kind, name, value", ACCEPTED, ids=str)
def test_in_range_is_accepted(kind, name, value):
    assert getattr(kind(**{name: value}), name) == value


def test_the_message_states_the_range_and_the_fix():
    with pytest.raises(PlanInputError) as err:
        Workload(max_model_len=-5)
    assert str(err.value) == ("workload.max_model_len is -5: it must be a whole number at least 1 and at most "
                              "2147483647 (and at most the model's maximum). Fix: give a value in that range, or "
                              "leave it out to let the planner choose")
    with pytest.raises(PlanInputError, match=r"^overrides.gpu_memory_utilization is 1.5: it must be a finite number "
                                             r"more than 0 and at most 1 \(a fraction"):
        Overrides(gpu_memory_utilization=1.5)


@pytest.mark.parametrize("ram", [0, -1, 2 ** 63, 1.5, True])
def test_host_ram_bytes_is_bounded(ram):
    with pytest.raises(PlanInputError, match="^host_ram_bytes is "):
        PlanRequest(Workload(), Overrides(), Serve(), ram, PackageSource())


@pytest.mark.parametrize("overrides, text", [
    (Overrides(exclude_gpus=[8]), "names GPU(s) [8] that this node does not have; its GPUs are [0, 1, 2, 3, 4, 5, "
                                  "6, 7]"),
    (Overrides(exclude_gpus=list(range(8))), "excludes every GPU of this node"),
    (Overrides(tensor_parallel_size=8, exclude_gpus=[7]), "tensor_parallel_size (--tensor-parallel-size) 8 is more "
                                                          "than the 7 GPU(s) this node has after exclusions. Fix: "
                                                          "set at most 7"),
])
def test_what_depends_on_the_gpus_is_a_refusal(overrides, text):
    with pytest.raises(PlanRefusal) as err:
        check_against_gpus(overrides, list(range(8)))
    assert text in err.value.reason


def test_the_last_replica_port_must_be_a_port(repo, tmp_path):
    model = write_model(str(tmp_path / "m"), "internlm2-chat-20b", dtype="F16", config_only=True)
    releases = load_release_file(str(repo / "data" / "vllm-releases.yml"))
    with pytest.raises(PlanInputError, match=r"^serve.base_port is 65535: it must be at most 65534 for 2 replicas"):
        plan_release(synthetic_gpu_facts(8, 32), inspect_model(model), releases, Workload(), Overrides(),
                     Serve(base_port=65535), 384 * 2 ** 30)


# --- bin/revive plan with generated bad values: exit 2, the option named, no traceback

@pytest.fixture(scope="module")
def model_config(tmp_path_factory):
    path = write_model(str(tmp_path_factory.mktemp("models") / "chat-20b-fp16"), "internlm2-chat-20b",
                       dtype="F16", config_only=True)
    return os.path.join(path, "config.json")


def _bad_numbers(low: float, high: float, whole: bool, zero_unsets: bool = False):
    below = st.integers(max_value=int(low) - 1) if whole else \
        st.floats(max_value=low, exclude_max=False, allow_nan=False, allow_infinity=False)
    if zero_unsets:
        below = below.filter(lambda v: v != 0)
    above = st.integers(min_value=int(high) + 1) if whole else st.floats(min_value=high, exclude_min=True)
    junk = st.sampled_from(["nan", "inf", "-inf", "yes", "", "1e400", "32k", "0x10", "four", "1,5"])
    fractions = st.floats(allow_nan=False, allow_infinity=False).filter(lambda v: not v.is_integer()).map(repr)
    return st.one_of(below.map(str), above.map(str), junk, *([fractions] if whole else []))


NUMERIC_OPTIONS = {
    "--max-model-len": _bad_numbers(1, 2 ** 31 - 1, True),
    "--concurrency": _bad_numbers(1, 2 ** 31 - 1, True),
    "--output-tokens": _bad_numbers(1, 2 ** 31 - 1, True),
    "--prompt-tokens": _bad_numbers(1, 2 ** 31 - 1, True),
    "--tensor-parallel-size": _bad_numbers(1, 2 ** 31 - 1, True, zero_unsets=True),
    "--max-num-seqs": _bad_numbers(1, 2 ** 31 - 1, True),
    "--max-num-batched-tokens": _bad_numbers(1, 2 ** 31 - 1, True, zero_unsets=True),
    "--slo-p95-s": st.one_of(_bad_numbers(0, 1e6, False), st.floats(max_value=0).map(repr)),
    "--gpu-memory-utilization": st.one_of(_bad_numbers(0, 1, False), st.floats(max_value=0).map(repr)),
    "--swap-space": _bad_numbers(-1e-9, 2 ** 20, False),
    "--host-ram-gib": _bad_numbers(-1e-9, 2 ** 32, False),
    "--exclude-gpus": st.one_of(st.integers(max_value=-1).map(str), st.integers(min_value=1024).map(str),
                                st.sampled_from(["x", "1,,x", "nan", "3;5", "-0x1"])),
}


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
@pytest.mark.parametrize("option", sorted(NUMERIC_OPTIONS))
def test_cli_refuses_bad_values_with_exit_2(capsys, model_config, option, data):
    value = data.draw(NUMERIC_OPTIONS[option], label=option)
    with pytest.raises(SystemExit) as exited:
        cli.main(["--model", model_config, "--gpus", "8x32", f"{option}={value}"])
    err = capsys.readouterr().err
    assert exited.value.code == 2, err
    assert f"argument {option}: {option} is " in err and "Traceback" not in err and "internal error" not in err


@pytest.mark.parametrize("argv, code, text", [
    (["--exclude-gpus", "8"], 1, "REFUSED: exclude_gpus (--exclude-gpus) names GPU(s) [8]"),
    (["--exclude-gpus", "0,1,2,3,4,5,6,7"], 1, "excludes every GPU of this node"),
    (["--tensor-parallel-size", "16"], 1, "tensor_parallel_size (--tensor-parallel-size) 16 is more than the 8"),
    (["--max-model-len", "100000"], 1, "max-model-len 100000 is above the model's derived 32768"),
    (["--gpus", "0x32"], 2, "--gpus 0x32: COUNT must be 1 to 1024 GPUs"),
    (["--gpus", "100000x32"], 2, "--gpus 100000x32: COUNT must be 1 to 1024 GPUs"),
])
def test_cli_refusals_that_need_the_gpus_or_the_model(capsys, model_config, argv, code, text):
    full = ["--model", model_config, "--gpus", "8x32"] + argv
    assert cli.main(full) == code
    err = capsys.readouterr().err
    assert text in err and "Traceback" not in err


def test_cli_unset_values_keep_their_meaning(capsys, model_config):
    """0 for --tensor-parallel-size, --max-num-batched-tokens and --host-ram-gib meant "not set" before: still."""
    assert cli.main(["--model", model_config, "--gpus", "8x32", "--json", "--tensor-parallel-size", "0",
                     "--max-num-batched-tokens", "0", "--host-ram-gib", "0"]) == 0
    with_zeros = json.loads(capsys.readouterr().out)
    assert cli.main(["--model", model_config, "--gpus", "8x32", "--json"]) == 0
    assert with_zeros == json.loads(capsys.readouterr().out)


# --- vllm_plan through Ansible: bad values fail the task (even with fail_on_refusal: false), no plan file follows

def test_module_refuses_bad_values_before_the_plan_is_written(repo, tmp_path):
    model = write_model(str(tmp_path / "m"), "llama-2-7b-chat", config_only=True)
    facts = facts_file(tmp_path, lab_facts("v100-pcie-8x"))
    plan_file = tmp_path / "out" / "plan.json"
    cases = [("workload", "{max_model_len: -5}"), ("workload", "{concurrency: 0}"),
             ("workload", "{slo_p95_e2e_s: .nan}"), ("overrides", "{gpu_memory_utilization: 1.5}"),
             ("overrides", "{max_num_seqs: yes}"), ("overrides", "{exclude_gpus: [-1]}"),
             ("serve", "{base_port: 70000}"), ("overrides", "{tensor_parallel: 4}"),
             ("workload", "{concurrency: \"32\", max_model_len: 0}")]
    tasks = "".join(textwrap.dedent(f"""\
        - name: Plan case {n}
          vllm_plan:
            gpu: "{{{{ lookup('ansible.builtin.file', '{facts}') | from_json }}}}"
            model: "{{{{ model_facts }}}}"
            releases: "{{{{ lookup('ansible.builtin.file', '{repo}/data/vllm-releases.yml') | from_yaml }}}}"
            {section}: {value}
            fail_on_refusal: false
          register: result_{n}
          ignore_errors: true
        - name: Write the plan as the preflight does (tasks/plan.yml), unless the plan failed
          ansible.builtin.copy:
            content: "{{{{ result_{n} | to_nice_json }}}}"
            dest: "{plan_file}.{n}"
            mode: "0644"
          when: result_{n} is not failed
        """) for n, (section, value) in enumerate(cases))
    inspect = textwrap.dedent(f"""\
        - name: Describe the model
          model_inspect:
            path: {model}
          register: inspected
        - name: Keep its facts
          ansible.builtin.set_fact:
            model_facts: "{{{{ inspected.model }}}}"
        """)
    (tmp_path / "out").mkdir()
    _, results = run_play(repo, tmp_path, inspect + tasks)
    planned = results[2::2]
    messages = [r["msg"] for r in planned]
    assert all(r["failed"] and r.get("refused") is not True for r in planned), messages
    assert messages[:7] == [
        "vllm_plan: workload.max_model_len is -5: it must be a whole number at least 1 and at most 2147483647 (and "
        "at most the model's maximum). Fix: give a value in that range, or leave it out to let the planner choose",
        "vllm_plan: workload.concurrency is 0: it must be a whole number at least 1 and at most 2147483647. Fix: "
        "give a value in that range",
        "vllm_plan: workload.slo_p95_e2e_s is nan: it must be a finite number more than 0 and at most 1000000. "
        "Fix: give a value in that range",
        "vllm_plan: overrides.gpu_memory_utilization is 1.5: it must be a finite number more than 0 and at most 1 "
        "(a fraction of each GPU's memory). Fix: give a value in that range, or leave it out to let the planner "
        "choose",
        "vllm_plan: overrides.max_num_seqs is True: it must be a whole number at least 1 and at most 2147483647. "
        "Fix: give a value in that range, or leave it out to let the planner choose",
        "vllm_plan: overrides.exclude_gpus is [-1]: it must be a list of GPU indices, each a whole number from 0 to "
        "1023. Fix: list the indices `bin/revive gpus` shows, e.g. [3, 5]",
        "vllm_plan: serve.base_port is 70000: it must be a whole number at least 1 and at most 65535 (a TCP port; "
        "replica N listens on base_port + N). Fix: give a value in that range",
    ]
    assert messages[7].startswith("Unsupported parameters for (vllm_plan) module: overrides.tensor_parallel. "
                                  "Supported parameters include: allow_bf16_conversion, allow_long_max_model_len, "
                                  "exclude_gpus, ")
    assert messages[8].startswith("vllm_plan: workload.max_model_len is 0:")  # "32" was converted, 0 refused
    assert os.listdir(tmp_path / "out") == []
