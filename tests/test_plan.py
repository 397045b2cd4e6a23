"""The sizing worksheet against the seed article's worked example, bad inputs and properties."""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path

import pytest
import yaml
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from checkpoint_exporter.config import parse_config
from checkpoint_exporter.plan import human
from checkpoint_exporter.plan.worksheet import (
    INPUT_FIELDS,
    LIMITS,
    OUTPUT_KEYS,
    WORKED_EXAMPLE,
    PlanInputError,
    PlanInputs,
    PlanResult,
    compute,
    daly_interval,
    format_table,
    objectives_yaml,
    parse_inputs,
    servers_for,
    validate,
    young_interval,
)
from tests.conftest import run_cli, write_config

EXAMPLE = parse_inputs(WORKED_EXAMPLE)


def test_worked_example_table_and_sections_3_to_5() -> None:
    """Every number the article prints, at the precision it prints it."""
    result = compute(EXAMPLE)
    assert round(result.checkpoint_gb) == 1078
    assert round(result.per_server_gb, 2) == 134.75
    assert round(result.payload_per_job_gbps, 2) == 17.97
    assert round(result.payload_per_server_gbps, 2) == 2.25
    assert round(result.burst_gbps, 2) == 71.87
    assert round(result.average_gbps, 2) == 4.79
    assert round(result.service_gbps, 2) == 102.67
    assert result.link_units == 3
    assert round(result.degraded_capacity_gbps) == 100
    assert round(result.retained_usable_tb, 3) == 12.936
    assert round(result.peak_footprint_tb, 3) == 17.248
    assert round(result.provisioned_usable_tb, 2) == 21.56
    assert round(result.staging_per_server_gb, 1) == 269.5
    assert result.effective_transfer_seconds == 60


def test_worked_example_with_ten_seconds_of_overhead() -> None:
    result = compute(replace(EXAMPLE, overhead_seconds=10))
    assert result.effective_transfer_seconds == 50
    assert round(result.burst_gbps, 2) == 86.24
    assert round(result.service_gbps, 2) == 123.20
    # The window shrinks for every rate, not only the burst.
    assert round(result.payload_per_job_gbps, 2) == round(1078 / 50, 2)
    assert round(result.payload_per_server_gbps, 3) == round(134.75 / 50, 3)


def test_degraded_path_warning_matches_the_article() -> None:
    (warning,) = compute(EXAMPLE).warnings
    assert "100.00 GB/s remains" in warning and "still meets the 71.87 GB/s burst" in warning


def test_one_staged_image_by_default() -> None:
    inputs = parse_inputs(
        {k: v for k, v in WORKED_EXAMPLE.items() if k != "staged_generations_in_memory"}
    )
    assert round(compute(inputs).staging_per_server_gb, 2) == 134.75


def test_cli_json_reproduces_the_example() -> None:
    result = run_cli("plan", "--example", "--format", "json")
    assert result.returncode == 0, result.stderr
    out = json.loads(result.stdout)
    assert list(out)[: len(OUTPUT_KEYS)] == list(OUTPUT_KEYS)
    assert round(out["service_gbps"], 2) == 102.67 and out["link_units"] == 3
    assert out["young_interval_seconds"] is None and out["inference_load_seconds"] is None


def test_cli_table_shows_the_printed_numbers() -> None:
    result = run_cli("plan", "--example", "--overhead-seconds", "10")
    assert result.returncode == 0, result.stderr
    # Each in the unit that reads (1,078 GB is 1.08 TB); the JSON keeps the exact figures.
    for printed in (
        "1.08 TB",
        "134.75 GB",
        "21.56 GB/s",
        "86.24 GB/s",
        "123.20 GB/s",
        "12.94 TB",
        "17.25 TB",
        "21.56 TB",
        "269.50 GB",
    ):
        assert printed in result.stdout, printed


def test_cli_yaml_file_with_flag_override(tmp_path: Path) -> None:
    plan = write_config(
        tmp_path,
        "parameters: 70B\njobs: 4\nservers_per_job: 8\ntransfer_seconds: 1m\n"
        "interval_seconds: 15m\nmtbf_seconds: 3h\n",
        "plan.yaml",
    )
    result = run_cli("plan", "--config", str(plan), "--jobs", "2", "--format", "yaml")
    assert result.returncode == 0, result.stderr
    out = yaml.safe_load(result.stdout)
    assert out["inputs"]["jobs"] == 2 and out["inputs"]["transfer_seconds"] == 60
    assert round(out["burst_gbps"], 2) == round(2 * 1078 / 60, 2)
    assert out["young_interval_seconds"] == pytest.approx((2 * 60 * 10800) ** 0.5)


@pytest.mark.parametrize(
    ("flags", "named"),
    [
        (["--transfer-seconds", "0"], "transfer_seconds"),
        (["--transfer-seconds", "-5"], "transfer_seconds"),
        (["--overhead-seconds", "60"], "overhead_seconds"),
        (["--overhead-seconds", "75"], "overhead_seconds"),
        (["--utilization-ceiling", "0"], "utilization_ceiling"),
        (["--utilization-ceiling", "1.2"], "utilization_ceiling"),
        (["--parameters", "-1"], "parameters"),
        (["--bytes-per-parameter", "-2"], "bytes_per_parameter"),
        (["--jobs", "0"], "jobs"),
        (["--servers-per-job", "0"], "servers_per_job"),
        (["--jobs", "2.5"], "jobs"),
        (["--free-space-reserve", "1"], "free_space_reserve"),
        (["--mtbf-seconds", "0"], "mtbf_seconds"),
        (["--link-gbps", "nan"], "link_gbps"),
        (["--interval-seconds", "soon"], "interval_seconds"),
    ],
)
def test_invalid_inputs_exit_2_naming_the_input(flags: list[str], named: str) -> None:
    result = run_cli("plan", "--example", *flags)
    assert result.returncode == 2
    assert f"plan: {named} (--{named.replace('_', '-')})" in result.stderr
    assert result.stdout == ""


# Values no cluster has, for every input: too large for all of them, and too small for those a
# rate or a time is divided by. They made `plan` print inf or fail in math.ceil with a traceback.
ABSURD = [
    *((name, "1e308") for name in INPUT_FIELDS),
    *((name, 10**400) for name in INPUT_FIELDS),  # a YAML integer float() cannot hold
    *(
        (name, "1e-320")
        for name in (
            "parameters",
            "bytes_per_parameter",
            "transfer_seconds",
            "interval_seconds",
            "utilization_ceiling",
            "link_gbps",
            "mtbf_seconds",
            "save_seconds",
            "inference_bytes_per_parameter",
            "node_read_gbps",
        )
    ),
]


@pytest.mark.parametrize(("name", "value"), ABSURD, ids=lambda v: str(v)[:8])
def test_an_absurd_value_is_refused_naming_its_input(name: str, value: object) -> None:
    with pytest.raises(PlanInputError) as caught:
        parse_inputs({**WORKED_EXAMPLE, "mtbf_seconds": 3600, name: value})
    assert [named for named, _ in caught.value.problems] == [name]


@pytest.mark.parametrize("flags", [["--parameters", "1e308"], ["--link-gbps", "1e-320"]])
def test_cli_refuses_absurd_values_without_a_traceback(flags: list[str]) -> None:
    result = run_cli("plan", "--example", *flags)
    assert result.returncode == 2, result.stderr
    assert result.stderr.startswith(f"plan: {flags[0][2:].replace('-', '_')} ({flags[0]}): ")
    assert "Traceback" not in result.stderr and result.stdout == ""


def test_missing_and_unknown_inputs_are_all_reported(tmp_path: Path) -> None:
    plan = write_config(tmp_path, "parametres: 70e9\njobs: 0\n", "plan.yaml")
    result = run_cli("plan", "--config", str(plan))
    assert result.returncode == 2
    assert "did you mean 'parameters'?" in result.stderr
    for named in ("jobs", "parameters", "transfer_seconds", "interval_seconds"):
        assert f"plan: {named} " in result.stderr


def test_emit_objectives_is_a_valid_exporter_config(tmp_path: Path) -> None:
    result = run_cli("plan", "--example", "--emit-objectives", "--mtbf-seconds", "3h")
    assert result.returncode == 0, result.stderr
    assert "Daly's optimum" in result.stdout
    config = parse_config(result.stdout, "objectives", tmp_path)
    assert (config.defaults.interval, config.defaults.deadline) == (900, 60)
    assert config.defaults.retained_generations == 3


def test_daly_reproduces_his_validation_points() -> None:
    """Daly (2006), dump time 5 min: MTBF 24 h -> ~117 min, 6 h -> ~57 min, 15 min -> ~9.1 min."""
    for mtbf_hours, daly_minutes, young_minutes in ((24, 117, 120), (6, 57, 60), (0.25, 9.1, 12.2)):
        mtbf = mtbf_hours * 3600
        assert daly_interval(300, mtbf) / 60 == pytest.approx(daly_minutes, abs=0.5)
        assert young_interval(300, mtbf) / 60 == pytest.approx(young_minutes, abs=0.1)
    assert daly_interval(1000, 400) == 400  # a save longer than 2 x MTBF: checkpoint every MTBF


def test_waste_is_lowest_near_the_optimum() -> None:
    inputs = replace(EXAMPLE, mtbf_seconds=3 * 3600, save_seconds=20, restart_seconds=600)
    result = compute(inputs)
    assert result.optimal_waste_fraction < result.waste_fraction
    expected = 20 / 900 + (450 + 600) / 10800
    assert result.waste_fraction == pytest.approx(expected)
    far = compute(replace(inputs, interval_seconds=6 * 3600))
    assert any("Daly's optimum" in warning for warning in far.warnings)


def test_inference_load_time() -> None:
    result = compute(replace(EXAMPLE, node_read_gbps=5))
    assert result.inference_load_seconds == pytest.approx(140 / 5)  # 70B x 2 B = 140 GB


# --- properties ----------------------------------------------------------------------------------

positive = st.floats(min_value=1e-3, max_value=1e6, allow_nan=False, allow_infinity=False)
inputs_strategy = st.builds(
    PlanInputs,
    parameters=st.floats(min_value=1e6, max_value=1e13),
    bytes_per_parameter=st.floats(min_value=0.5, max_value=32),
    extra_fraction=st.floats(min_value=0, max_value=1),
    jobs=st.integers(min_value=1, max_value=512),
    servers_per_job=st.integers(min_value=1, max_value=4096),
    transfer_seconds=st.floats(min_value=1, max_value=3600),
    interval_seconds=st.floats(min_value=1, max_value=86400),
    utilization_ceiling=st.floats(min_value=0.01, max_value=1),
    retained_generations=st.integers(min_value=1, max_value=50),
    overhead_seconds=st.just(0.0),
    link_gbps=st.floats(min_value=1, max_value=3200),
    mtbf_seconds=st.floats(min_value=60, max_value=1e7),
)


@settings(max_examples=300, deadline=None)
@given(inputs_strategy)
def test_service_covers_the_burst_and_links_cover_the_service(inputs: PlanInputs) -> None:
    result = compute(inputs)
    assert result.service_gbps >= result.burst_gbps
    if inputs.interval_seconds >= inputs.transfer_seconds:
        assert result.burst_gbps >= result.average_gbps
    capacity = result.link_units * inputs.link_gbps / 8
    assert capacity >= result.service_gbps * (1 - 1e-9)
    assert result.degraded_capacity_gbps < result.service_gbps * (1 + 1e-9)  # no spare unit bought
    assert result.peak_footprint_tb > result.retained_usable_tb
    assert result.provisioned_usable_tb >= result.peak_footprint_tb
    assert result.daly_interval_seconds <= result.young_interval_seconds
    assert result.optimal_waste_fraction <= result.waste_fraction + 1e-12


@settings(max_examples=200, deadline=None)
@given(
    inputs_strategy, st.integers(min_value=1, max_value=64), st.floats(min_value=1.01, max_value=10)
)
def test_requirements_grow_with_jobs_and_size(
    inputs: PlanInputs, more_jobs: int, factor: float
) -> None:
    base = compute(inputs)
    bigger = compute(replace(inputs, jobs=inputs.jobs + more_jobs))
    larger = compute(replace(inputs, parameters=inputs.parameters * factor))
    for grown in (bigger, larger):
        assert grown.burst_gbps > base.burst_gbps
        assert grown.service_gbps > base.service_gbps
        assert grown.link_units >= base.link_units
        assert grown.peak_footprint_tb > base.peak_footprint_tb
    assert larger.per_server_gb > base.per_server_gb


@settings(max_examples=200, deadline=None)
@given(inputs_strategy, st.floats(min_value=0.01, max_value=0.99))
def test_overhead_only_raises_the_rates(inputs: PlanInputs, share: float) -> None:
    base = compute(inputs)
    squeezed = compute(replace(inputs, overhead_seconds=inputs.transfer_seconds * share))
    assert squeezed.burst_gbps > base.burst_gbps
    assert squeezed.payload_per_server_gbps > base.payload_per_server_gbps
    assert squeezed.average_gbps == base.average_gbps


def test_compute_refuses_invalid_inputs_directly() -> None:
    with pytest.raises(PlanInputError) as caught:
        compute(replace(EXAMPLE, transfer_seconds=10, overhead_seconds=10))
    assert caught.value.problems[0][0] == "overhead_seconds"


# Every input given, so that every output is computed (no overhead: any deadline leaves a window).
FULL_EXAMPLE = {
    **WORKED_EXAMPLE,
    "overhead_seconds": 0,
    "mtbf_seconds": 3 * 3600,
    "save_seconds": 20,
    "restart_seconds": 600,
    "node_read_gbps": 5,
}


def assert_finite_and_printable(result: PlanResult) -> None:
    """No output is inf or nan, and each format prints without error."""
    for key in OUTPUT_KEYS:
        value = getattr(result, key)
        assert value is None or math.isfinite(value), (key, value)
    json.dumps(result.to_dict(), allow_nan=False)
    format_table(result)
    objectives_yaml(result)


@settings(max_examples=300, deadline=None)
@given(
    st.sampled_from(sorted(INPUT_FIELDS)),
    st.one_of(st.floats(), st.integers(), st.floats().map(str), st.integers().map(str)),
)
def test_any_value_of_one_input_is_refused_by_name_or_gives_finite_outputs(
    name: str, value: object
) -> None:
    example = dict(FULL_EXAMPLE)
    if name == "gpus":  # the servers follow from the GPUs: the example's 8 would contradict them
        del example["servers_per_job"]
    try:
        inputs = parse_inputs({**example, name: value})
    except PlanInputError as error:
        assert [named for named, _ in error.problems] == [name]
        return
    assert_finite_and_printable(compute(inputs))


def within_limits(name: str) -> st.SearchStrategy[float]:
    least, most = LIMITS[name]
    if INPUT_FIELDS[name].metadata["kind"] == "count":
        return st.integers(int(least), int(most))
    return st.floats(least, most)


@settings(max_examples=300, deadline=None)
@given(
    st.fixed_dictionaries({name: within_limits(name) for name in LIMITS}),
    st.floats(0, 1, exclude_max=True),
    st.floats(0, 1, exclude_max=True),
)
def test_inputs_anywhere_within_the_limits_give_finite_outputs(
    values: dict[str, float], overhead_share: float, free_space_reserve: float
) -> None:
    """The limits are what keeps the arithmetic finite: at their corners at once too."""
    values["overhead_seconds"] = values["transfer_seconds"] * overhead_share
    values["free_space_reserve"] = free_space_reserve
    values["servers_per_job"] = servers_for(values["gpus"], values["gpus_per_server"])
    assume(not validate(values))  # the overhead may round up to the whole deadline
    assert_finite_and_printable(compute(PlanInputs(**values)))


# --- the question people ask: a model, GPUs and a storage rate -----------------------------------
#
# "A 70B model on 1,024 GPUs with a NAS at 20 GB/s: what deadline can I promise, what interval
# follows?" Worked by hand:
#   checkpoint   70e9 parameters x 14 B (bf16 weights 2 + fp32 master 4 + two fp32 Adam moments
#                4 + 4) x 1.10 (the 10 % allowance for other state) = 1.078e12 B = 1,078 GB
#   servers      1,024 GPUs / 8 a server = 128; 1,078 GB / 128 = 8.42 GB a server
#   deadline     the storage at the 70 % utilization ceiling takes 20 x 0.70 = 14 GB/s of writes:
#                1,078 GB / 14 GB/s = 77 s (no overhead), so service = burst / 0.70 = 20 GB/s
#   per server   8.421875 GB / 77 s = 0.109375 GB/s: 109.38 MB/s (not "0.11 GB/s")
#   MTBF         ~8 interruptions a day on 16,000 GPUs (Llama 3) is one per 16,000 x 24 / 8 =
#                48,000 GPU-hours; / 1,024 GPUs = 46.875 h = 168,750 s (1d 23h)
#   interval     Young: sqrt(2 x 77 s x 168,750 s) = sqrt(25,987,500) = 5,097.8 s (1h 25m)
#   waste        77 / 5,097.8 + 5,097.8 / 2 / 168,750 = 1.51 % + 1.51 % = 3.02 %
#   capacity     3 kept generations + 1 in progress: 4 x 1,078 GB = 4.312 TB; with 20 % kept free
#                4.312 / 0.8 = 5.39 TB usable
QUESTION = ("--storage-gbps", "20", "--gpus", "1024", "--parameters", "70B")
ASKED = {"parameters": "70B", "gpus": 1024, "storage_gbps": 20}


def test_the_question_people_ask_worked_by_hand() -> None:
    result = compute(parse_inputs(ASKED))
    assert result.checkpoint_gb == pytest.approx(1078)
    assert result.inputs.servers_per_job == 128
    assert result.per_server_gb == pytest.approx(8.421875)
    assert result.min_transfer_seconds == pytest.approx(77)
    assert result.planned_deadline_seconds == result.min_transfer_seconds
    assert result.burst_gbps == pytest.approx(14) and result.service_gbps == pytest.approx(20)
    assert result.payload_per_server_gbps == pytest.approx(0.109375)
    assert result.job_mtbf_seconds == 168_750 == SEED_JOB_MTBF
    assert result.save_cost_seconds == pytest.approx(77)  # the save takes what the storage allows
    assert result.young_interval_seconds == pytest.approx(5097.79, abs=0.01)
    assert result.planned_interval_seconds == result.young_interval_seconds
    assert result.waste_fraction == pytest.approx(0.0302, abs=1e-4)
    assert result.peak_footprint_tb == pytest.approx(4.312)
    assert result.provisioned_usable_tb == pytest.approx(5.39)


# The interval tests' MTBF for the same job, from the same figure (tests/e2e/test_interval.py).
SEED_JOB_MTBF = 86_400 * 16_000 / (8 * 1_024)


def test_cli_prints_the_achievable_deadline_and_interval_first() -> None:
    result = run_cli("plan", *QUESTION)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].startswith("sustain 20.00 GB/s"), lines[0]
    assert lines[1].startswith("provision 5.39 TB usable"), lines[1]
    assert lines[2].startswith("save every 1h 25m, deadline 1m 17s"), lines[2]
    assert "1,024 GPUs" in lines[2]  # where the MTBF came from
    assert "Checkpoint sizing worksheet" in result.stdout  # the worksheet follows
    for printed in ("1.08 TB", "8.42 GB", "109.38 MB/s", "211.46 MB/s", "5,097.8 s (1h 25m)"):
        assert printed in result.stdout, printed
    assert "0.11 GB/s" not in result.stdout and "0.21 GB/s" not in result.stdout


@pytest.mark.parametrize("parameters", ["70B", "7e10", "70e9", "70_000_000_000"])
def test_parameters_in_any_spelling_give_the_same_answer(parameters: str) -> None:
    result = run_cli("plan", *QUESTION[:4], "--parameters", parameters, "--format", "json")
    assert result.returncode == 0, result.stderr
    out = json.loads(result.stdout)
    assert out["checkpoint_gb"] == pytest.approx(1078)
    assert out["min_transfer_seconds"] == pytest.approx(77)


@pytest.mark.parametrize("fmt", ["json", "yaml"])
def test_json_and_yaml_carry_the_new_keys(fmt: str) -> None:
    result = run_cli("plan", *QUESTION, "--format", fmt)
    assert result.returncode == 0, result.stderr
    out = yaml.safe_load(result.stdout)  # JSON is YAML
    assert list(out)[: len(OUTPUT_KEYS)] == list(OUTPUT_KEYS)
    assert out["min_transfer_seconds"] == pytest.approx(77)
    assert out["planned_deadline_seconds"] == pytest.approx(77)
    assert out["save_cost_seconds"] == pytest.approx(77)
    assert out["job_mtbf_seconds"] == 168_750
    assert out["planned_interval_seconds"] == pytest.approx(5097.79, abs=0.01)
    inputs = out["inputs"]
    assert (inputs["storage_gbps"], inputs["gpus"], inputs["gpus_per_server"]) == (20, 1024, 8)
    assert inputs["servers_per_job"] == 128
    # What was not given stays null in the inputs: the outputs say what the plan made of it.
    assert inputs["transfer_seconds"] is None and inputs["interval_seconds"] is None


def test_without_storage_the_new_outputs_are_null_and_the_old_unchanged() -> None:
    result = compute(EXAMPLE)
    assert result.min_transfer_seconds is None and result.job_mtbf_seconds is None
    assert result.planned_deadline_seconds == 60 and result.planned_interval_seconds == 900
    assert result.save_cost_seconds == 60


def test_a_configured_interval_is_kept_and_youngs_shown_beside_it() -> None:
    result = run_cli("plan", *QUESTION, "--interval-seconds", "1h")
    assert result.returncode == 0, result.stderr
    first = result.stdout.splitlines()[2]
    assert first.startswith("save every 1h, deadline 1m 17s"), first
    assert "Young's would be 1h 25m" in first


def test_a_deadline_the_storage_cannot_meet_is_named_with_the_shortest_it_allows() -> None:
    # The worked example's four jobs at once: 4 x 1,078 GB / (50 GB/s x 0.70) = 123.2 s.
    result = compute(parse_inputs({**WORKED_EXAMPLE, "storage_gbps": 50}))
    assert result.min_transfer_seconds == pytest.approx(123.2)
    assert result.planned_deadline_seconds == 60  # the one asked for: kept, and warned about
    (storage,) = [w for w in result.warnings if w.startswith("storage_gbps")]
    assert "below the 102.67 GB/s service rate" in storage
    assert "shortest deadline it allows is 2m 4s" in storage  # 123.2 s rounded up, not down
    table = run_cli("plan", "--example", "--storage-gbps", "50")
    assert table.returncode == 0, table.stderr
    assert "deadline 1m, but the storage allows 2m 4s" in table.stdout.splitlines()[2]


def test_the_degraded_path_warning_never_says_nothing_remains() -> None:
    """A NAS at 20 GB/s needs one 400 Gb/s link unit: losing it is a single path lost, not
    "0.00 GB/s remains" below a service target."""
    result = compute(parse_inputs(ASKED))
    assert result.link_units == 1 and result.degraded_capacity_gbps == 0
    (path,) = [w for w in result.warnings if "link unit" in w]
    assert " 0.00 GB/s" not in path and "0 B/s" not in path and "remains" not in path
    assert "One 400 Gb/s link unit (50.00 GB/s) carries the whole 20.00 GB/s" in path
    # The NAS given as one link unit, as before storage_gbps existed: the same sentence.
    nas = compute(parse_inputs({**ASKED, "storage_gbps": None, "transfer_seconds": 77,
                                "link_gbps": 160}))  # fmt: skip
    (path,) = [w for w in nas.warnings if "link unit" in w]
    assert " 0.00 GB/s" not in path and "One 160 Gb/s link unit (20.00 GB/s)" in path


def test_gpus_make_the_servers_and_a_later_source_wins(tmp_path: Path) -> None:
    # 1,020 GPUs at 8 a server fill 127.5 servers: 128.
    assert parse_inputs({**ASKED, "gpus": 1020}).servers_per_job == 128
    assert parse_inputs({**ASKED, "gpus_per_server": 4}).servers_per_job == 256
    assert parse_inputs({**ASKED, "servers_per_job": 128}).servers_per_job == 128
    with pytest.raises(PlanInputError) as caught:
        parse_inputs({**ASKED, "servers_per_job": 64})
    ((name, reason),) = caught.value.problems
    assert name == "servers_per_job" and "1024 / gpus_per_server 8 = 128" in reason
    # --example's 8 servers give way to --gpus on the command line, a config's to a flag.
    example = run_cli("plan", "--example", "--gpus", "1024", "--format", "json")
    assert example.returncode == 0, example.stderr
    assert json.loads(example.stdout)["inputs"]["servers_per_job"] == 128
    per_server = run_cli("plan", "--example", "--gpus-per-server", "4", "--format", "json")
    assert json.loads(per_server.stdout)["inputs"]["servers_per_job"] == 8  # no GPUs to divide
    plan = write_config(
        tmp_path, "parameters: 70B\ngpus: 64\nstorage_gbps: 20\nmtbf_seconds: 2d\n", "plan.yaml"
    )
    flag = run_cli("plan", "--config", str(plan), "--servers-per-job", "2", "--format", "json")
    assert flag.returncode == 0, flag.stderr
    assert json.loads(flag.stdout)["inputs"]["servers_per_job"] == 2
    conflict = run_cli("plan", *QUESTION, "--servers-per-job", "64")
    assert conflict.returncode == 2
    assert "plan: servers_per_job (--servers-per-job)" in conflict.stderr


def test_what_cannot_be_derived_is_required_saying_what_would_derive_it() -> None:
    result = run_cli("plan", "--parameters", "70B")
    assert result.returncode == 2 and result.stdout == ""
    assert "plan: transfer_seconds (--transfer-seconds): is required, or give storage_gbps" in (
        result.stderr
    )
    assert "plan: interval_seconds (--interval-seconds): is required, or give mtbf_seconds" in (
        result.stderr
    )
    # A storage rate makes the deadline, an MTBF or GPUs the interval.
    assert run_cli("plan", "--parameters", "70B", "--storage-gbps", "20",
                   "--mtbf-seconds", "2d").returncode == 0  # fmt: skip


@pytest.mark.parametrize(
    ("flags", "said"),
    [
        (["--storage-gbs", "20"], "unrecognized arguments: --storage-gbs 20"),
        (["--gpu", "1024"], "ambiguous option: --gpu could match --gpus, --gpus-per-server"),
        (["70B"], "unrecognized arguments: 70B"),
        (["--format", "xml"], "argument --format: invalid choice: 'xml'"),
        (["--gpus"], "argument --gpus: expected one argument"),
    ],
)
def test_a_bad_flag_gets_plans_own_usage(flags: list[str], said: str) -> None:
    result = run_cli("plan", *QUESTION, *flags)
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr.startswith("usage: checkpoint-exporter plan "), result.stderr
    assert "--storage-gbps N" in result.stderr  # plan's flags, not the list of verbs
    assert f"checkpoint-exporter plan: error: {said}" in result.stderr


def test_an_unknown_flag_is_answered_with_the_nearest() -> None:
    result = run_cli("plan", *QUESTION, "--storage-gbs", "20", "--gpsu=8")
    assert result.returncode == 2
    assert "did you mean --storage-gbps for --storage-gbs, --gpus for --gpsu=8?" in result.stderr


def test_emit_objectives_from_the_question(tmp_path: Path) -> None:
    result = run_cli("plan", *QUESTION, "--emit-objectives")
    assert result.returncode == 0, result.stderr
    config = parse_config(result.stdout, "objectives", tmp_path)
    # The deadline rounds up (77 s is what the storage allows, never less), the interval to the
    # minute (Young's optimum is flat: a minute either way costs nothing measurable).
    assert (config.defaults.deadline, config.defaults.interval) == (77, 85 * 60)
    assert config.defaults.mtbf == 168_750


# --- numbers for people --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("gbps", "shown"),
    [(20, "20.00 GB/s"), (0.0123, "12.30 MB/s"), (0.109375, "109.38 MB/s"),
     (1234.5, "1.23 TB/s"), (0.0000005, "500.00 B/s"), (999.999, "1.00 TB/s")],
)  # fmt: skip
def test_rates_in_the_unit_that_reads(gbps: float, shown: str) -> None:
    assert human.rate(gbps) == shown


@pytest.mark.parametrize(
    ("gb", "shown"),
    [(1078, "1.08 TB"), (8.421875, "8.42 GB"), (0.5, "500.00 MB"), (21_560, "21.56 TB"),
     (5_000_000, "5.00 PB"), (0, "0 B")],
)  # fmt: skip
def test_sizes_in_the_unit_that_reads(gb: float, shown: str) -> None:
    assert human.size(gb) == shown


@pytest.mark.parametrize(
    ("seconds", "shown", "up"),
    [(5400, "1h 30m", False), (77, "1m 17s", False), (5097.79, "1h 25m", False),
     (168_750, "1d 23h", False), (3599.6, "1h", False), (45, "45s", False), (0.5, "0.5s", False),
     (60, "1m", False), (77.2, "1m 18s", True), (77.2, "1m 17s", False), (123.2, "2m 4s", True),
     (86_400 * 400, "1y 35d", False)],
)  # fmt: skip
def test_durations_as_people_say_them(seconds: float, shown: str, up: bool) -> None:
    assert human.duration(seconds, up=up) == shown


@settings(max_examples=200, deadline=None)
@given(
    st.floats(min_value=1e9, max_value=1e13),
    st.integers(min_value=1, max_value=100_000),
    st.floats(min_value=0.01, max_value=1e4),
    st.floats(min_value=1.01, max_value=10),
)
def test_faster_storage_shortens_the_deadline_and_the_interval(
    parameters: float, gpus: int, storage: float, factor: float
) -> None:
    inputs = {"parameters": parameters, "gpus": gpus, "storage_gbps": storage}
    base = compute(parse_inputs(inputs))
    faster = compute(parse_inputs({**inputs, "storage_gbps": storage * factor}))
    assert faster.min_transfer_seconds < base.min_transfer_seconds
    assert faster.planned_interval_seconds < base.planned_interval_seconds
    # At the shortest deadline the storage runs exactly at the ceiling.
    assert base.service_gbps == pytest.approx(storage)


@settings(max_examples=300, deadline=None)
@given(
    st.fixed_dictionaries({name: within_limits(name) for name in LIMITS}),
    st.floats(0, 1e9),
    st.booleans(),
)
def test_a_deadline_and_interval_derived_anywhere_within_the_limits_are_finite(
    values: dict[str, float], overhead: float, given_mtbf: bool
) -> None:
    """The storage makes the deadline and Young's the interval, at the limits' corners too."""
    del values["transfer_seconds"], values["interval_seconds"]
    if not given_mtbf:
        del values["mtbf_seconds"]  # the GPUs' share of gpu_mtbf_seconds instead
    values["overhead_seconds"] = overhead
    values["free_space_reserve"] = 0.2
    values["servers_per_job"] = servers_for(values["gpus"], values["gpus_per_server"])
    result = compute(PlanInputs(**values))
    assert_finite_and_printable(result)
    assert result.planned_deadline_seconds >= overhead
    assert result.planned_interval_seconds == result.young_interval_seconds


def test_an_input_refused_is_not_also_reported_missing() -> None:
    """--gpus 2.5 is refused; the interval it would have made is not reported missing too."""
    result = run_cli("plan", "--parameters", "70B", "--gpus", "2.5", "--storage-gbps", "1e9")
    assert result.returncode == 2
    assert sorted(line.split(" ")[1] for line in result.stderr.splitlines()) == [
        "gpus",
        "storage_gbps",
    ]
