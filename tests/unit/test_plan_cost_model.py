"""The layout cost model orders layouts sensibly (its calibration against the field table: test_perf_calibration.py)."""
from __future__ import annotations

import pytest
from ansible.module_utils.revive_model import model_from_config
from ansible.module_utils.revive_plan.gpus import gpu_set_from_facts
from ansible.module_utils.revive_plan.inputs import Decisions
from ansible.module_utils.revive_plan.layout import describe_group, form_groups, predict_layout, transport_for
from fixtures.gpus import lab_facts
from fixtures.models import model_config


@pytest.fixture(scope="module")
def v100():
    return gpu_set_from_facts(lab_facts("v100-pcie-8x"), [], Decisions())


def predict(gpus, tp, streams, name="internlm2-chat-20b", p2p_disabled=True):
    model = model_from_config(model_config(name, dtype="F16"))
    group = describe_group(gpus, form_groups(gpus, tp)[0])
    transport = transport_for(group, p2p_disabled, p2p_disabled)
    return predict_layout(model, gpus, tp, transport, group.crosses_socket, streams, 256, 200, True,
                          model["weight_bytes"])


def test_tp8_all_reduce_crosses_sockets_and_tp4_does_not(v100):
    assert predict(v100, 8, 32).allreduce_latency_us == 15 + 14 * 7 + 8
    assert predict(v100, 4, 16).allreduce_latency_us == 15 + 6 * 7


def test_socket_local_tp4_pair_beats_one_tp8_for_20b(v100):
    tp8, tp4 = predict(v100, 8, 32), predict(v100, 4, 16)
    assert 2 * tp4.throughput_tok_s > 1.1 * tp8.throughput_tok_s
    assert tp4.e2e_p95_s < tp8.e2e_p95_s


def test_tp8_is_the_slowest_layout_for_a_7b_model(v100):
    by_tp = {tp: predict(v100, tp, 32 // (8 // tp), "llama-2-7b-chat").throughput_tok_s * (8 // tp)
             for tp in (1, 2, 4, 8)}
    assert min(by_tp, key=by_tp.get) in (1, 8)
    assert by_tp[8] < by_tp[2] and by_tp[8] < by_tp[4]


def test_nvlink_makes_tp8_cheap(v100):
    dgx = gpu_set_from_facts(lab_facts("dgx1-v100"), [], Decisions())
    assert predict(dgx, 8, 32, p2p_disabled=False).per_stream_tok_s > 1.4 * predict(v100, 8, 32).per_stream_tok_s


def test_groups_stay_within_sockets(v100):
    assert form_groups(v100, 4) == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert form_groups(v100, 2) == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert form_groups(v100, 8) == [list(range(8))]
    group = describe_group(v100, [0, 1, 2, 3])
    assert (group.slowest_path, group.crosses_socket, group.nvlink_any, group.host_paths) == ("PHB", False, False, True)
    assert describe_group(v100, list(range(8))).slowest_path == "SYS"
