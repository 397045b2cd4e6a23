"""The sizing worksheet: a model and a cluster in, the objectives the alerts enforce out.

Pure arithmetic over numbers (decimal units: GB = 1e9 bytes, TB = 1e12 bytes; single-direction
rates). Every rate ending in ``_gbps`` is gigabytes per second, except the input ``link_gbps``,
which is gigabits per second because that is how network links are sold (400 Gb/s = 50 GB/s).

The equations are the seed article's worksheet (its sections 3 to 5; README "Sizing worksheet"
has its worked example), with C the checkpoint and W the time left to move it:

    checkpoint_gb      C = parameters x bytes_per_parameter x (1 + extra_fraction)
    window             W = transfer_seconds (the deadline) - overhead_seconds
    burst_gbps         jobs x C / W: every job saving at once
    service_gbps       burst / utilization_ceiling: what to size the storage path for
    average_gbps       jobs x C / interval_seconds: the mean, not what to buy
    link_units         ceil(service / (link_gbps / 8)); with one lost, (units - 1) x link_gbps / 8
    peak_footprint_tb  jobs x (retained_generations + 1) x C: every job's next save in progress
    provisioned        peak / (1 - free_space_reserve)

The interval, with s the training-visible cost of a save, M the MTBF and R the restart time:
a job at interval T loses s / T to saving and, per failure, half an interval of work plus the
restart, so waste(T) = s / T + (T / 2 + R) / M. Its minimum is Young's (1974) T = sqrt(2 s M);
Daly (2006) carries the expansion further: sqrt(2 s M) (1 + sqrt(s / 2M) / 3 + s / 18M) - s,
and M itself once s >= 2M. The inference load time (the second seed article) is
parameters x inference_bytes_per_parameter / node_read_gbps.

The question people bring runs the other way: a model, a GPU count and a storage rate S in;
the deadline that storage allows and the interval that follows out (the same equations solved
for W and T):

    servers_per_job           ceil(gpus / gpus_per_server)
    min_transfer_seconds      jobs x C / (S x utilization_ceiling) + overhead_seconds
    planned_deadline_seconds  transfer_seconds, else min_transfer_seconds
    job_mtbf_seconds          mtbf_seconds, else gpu_mtbf_seconds / gpus
    save_cost_seconds         save_seconds, else min_transfer_seconds, else the deadline
    planned_interval_seconds  interval_seconds, else Young's for that save and MTBF
"""

from __future__ import annotations

import math
import re
import textwrap
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any

from checkpoint_exporter.plan import human
from checkpoint_exporter.schema import Field, Parser, Problems, shown
from checkpoint_exporter.units import format_duration, parse_duration

# A GPU's share of the interruptions of a large training job: Meta saw 419 unexpected ones in
# 54 days training Llama 3 on up to 16,384 H100s, about 8 a day on 16,000 GPUs, so one per
# 16,000 x 24 / 8 = 48,000 GPU-hours ("The Llama 3 Herd of Models", 2024; the second seed
# article scales it to a crash about every two days for 1,024 GPUs).
GPU_MTBF_SECONDS = 48_000 * 3600.0

NUMBER = "number"
COUNT = "count"  # a whole number
SECONDS = "seconds"  # also accepts a duration such as 15m
PARAMETERS = "parameters"  # also accepts 70B, 405B, 1.5T


def _input(
    help: str,
    unit: str = "",
    kind: str = NUMBER,
    default: float | None = None,
    required: bool = False,
    otherwise: str = "",
) -> Any:
    """``otherwise``: what the plan uses when the input is not given (for --help)."""
    metadata = {"help": help, "unit": unit, "kind": kind, "required": required}
    return field(default=default, metadata={**metadata, "otherwise": otherwise})


@dataclass(frozen=True)
class PlanInputs:
    """Worksheet inputs; names are the YAML keys of ``plan --config`` and, dashed, its flags."""

    parameters: float = _input("model parameters (70e9, 70B)", "", PARAMETERS, required=True)
    bytes_per_parameter: float = _input(
        "persisted bytes per parameter (14: bf16 weights + fp32 master + two Adam moments)",
        "B",
        default=14.0,
    )
    extra_fraction: float = _input(
        "allowance for other saved state and serialisation, as a fraction", default=0.10
    )
    jobs: int = _input("concurrent training jobs that may save at once", kind=COUNT, default=1)
    servers_per_job: int = _input(
        "servers each job's checkpoint is sharded over (follows from gpus when given)",
        kind=COUNT,
        default=1,
    )
    transfer_seconds: float | None = _input(
        "deadline: save start to durable commit",
        "s",
        SECONDS,
        otherwise="the shortest storage_gbps allows; required without it",
    )
    interval_seconds: float | None = _input(
        "time between checkpoint starts",
        "s",
        SECONDS,
        otherwise="Young's interval for the MTBF; required without mtbf_seconds or gpus",
    )
    utilization_ceiling: float = _input(
        "highest planned utilisation of the storage service, in (0, 1]", default=0.70
    )
    retained_generations: int = _input("committed generations kept per job", kind=COUNT, default=3)
    overhead_seconds: float = _input(
        "non-overlapping planning, metadata and commit time inside the deadline",
        "s",
        SECONDS,
        default=0.0,
    )
    link_gbps: float = _input(
        "one aggregate network path unit, in gigabits per second", "Gb/s", default=400.0
    )
    free_space_reserve: float = _input(
        "share of usable capacity kept free, in [0, 1)", default=0.20
    )
    staged_generations_in_memory: int = _input(
        "checkpoint images each server holds in host memory at once", kind=COUNT, default=1
    )
    mtbf_seconds: float | None = _input(
        "mean time between job interruptions (for Young / Daly)", "s", SECONDS
    )
    save_seconds: float | None = _input(
        "training-visible cost of one save (default: min_transfer_seconds with storage_gbps, "
        "else transfer_seconds; with async checkpointing give the blocking time)",
        "s",
        SECONDS,
    )
    restart_seconds: float = _input(
        "time to restart and reload after a failure", "s", SECONDS, default=0.0
    )
    inference_bytes_per_parameter: float = _input(
        "bytes per parameter an inference replica loads", "B", default=2.0
    )
    node_read_gbps: float | None = _input("one node's storage read bandwidth", "GB/s")
    storage_gbps: float | None = _input(
        "what the storage sustains for these checkpoint writes (all jobs saving at once), "
        "in gigabytes per second: the deadline follows",
        "GB/s",
    )
    gpus: int | None = _input(
        "GPUs each job trains on: the servers and the MTBF follow", kind=COUNT
    )
    gpus_per_server: int = _input("GPUs in one server", kind=COUNT, default=8)
    gpu_mtbf_seconds: float = _input(
        "GPU-time between interruptions: with gpus and no mtbf_seconds, the job's MTBF is "
        "this / gpus",
        "s",
        SECONDS,
        default=GPU_MTBF_SECONDS,
        otherwise="default 48000h: Llama 3's ~8 interruptions a day on 16,000 GPUs",
    )


INPUT_FIELDS = {f.name: f for f in fields(PlanInputs)}

# Keys of the JSON / YAML output, in the order DESIGN.md lists them.
OUTPUT_KEYS = (
    "checkpoint_gb",
    "per_server_gb",
    "payload_per_job_gbps",
    "payload_per_server_gbps",
    "burst_gbps",
    "service_gbps",
    "average_gbps",
    "effective_transfer_seconds",
    "link_units",
    "degraded_capacity_gbps",
    "retained_usable_tb",
    "peak_footprint_tb",
    "provisioned_usable_tb",
    "staging_per_server_gb",
    "young_interval_seconds",
    "daly_interval_seconds",
    "waste_fraction",
    "optimal_waste_fraction",
    "inference_load_seconds",
    # The question people bring (storage_gbps, gpus): extends the list, renames nothing.
    "min_transfer_seconds",
    "planned_deadline_seconds",
    "save_cost_seconds",
    "job_mtbf_seconds",
    "planned_interval_seconds",
)

# The seed article's worked example: four 70B jobs on 32 servers (its sections 3 to 5).
WORKED_EXAMPLE: dict[str, float] = {
    "parameters": 70e9,
    "bytes_per_parameter": 14,
    "extra_fraction": 0.10,
    "jobs": 4,
    "servers_per_job": 8,
    "transfer_seconds": 60,
    "interval_seconds": 900,
    "utilization_ceiling": 0.70,
    "retained_generations": 3,
    "link_gbps": 400,
    "free_space_reserve": 0.20,
    "staged_generations_in_memory": 2,
}


# The least and most of each input that any real cluster comes near. Beyond them a value is a
# typo (an exponent too many or too few), and within them every output stays finite, so the
# worksheet names the input instead of printing inf or failing in math.ceil.
_SECONDS = (1e-3, 1e9)  # a millisecond to some 30 years
LIMITS: dict[str, tuple[float, float]] = {
    "parameters": (1, 1e15),  # the largest models trained have ~2e12; 1e15 is 500x that
    "bytes_per_parameter": (0.01, 1e3),  # 1-bit weights are 0.125 B; fp32 + Adam + EMA ~20 B
    "extra_fraction": (0, 100),  # other state a hundred times the model's own
    "jobs": (1, 1e6),  # counts: config's MAX_COUNT, beyond the largest clusters' ~1e5 GPUs
    "servers_per_job": (1, 1e6),
    "transfer_seconds": _SECONDS,
    "interval_seconds": _SECONDS,
    "utilization_ceiling": (0.01, 1),  # below 1 %, the storage is sized for 100x the burst
    "retained_generations": (1, 1e6),
    "overhead_seconds": (0, _SECONDS[1]),
    "link_gbps": (1e-3, 1e6),  # 1 Mb/s to 1 Pb/s per unit; links sold today are 400-800 Gb/s
    "staged_generations_in_memory": (0, 1e6),
    "mtbf_seconds": _SECONDS,
    "save_seconds": _SECONDS,
    "restart_seconds": (0, _SECONDS[1]),
    "inference_bytes_per_parameter": (0.01, 1e3),
    "node_read_gbps": (1e-3, 1e6),  # 1 MB/s to 1 PB/s; a node of NVMe drives reads ~50 GB/s
    "storage_gbps": (1e-3, 1e6),  # a USB disk to some 20x the largest parallel filesystems
    "gpus": (1, 1e6),
    "gpus_per_server": (1, 1e4),  # a rack-scale domain (72 GPUs) counted as one server and more
    "gpu_mtbf_seconds": _SECONDS,  # up to ~32 years a GPU; the figure above is 5.5
}


class PlanInputError(ValueError):
    """Invalid worksheet inputs; ``problems`` holds (input name, reason) pairs."""

    def __init__(self, problems: list[tuple[str, str]]):
        super().__init__("; ".join(f"{name}: {reason}" for name, reason in problems))
        self.problems = problems


@dataclass(frozen=True)
class PlanResult:
    inputs: PlanInputs
    checkpoint_gb: float
    per_server_gb: float
    payload_per_job_gbps: float
    payload_per_server_gbps: float
    burst_gbps: float
    service_gbps: float
    average_gbps: float
    effective_transfer_seconds: float
    link_units: int
    degraded_capacity_gbps: float
    retained_usable_tb: float
    peak_footprint_tb: float
    provisioned_usable_tb: float
    staging_per_server_gb: float
    young_interval_seconds: float | None
    daly_interval_seconds: float | None
    waste_fraction: float | None
    optimal_waste_fraction: float | None
    inference_load_seconds: float | None
    min_transfer_seconds: float | None
    planned_deadline_seconds: float
    save_cost_seconds: float
    job_mtbf_seconds: float | None
    planned_interval_seconds: float
    warnings: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {key: getattr(self, key) for key in OUTPUT_KEYS}
        out["warnings"] = list(self.warnings)
        out["inputs"] = asdict(self.inputs)
        return out


# --- inputs ------------------------------------------------------------------------------------

_SCALE = {"K": 1e3, "M": 1e6, "B": 1e9, "T": 1e12}


def _number(value: object, kind: str) -> float:
    if isinstance(value, bool):
        raise ValueError(f"expected a number, got {value!r}")
    if isinstance(value, (int, float)):
        try:
            number = float(value)
        except OverflowError:  # an integer of more than 308 digits
            raise ValueError(f"must be a finite number, got {shown(value)}") from None
    elif isinstance(value, str):
        text = value.strip().replace("_", "").replace(",", "")
        match = re.fullmatch(r"([0-9.eE+-]+)([KMBT])", text) if kind == PARAMETERS else None
        try:
            if match:
                number = float(match.group(1)) * _SCALE[match.group(2)]
            elif kind == SECONDS and re.search(r"[a-z]$", text):
                number = parse_duration(text)
            else:
                number = float(text)
        except ValueError:
            hint = {SECONDS: " or a duration such as 15m", PARAMETERS: " such as 70e9 or 70B"}
            raise ValueError(f"expected a number{hint.get(kind, '')}, got {value!r}") from None
    else:
        raise ValueError(f"expected a number, got {type(value).__name__}")
    if not math.isfinite(number):
        raise ValueError(f"must be a finite number, got {value!r}")
    if kind == COUNT:
        if number != int(number):
            raise ValueError(f"must be a whole number, got {value!r}")
        return int(number)
    return number


def _parser(kind: str) -> Parser:
    return lambda value: _number(value, kind)


# The schema of ``plan --config`` and the flags: every input is a number of some kind.
_FIELDS = tuple(Field(name, _parser(spec.metadata["kind"])) for name, spec in INPUT_FIELDS.items())


def overlay(base: Mapping[str, object], layer: Mapping[str, object]) -> dict[str, object]:
    """``base`` with ``layer``'s inputs over it (--example, then --config, then flags).

    A layer that gives the servers one way replaces the other way from below, so
    ``--example --gpus 1024`` plans 128 servers rather than refusing the example's 8.
    """
    out = dict(base)
    given = {name for name, value in layer.items() if value is not None}
    # gpus_per_server alone says nothing of the servers: it only divides gpus.
    for says, other in (("gpus", "servers_per_job"), ("servers_per_job", "gpus")):
        if says in given and other not in given:
            out.pop(other, None)
    out.update(layer)
    return out


def servers_for(gpus: int, gpus_per_server: int) -> int:
    return math.ceil(gpus / gpus_per_server)


def parse_inputs(raw: Mapping[str, object]) -> PlanInputs:
    """Inputs from YAML keys or flags; reports every bad, missing or unknown input at once.

    An input given as None (a flag not given, an empty YAML value) counts as absent. With
    ``gpus``, ``servers_per_job`` follows from them unless it is given too (then they must agree).
    """
    given = {
        str(name): value
        for name, value in raw.items()
        if not (value is None and name in INPUT_FIELDS)
    }
    checker = Problems("")
    values = checker.check(given, (), _FIELDS, noun="input", list_known=False)
    problems = [(problem.key, problem.reason) for problem in checker.found]
    for name, spec in INPUT_FIELDS.items():
        if spec.metadata["required"] and name not in given:
            problems.append((name, "is required"))
    # An input given but refused is not also missing, nor what it would have derived.
    problems += validate(values) + underdetermined({**given, **values})
    if problems:
        raise PlanInputError(problems)
    if values.get("gpus") is not None and "servers_per_job" not in values:
        per_server = values.get("gpus_per_server", INPUT_FIELDS["gpus_per_server"].default)
        values["servers_per_job"] = servers_for(values["gpus"], per_server)
    return PlanInputs(**values)


def underdetermined(values: Mapping[str, Any]) -> list[tuple[str, str]]:
    """The deadline and the interval: each given, or something given that they follow from."""
    problems = []
    if values.get("transfer_seconds") is None and values.get("storage_gbps") is None:
        problems.append(
            ("transfer_seconds", "is required, or give storage_gbps and the shortest deadline "
             "it allows is planned")
        )  # fmt: skip
    if values.get("interval_seconds") is None and not (
        values.get("mtbf_seconds") is not None or values.get("gpus") is not None
    ):
        problems.append(
            ("interval_seconds", "is required, or give mtbf_seconds (or gpus, for an MTBF) and "
             "Young's interval is planned")
        )  # fmt: skip
    return problems


def validate(values: Mapping[str, Any]) -> list[tuple[str, str]]:
    """Every reason the given inputs cannot describe a real cluster, by input name.

    Inputs absent from ``values`` (or None) are not checked, so a missing input does not hide
    the problems of the others; each input's first problem is the one reported.
    """
    problems: list[tuple[str, str]] = []

    def need(name: str, check: Callable[[float], bool], reason: str) -> None:
        value = values.get(name)
        if value is None or any(name == named for named, _ in problems):
            return
        if not check(value):
            problems.append((name, f"{reason}, got {shown(value)}"))

    def positive(value: float) -> bool:
        return value > 0

    def not_negative(value: float) -> bool:
        return value >= 0

    def at_least_one(value: float) -> bool:
        return value >= 1

    need("parameters", positive, "must be greater than zero")
    need("bytes_per_parameter", positive, "must be greater than zero")
    need("extra_fraction", not_negative, "must not be negative")
    need("jobs", at_least_one, "must be at least 1")
    need("servers_per_job", at_least_one, "must be at least 1")
    need("transfer_seconds", positive, "the deadline must be greater than zero")
    need("interval_seconds", positive, "must be greater than zero")
    need("utilization_ceiling", lambda v: 0 < v <= 1, "must be above 0 and at most 1")
    need("retained_generations", at_least_one, "must be at least 1")
    need("overhead_seconds", not_negative, "must not be negative")
    deadline = values.get("transfer_seconds")
    if deadline is not None and deadline > 0:
        need(
            "overhead_seconds",
            lambda v: v < deadline,
            f"must be shorter than the deadline (transfer_seconds {deadline:g}): "
            "no time would be left to transfer",
        )
    need("link_gbps", positive, "must be greater than zero")
    need("free_space_reserve", lambda v: 0 <= v < 1, "must be at least 0 and below 1")
    need("staged_generations_in_memory", not_negative, "must not be negative")
    need("mtbf_seconds", positive, "must be greater than zero")
    need("save_seconds", positive, "must be greater than zero")
    need("node_read_gbps", positive, "must be greater than zero")
    need("storage_gbps", positive, "must be greater than zero")
    need("gpus", at_least_one, "must be at least 1")
    need("gpus_per_server", at_least_one, "must be at least 1")
    need("gpu_mtbf_seconds", positive, "must be greater than zero")
    need("restart_seconds", not_negative, "must not be negative")
    need("inference_bytes_per_parameter", positive, "must be greater than zero")
    for name, (least, most) in LIMITS.items():
        unit = INPUT_FIELDS[name].metadata["unit"]
        need(
            name,
            lambda v, least=least, most=most: least <= v <= most,
            f"must be between {_limit(least)} and {_limit(most)}{' ' + unit if unit else ''}",
        )
    gpus = values.get("gpus")
    per_server = values.get("gpus_per_server") or INPUT_FIELDS["gpus_per_server"].default
    if not any(named in ("gpus", "gpus_per_server") for named, _ in problems) and gpus:
        servers = servers_for(gpus, per_server)
        need(
            "servers_per_job",
            lambda v: v == servers,
            f"disagrees with gpus {gpus} / gpus_per_server {per_server} = {servers} servers: "
            "give one or the other",
        )
    return problems


def _limit(value: float) -> str:
    """1e15 rather than 1e+15 or 1,000,000,000,000,000."""
    if value < 1e6:
        return f"{value:g}"
    mantissa, exponent = f"{value:.0e}".split("e")
    return f"{mantissa}e{int(exponent)}"


# --- arithmetic --------------------------------------------------------------------------------


def young_interval(save_seconds: float, mtbf_seconds: float) -> float:
    """Young (1974): sqrt(2 x save x MTBF), first order."""
    return math.sqrt(2 * save_seconds * mtbf_seconds)


def daly_interval(save_seconds: float, mtbf_seconds: float) -> float:
    """Daly (2006): the higher-order optimum; MTBF itself once a save takes 2 x MTBF or more."""
    if save_seconds >= 2 * mtbf_seconds:
        return mtbf_seconds
    ratio = save_seconds / (2 * mtbf_seconds)
    return (
        math.sqrt(2 * save_seconds * mtbf_seconds) * (1 + math.sqrt(ratio) / 3 + ratio / 9)
        - save_seconds
    )


def waste_fraction(
    save_seconds: float, interval_seconds: float, mtbf_seconds: float, restart_seconds: float
) -> float:
    """Share of GPU time lost: saving, plus on each failure half an interval of lost work and
    the restart."""
    return save_seconds / interval_seconds + (interval_seconds / 2 + restart_seconds) / mtbf_seconds


def storage_window(inputs: PlanInputs, checkpoint_gb: float) -> float | None:
    """The shortest transfer the storage allows: every job's checkpoint through storage_gbps
    at the utilization ceiling (the deadline adds the overhead that does not overlap it)."""
    if inputs.storage_gbps is None:
        return None
    return inputs.jobs * checkpoint_gb / (inputs.storage_gbps * inputs.utilization_ceiling)


def job_mtbf(inputs: PlanInputs) -> float | None:
    """mtbf_seconds, else the GPUs' share: interruptions grow with the GPUs a job holds."""
    if inputs.mtbf_seconds is not None:
        return inputs.mtbf_seconds
    return inputs.gpu_mtbf_seconds / inputs.gpus if inputs.gpus else None


def compute(inputs: PlanInputs) -> PlanResult:
    problems = validate(asdict(inputs)) + underdetermined(asdict(inputs))
    if problems:
        raise PlanInputError(problems)
    checkpoint_gb = (
        inputs.parameters * inputs.bytes_per_parameter / 1e9 * (1 + inputs.extra_fraction)
    )
    per_server_gb = checkpoint_gb / inputs.servers_per_job
    fastest = storage_window(inputs, checkpoint_gb)
    shortest = None if fastest is None else fastest + inputs.overhead_seconds
    if inputs.transfer_seconds is not None:
        deadline = inputs.transfer_seconds
        window = deadline - inputs.overhead_seconds
    elif fastest is not None and shortest is not None:
        # Not shortest - overhead: a window a billionth of the overhead would round to zero.
        deadline, window = shortest, fastest
    else:
        raise PlanInputError(underdetermined(asdict(inputs)))
    burst = inputs.jobs * checkpoint_gb / window
    service = burst / inputs.utilization_ceiling
    unit_gbytes = inputs.link_gbps / 8
    # The tolerance keeps float noise (3.0000000001 units) from buying a whole extra link.
    link_units = max(1, math.ceil(service / unit_gbytes - 1e-9))
    peak_tb = inputs.jobs * (inputs.retained_generations + 1) * checkpoint_gb / 1000
    # A save takes what the storage allows, whatever deadline is promised for it.
    save = next(s for s in (inputs.save_seconds, shortest, deadline) if s is not None)
    mtbf = job_mtbf(inputs)
    young = young_interval(save, mtbf) if mtbf else None
    interval = inputs.interval_seconds if inputs.interval_seconds is not None else young
    if interval is None:
        raise PlanInputError(underdetermined(asdict(inputs)))
    result = PlanResult(
        inputs=inputs,
        checkpoint_gb=checkpoint_gb,
        per_server_gb=per_server_gb,
        payload_per_job_gbps=checkpoint_gb / window,
        payload_per_server_gbps=per_server_gb / window,
        burst_gbps=burst,
        service_gbps=service,
        average_gbps=inputs.jobs * checkpoint_gb / interval,
        effective_transfer_seconds=window,
        link_units=link_units,
        degraded_capacity_gbps=(link_units - 1) * unit_gbytes,
        retained_usable_tb=inputs.jobs * inputs.retained_generations * checkpoint_gb / 1000,
        peak_footprint_tb=peak_tb,
        provisioned_usable_tb=peak_tb / (1 - inputs.free_space_reserve),
        staging_per_server_gb=per_server_gb * inputs.staged_generations_in_memory,
        young_interval_seconds=young,
        daly_interval_seconds=daly_interval(save, mtbf) if mtbf else None,
        waste_fraction=(
            waste_fraction(save, interval, mtbf, inputs.restart_seconds) if mtbf else None
        ),
        optimal_waste_fraction=(
            waste_fraction(save, young, mtbf, inputs.restart_seconds) if mtbf and young else None
        ),
        inference_load_seconds=(
            inputs.parameters * inputs.inference_bytes_per_parameter / 1e9 / inputs.node_read_gbps
            if inputs.node_read_gbps
            else None
        ),
        min_transfer_seconds=shortest,
        planned_deadline_seconds=deadline,
        save_cost_seconds=save,
        job_mtbf_seconds=mtbf,
        planned_interval_seconds=interval,
    )
    return _with_warnings(result)


def _with_warnings(result: PlanResult) -> PlanResult:
    warnings = [
        warning
        for warning in (
            _overlap_warning(result),
            _storage_warning(result),
            _degraded_warning(result),
            _daly_warning(result),
        )
        if warning
    ]
    return replace(result, warnings=tuple(warnings))


def _interval_name(result: PlanResult) -> str:
    given = result.inputs.interval_seconds is not None
    return "interval_seconds" if given else "Young's interval"


def _overlap_warning(result: PlanResult) -> str | None:
    if result.planned_interval_seconds >= result.planned_deadline_seconds:
        return None
    return (
        f"{_interval_name(result)} ({human.duration(result.planned_interval_seconds)}) is "
        f"shorter than the deadline ({human.duration(result.planned_deadline_seconds)}): a new "
        "save starts before the last must be durable, so saves can pile up."
    )


def _storage_warning(result: PlanResult) -> str | None:
    """A deadline the storage cannot meet at the ceiling, with the shortest it can."""
    inputs, shortest = result.inputs, result.min_transfer_seconds
    storage = inputs.storage_gbps
    if storage is None or shortest is None or result.service_gbps <= storage * (1 + 1e-9):
        return None
    text = (
        f"storage_gbps ({human.rate(storage)}) is below the {human.rate(result.service_gbps)} "
        f"service rate the {human.duration(result.planned_deadline_seconds)} deadline needs at "
        f"the {inputs.utilization_ceiling:.0%} utilization ceiling: the shortest deadline it "
        f"allows is {human.duration(shortest, up=True)} (min_transfer_seconds)."
    )
    if result.burst_gbps > storage:
        flat_out = inputs.jobs * result.checkpoint_gb / storage + inputs.overhead_seconds
        text += f" Even with all of it the saves take {human.duration(flat_out, up=True)}."
    return text


def _degraded_warning(result: PlanResult) -> str | None:
    """One aggregate-path unit lost. The storage rate is a limit of its own (storage_gbps),
    never a link unit, and a single unit lost is a path lost, not "0 GB/s remains"."""
    if result.degraded_capacity_gbps >= result.service_gbps:
        return None
    decide = (
        "Decide whether a degraded system must meet the original deadline, a relaxed one, or "
        "only stay correct"
    )
    link = result.inputs.link_gbps
    if result.link_units == 1:
        return (
            f"One {link:g} Gb/s link unit ({human.rate(link / 8)}) carries the whole "
            f"{human.rate(result.service_gbps)} service rate: with it lost, no path to the "
            f"storage is left. {decide}; a second unit keeps saves going."
        )
    meets = "still meets" if result.degraded_capacity_gbps >= result.burst_gbps else "misses"
    return (
        f"With one of {result.link_units} link units lost, "
        f"{human.rate(result.degraded_capacity_gbps)} remains: below the "
        f"{human.rate(result.service_gbps)} service target, and it {meets} the "
        f"{human.rate(result.burst_gbps)} burst. {decide}."
    )


def _daly_warning(result: PlanResult) -> str | None:
    daly, interval = result.daly_interval_seconds, result.planned_interval_seconds
    if not daly or 0.5 <= interval / daly <= 2:
        return None
    return (
        f"{_interval_name(result)} ({human.duration(interval)}) is {interval / daly:.1f}x "
        f"Daly's optimum ({human.duration(daly)}): {result.waste_fraction:.1%} of GPU time "
        f"lost against {result.optimal_waste_fraction:.1%} near the optimum."
    )


# --- presentation ------------------------------------------------------------------------------


def config_deadline(result: PlanResult) -> float:
    """The deadline for the exporter config: as given, or the storage's shortest rounded up to
    the second (a deadline shorter than the storage allows would be missed every save)."""
    if result.inputs.transfer_seconds is not None:
        return result.inputs.transfer_seconds
    return float(math.ceil(result.planned_deadline_seconds - 1e-9))


def config_interval(result: PlanResult) -> float:
    """The interval for the exporter config: as given, or Young's to the minute (to the second
    under ten minutes). The optimum is flat: a minute either way costs nothing measurable."""
    interval = result.planned_interval_seconds
    if result.inputs.interval_seconds is not None:
        return interval
    return float(round(interval / 60) * 60 if interval >= 600 else max(1, round(interval)))


def objectives_yaml(result: PlanResult) -> str:
    """A ``defaults:`` block for the exporter config: the interval and deadline planned here,
    and the MTBF they assume (the recording rules judge the interval against it)."""
    inputs = result.inputs
    mtbf = result.job_mtbf_seconds
    lines = ["# From `checkpoint-exporter plan`: paste into the exporter config."]
    if result.daly_interval_seconds and mtbf:
        lines.append(
            f"# Daly's optimum for a {human.duration(result.save_cost_seconds)} save and an MTBF "
            f"of {human.duration(mtbf)} is {format_duration(round(result.daly_interval_seconds))}."
        )
    lines += [
        "defaults:",
        f"  interval: {format_duration(config_interval(result))}",
        f"  deadline: {format_duration(config_deadline(result))}",
    ]
    if mtbf:
        lines.append(f"  mtbf: {format_duration(max(1, round(mtbf)))}")
    lines += [
        f"  retained_generations: {inputs.retained_generations}",
        f"  capacity_reserve: {inputs.free_space_reserve:g}",
    ]
    return "\n".join(lines) + "\n"


def _mtbf_source(result: PlanResult) -> str:
    inputs = result.inputs
    if inputs.mtbf_seconds is None and inputs.gpus:
        return f" from {inputs.gpus:,} GPUs"
    return ""


def summary(result: PlanResult) -> list[str]:
    """The answer in three lines: the storage rate, the capacity, the interval and deadline."""
    inputs = result.inputs
    jobs = f"{inputs.jobs:,} jobs x " if inputs.jobs > 1 else ""
    storage, kept = inputs.storage_gbps, inputs.retained_generations
    other = storage is not None and not math.isclose(storage, result.service_gbps, rel_tol=1e-9)
    return [
        f"sustain {human.rate(result.service_gbps)}   {jobs}{human.size(result.checkpoint_gb)} "
        f"in {human.duration(result.effective_transfer_seconds)} = "
        f"{human.rate(result.burst_gbps)}, kept to {inputs.utilization_ceiling:.0%} of the "
        f"storage" + (f"; storage_gbps is {human.rate(storage)}" if other and storage else ""),
        f"provision {human.size(result.provisioned_usable_tb * 1000)} usable   {jobs}"
        f"{kept + 1} generations of {human.size(result.checkpoint_gb)} ({kept} kept, 1 being "
        f"written), {inputs.free_space_reserve:.0%} kept free",
        f"save every {human.duration(result.planned_interval_seconds)}, "
        f"{_deadline_phrase(result)}   {_interval_reason(result)}",
    ]


def _deadline_phrase(result: PlanResult) -> str:
    given, shortest = result.inputs.transfer_seconds, result.min_transfer_seconds
    if given is None:
        return f"deadline {human.duration(result.planned_deadline_seconds, up=True)}"
    phrase = f"deadline {human.duration(given)}"
    if shortest is not None and shortest > given * (1 + 1e-9):
        phrase += f", but the storage allows {human.duration(shortest, up=True)}"
    return phrase


def _interval_reason(result: PlanResult) -> str:
    mtbf, young = result.job_mtbf_seconds, result.young_interval_seconds
    if mtbf is None or young is None:
        return "as given; mtbf_seconds or gpus would say what follows"
    basis = (
        f"{human.duration(result.save_cost_seconds)} save, MTBF {human.duration(mtbf)}"
        f"{_mtbf_source(result)}"
    )
    if result.inputs.interval_seconds is None:
        return f"Young's interval: {basis}"
    return f"as given; Young's would be {human.duration(young)} ({basis})"


def _optional(
    key: str, value: float | None, render: Callable[[float], str], meaning: str, missing: str
) -> tuple[str, str, str]:
    return (key, "—", missing) if value is None else (key, render(value), meaning)


Row = tuple[str, str, str]
_VALUE_WIDTH = 20  # 168,750.0 s (1d 23h)


def _input_rows(inputs: PlanInputs) -> list[str]:
    lines = []
    for name, spec in INPUT_FIELDS.items():
        value = getattr(inputs, name)
        unit, kind = spec.metadata["unit"], spec.metadata["kind"]
        note = ""
        if value is None:
            shown = "—"
        else:
            shown = f"{value:,.0f}" if kind == PARAMETERS else f"{value:,.10g}"
            shown += f" {unit}" if unit else ""
            if kind == SECONDS and value >= 60:
                note = f"   {human.duration(value)}"
        lines.append(f"  {name:<30} {shown:>{_VALUE_WIDTH}}{note}")
    return lines


def _deadline_rows(result: PlanResult) -> list[Row]:
    inputs = result.inputs
    storage = (
        f"{inputs.jobs} x C / (storage_gbps x {inputs.utilization_ceiling:g}) + overhead: "
        "the shortest the storage allows"
    )
    given = inputs.transfer_seconds is not None
    return [
        _optional("min_transfer_seconds", result.min_transfer_seconds,
                  human.seconds_and_duration, storage, "needs storage_gbps"),
        ("planned_deadline_seconds", human.seconds_and_duration(result.planned_deadline_seconds),
         "transfer_seconds" if given else "min_transfer_seconds (no transfer_seconds given)"),
    ]  # fmt: skip


def _interval_rows(result: PlanResult) -> list[Row]:
    inputs = result.inputs
    needs_mtbf = "needs mtbf_seconds or gpus"
    daly = result.daly_interval_seconds
    if inputs.save_seconds is not None:
        save_source = "save_seconds"
    elif result.min_transfer_seconds is not None:
        save_source = "min_transfer_seconds: a save takes what the storage allows"
    else:
        save_source = "the deadline (no save_seconds given)"
    mtbf_source = (
        "mtbf_seconds" if inputs.mtbf_seconds is not None
        else f"gpu_mtbf_seconds / {inputs.gpus or 0:,} GPUs"
    )  # fmt: skip
    interval_source = (
        "interval_seconds" if inputs.interval_seconds is not None
        else "Young's interval (no interval_seconds given)"
    )  # fmt: skip
    seconds, share = human.seconds_and_duration, human.share
    return [
        ("save_cost_seconds", seconds(result.save_cost_seconds), save_source),
        _optional("job_mtbf_seconds", result.job_mtbf_seconds, seconds, mtbf_source, needs_mtbf),
        _optional("young_interval_seconds", result.young_interval_seconds, seconds,
                  "sqrt(2 x save x MTBF)", needs_mtbf),
        _optional("daly_interval_seconds", daly, seconds,
                  f"the planned interval is {result.planned_interval_seconds / daly:.2f}x this"
                  if daly else "", needs_mtbf),
        ("planned_interval_seconds", seconds(result.planned_interval_seconds), interval_source),
        _optional("waste_fraction", result.waste_fraction, share,
                  "GPU time lost at the planned interval", needs_mtbf),
        _optional("optimal_waste_fraction", result.optimal_waste_fraction, share,
                  "GPU time lost at Young's interval", needs_mtbf),
    ]  # fmt: skip


def _sections(result: PlanResult) -> list[tuple[str, list[Row]]]:
    inputs = result.inputs
    size, rate = human.size, human.rate
    gpus = f" ({inputs.gpus:,} GPUs / {inputs.gpus_per_server})" if inputs.gpus else ""
    window = result.effective_transfer_seconds
    return [
        ("Checkpoint", [
            ("checkpoint_gb", size(result.checkpoint_gb),
             "one logical checkpoint: P x b x (1 + extra)"),
            ("per_server_gb", size(result.per_server_gb),
             f"balanced over {inputs.servers_per_job:,} servers{gpus}"),
        ]),
        ("Deadline", _deadline_rows(result)),
        (f"Throughput (window {human.duration(window)} = deadline "
         f"{human.duration(result.planned_deadline_seconds)} - overhead "
         f"{human.duration(inputs.overhead_seconds)})", [
            ("payload_per_job_gbps", rate(result.payload_per_job_gbps),
             "one job inside the window"),
            ("payload_per_server_gbps", rate(result.payload_per_server_gbps),
             "one server's share"),
            ("burst_gbps", rate(result.burst_gbps), "every job saving at once"),
            ("service_gbps", rate(result.service_gbps),
             f"burst / utilization ceiling {inputs.utilization_ceiling:g}: size for this"),
            ("average_gbps", rate(result.average_gbps),
             f"over the {human.duration(result.planned_interval_seconds)} interval: "
             "not what to buy"),
        ]),
        (f"Network ({inputs.link_gbps:g} Gb/s per aggregate-path unit = "
         f"{rate(inputs.link_gbps / 8)})", [
            ("link_units", str(result.link_units),
             "units needed for the service rate (lower bound)"),
            ("degraded_capacity_gbps", rate(result.degraded_capacity_gbps),
             "left with one unit lost"),
        ]),
        ("Capacity", [
            ("retained_usable_tb", size(result.retained_usable_tb * 1000),
             "retained generations, all jobs"),
            ("peak_footprint_tb", size(result.peak_footprint_tb * 1000),
             "plus every job's next save in progress"),
            ("provisioned_usable_tb", size(result.provisioned_usable_tb * 1000),
             f"peak with {inputs.free_space_reserve:.0%} kept free"),
            ("staging_per_server_gb", size(result.staging_per_server_gb),
             f"host memory for {inputs.staged_generations_in_memory} staged image(s)"),
        ]),
        (f"Interval (save cost {human.duration(result.save_cost_seconds)})",
         _interval_rows(result)),
        ("Inference", [
            _optional("inference_load_seconds", result.inference_load_seconds,
                      human.seconds_and_duration,
                      f"{inputs.inference_bytes_per_parameter:g} B/parameter / node_read_gbps",
                      "needs node_read_gbps"),
        ]),
    ]  # fmt: skip


def format_table(result: PlanResult) -> str:
    """The answer in three lines, then the worksheet; key names match the JSON output."""
    lines = [
        *summary(result),
        "",
        "Checkpoint sizing worksheet (decimal units: GB = 1e9 bytes; single-direction rates)",
        "",
        "Inputs",
        *_input_rows(result.inputs),
    ]
    for title, rows in _sections(result):
        lines += ["", title]
        for key, value, meaning in rows:
            lines.append(f"  {key:<30} {value:>{_VALUE_WIDTH}}   {meaning}")
    if result.warnings:
        lines += ["", "Warnings"]
        for warning in result.warnings:
            lines += textwrap.wrap(warning, 96, initial_indent="  - ", subsequent_indent="    ")
    return "\n".join(lines) + "\n"
