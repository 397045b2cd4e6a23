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
"""

from __future__ import annotations

import math
import re
import textwrap
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any

from checkpoint_exporter.schema import Field, Parser, Problems, shown
from checkpoint_exporter.units import format_duration, parse_duration

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
) -> Any:
    return field(
        default=default, metadata={"help": help, "unit": unit, "kind": kind, "required": required}
    )


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
        "servers each job's checkpoint is sharded over", kind=COUNT, default=1
    )
    transfer_seconds: float = _input(
        "deadline: save start to durable commit", "s", SECONDS, required=True
    )
    interval_seconds: float = _input("time between checkpoint starts", "s", SECONDS, required=True)
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
        "training-visible cost of one save (default: transfer_seconds; "
        "with async checkpointing use the blocking time)",
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

    @property
    def save_cost(self) -> float:
        """What one save costs training: ``save_seconds``, else the whole transfer."""
        return self.save_seconds if self.save_seconds is not None else self.transfer_seconds


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


def parse_inputs(raw: Mapping[str, object]) -> PlanInputs:
    """Inputs from YAML keys or flags; reports every bad, missing or unknown input at once.

    An input given as None (a flag not given, an empty YAML value) counts as absent.
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
    problems += validate(values)
    if problems:
        raise PlanInputError(problems)
    return PlanInputs(**values)


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
    need("restart_seconds", not_negative, "must not be negative")
    need("inference_bytes_per_parameter", positive, "must be greater than zero")
    for name, (least, most) in LIMITS.items():
        unit = INPUT_FIELDS[name].metadata["unit"]
        need(
            name,
            lambda v, least=least, most=most: least <= v <= most,
            f"must be between {_limit(least)} and {_limit(most)}{' ' + unit if unit else ''}",
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


def compute(inputs: PlanInputs) -> PlanResult:
    problems = validate(asdict(inputs))
    if problems:
        raise PlanInputError(problems)
    checkpoint_gb = (
        inputs.parameters * inputs.bytes_per_parameter / 1e9 * (1 + inputs.extra_fraction)
    )
    per_server_gb = checkpoint_gb / inputs.servers_per_job
    window = inputs.transfer_seconds - inputs.overhead_seconds
    burst = inputs.jobs * checkpoint_gb / window
    service = burst / inputs.utilization_ceiling
    unit_gbytes = inputs.link_gbps / 8
    # The tolerance keeps float noise (3.0000000001 units) from buying a whole extra link.
    link_units = max(1, math.ceil(service / unit_gbytes - 1e-9))
    peak_tb = inputs.jobs * (inputs.retained_generations + 1) * checkpoint_gb / 1000
    save = inputs.save_cost
    mtbf = inputs.mtbf_seconds
    young = young_interval(save, mtbf) if mtbf else None
    result = PlanResult(
        inputs=inputs,
        checkpoint_gb=checkpoint_gb,
        per_server_gb=per_server_gb,
        payload_per_job_gbps=checkpoint_gb / window,
        payload_per_server_gbps=per_server_gb / window,
        burst_gbps=burst,
        service_gbps=service,
        average_gbps=inputs.jobs * checkpoint_gb / inputs.interval_seconds,
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
            waste_fraction(save, inputs.interval_seconds, mtbf, inputs.restart_seconds)
            if mtbf
            else None
        ),
        optimal_waste_fraction=(
            waste_fraction(save, young, mtbf, inputs.restart_seconds) if mtbf and young else None
        ),
        inference_load_seconds=(
            inputs.parameters * inputs.inference_bytes_per_parameter / 1e9 / inputs.node_read_gbps
            if inputs.node_read_gbps
            else None
        ),
    )
    return _with_warnings(result)


def _with_warnings(result: PlanResult) -> PlanResult:
    inputs = result.inputs
    warnings: list[str] = []
    if inputs.interval_seconds < inputs.transfer_seconds:
        warnings.append(
            f"interval_seconds ({inputs.interval_seconds:g}) is shorter than the deadline "
            f"({inputs.transfer_seconds:g} s): a new save starts before the last must be durable, "
            "so saves can pile up."
        )
    if result.degraded_capacity_gbps < result.service_gbps:
        meets = "still meets" if result.degraded_capacity_gbps >= result.burst_gbps else "misses"
        warnings.append(
            f"With one of {result.link_units} link units lost, {result.degraded_capacity_gbps:.2f} "
            f"GB/s remains: below the {result.service_gbps:.2f} GB/s service target, and it "
            f"{meets} the {result.burst_gbps:.2f} GB/s burst. Decide whether a degraded system "
            "must meet the original deadline, a relaxed one, or only stay correct."
        )
    if result.daly_interval_seconds and not (
        0.5 <= inputs.interval_seconds / result.daly_interval_seconds <= 2
    ):
        warnings.append(
            f"interval_seconds ({inputs.interval_seconds:g}) is "
            f"{inputs.interval_seconds / result.daly_interval_seconds:.1f}x Daly's optimum "
            f"({result.daly_interval_seconds:.0f} s): {result.waste_fraction:.1%} of GPU time "
            f"lost against {result.optimal_waste_fraction:.1%} near the optimum."
        )
    return replace(result, warnings=tuple(warnings))


# --- presentation ------------------------------------------------------------------------------


def objectives_yaml(result: PlanResult) -> str:
    """A ``defaults:`` block for the exporter config: the interval and deadline planned here."""
    inputs = result.inputs
    lines = ["# From `checkpoint-exporter plan`: paste into the exporter config."]
    if result.daly_interval_seconds:
        lines.append(
            f"# Daly's optimum for a {inputs.save_seconds or inputs.transfer_seconds:g} s save and "
            f"an MTBF of {format_duration(inputs.mtbf_seconds or 0)} is "
            f"{format_duration(round(result.daly_interval_seconds))}."
        )
    lines += [
        "defaults:",
        f"  interval: {format_duration(inputs.interval_seconds)}",
        f"  deadline: {format_duration(inputs.transfer_seconds)}",
        f"  retained_generations: {inputs.retained_generations}",
        f"  capacity_reserve: {inputs.free_space_reserve:g}",
    ]
    return "\n".join(lines) + "\n"


def _seconds(value: float) -> str:
    return f"{value:,.1f} s ({format_duration(round(value))})"


def _ratio(value: float) -> str:
    return f"{value:.2%}"


def _optional(
    key: str, value: float | None, render: Callable[[float], str], meaning: str, missing: str
) -> tuple[str, str, str]:
    return (key, "—", missing) if value is None else (key, render(value), meaning)


def gigabytes(value: float) -> str:
    return f"{value:,.2f} GB"


def gigabytes_per_second(value: float) -> str:
    return f"{value:,.2f} GB/s"


def _tb(value: float) -> str:
    return f"{value:,.3f} TB"


def format_table(result: PlanResult) -> str:
    """The worksheet as a person reads it; key names match the JSON output."""
    inputs = result.inputs
    save = inputs.save_cost
    needs_mtbf = "needs mtbf_seconds"
    daly_ratio = (
        f"interval_seconds is {inputs.interval_seconds / result.daly_interval_seconds:.2f}x this"
        if result.daly_interval_seconds
        else ""
    )
    sections: list[tuple[str, list[tuple[str, str, str]]]] = [
        (
            "Checkpoint",
            [
                (
                    "checkpoint_gb",
                    gigabytes(result.checkpoint_gb),
                    "one logical checkpoint: P x b x (1 + extra)",
                ),
                ("per_server_gb", gigabytes(result.per_server_gb), "balanced over servers_per_job"),
            ],
        ),
        (
            f"Throughput (window {result.effective_transfer_seconds:g} s = deadline "
            f"{inputs.transfer_seconds:g} s - overhead {inputs.overhead_seconds:g} s)",
            [
                (
                    "payload_per_job_gbps",
                    gigabytes_per_second(result.payload_per_job_gbps),
                    "one job inside the window",
                ),
                (
                    "payload_per_server_gbps",
                    gigabytes_per_second(result.payload_per_server_gbps),
                    "one server's share",
                ),
                ("burst_gbps", gigabytes_per_second(result.burst_gbps), "every job saving at once"),
                (
                    "service_gbps",
                    gigabytes_per_second(result.service_gbps),
                    f"burst / utilization ceiling {inputs.utilization_ceiling:g}: size for this",
                ),
                (
                    "average_gbps",
                    gigabytes_per_second(result.average_gbps),
                    f"over the {inputs.interval_seconds:g} s interval: not what to buy",
                ),
            ],
        ),
        (
            f"Network ({inputs.link_gbps:g} Gb/s per aggregate-path unit = "
            f"{inputs.link_gbps / 8:g} GB/s)",
            [
                (
                    "link_units",
                    str(result.link_units),
                    "units needed for the service rate (lower bound)",
                ),
                (
                    "degraded_capacity_gbps",
                    gigabytes_per_second(result.degraded_capacity_gbps),
                    "left with one unit lost",
                ),
            ],
        ),
        (
            "Capacity",
            [
                (
                    "retained_usable_tb",
                    _tb(result.retained_usable_tb),
                    "retained generations, all jobs",
                ),
                (
                    "peak_footprint_tb",
                    _tb(result.peak_footprint_tb),
                    "plus every job's next save in progress",
                ),
                (
                    "provisioned_usable_tb",
                    _tb(result.provisioned_usable_tb),
                    f"peak with {inputs.free_space_reserve:.0%} kept free",
                ),
                (
                    "staging_per_server_gb",
                    gigabytes(result.staging_per_server_gb),
                    f"host memory for {inputs.staged_generations_in_memory} staged image(s)",
                ),
            ],
        ),
        (
            f"Interval (save cost {save:g} s)",
            [
                _optional(
                    "young_interval_seconds",
                    result.young_interval_seconds,
                    _seconds,
                    "sqrt(2 x save x MTBF)",
                    needs_mtbf,
                ),
                _optional(
                    "daly_interval_seconds",
                    result.daly_interval_seconds,
                    _seconds,
                    daly_ratio,
                    needs_mtbf,
                ),
                _optional(
                    "waste_fraction",
                    result.waste_fraction,
                    _ratio,
                    "GPU time lost at interval_seconds",
                    needs_mtbf,
                ),
                _optional(
                    "optimal_waste_fraction",
                    result.optimal_waste_fraction,
                    _ratio,
                    "GPU time lost at Young's interval",
                    needs_mtbf,
                ),
            ],
        ),
        (
            "Inference",
            [
                _optional(
                    "inference_load_seconds",
                    result.inference_load_seconds,
                    _seconds,
                    f"{inputs.inference_bytes_per_parameter:g} B/parameter / node_read_gbps",
                    "needs node_read_gbps",
                ),
            ],
        ),
    ]
    lines = [
        "Checkpoint sizing worksheet (decimal units: GB = 1e9 bytes; single-direction rates)",
        "",
    ]
    lines.append("Inputs")
    for name, spec in INPUT_FIELDS.items():
        value = getattr(inputs, name)
        unit = spec.metadata["unit"]
        if value is None:
            shown = "—"
        else:
            shown = f"{value:,.0f}" if name == "parameters" else f"{value:g}"
            shown += f" {unit}" if unit else ""
        lines.append(f"  {name:<30} {shown:>18}")
    for title, rows in sections:
        lines += ["", title]
        for key, value, meaning in rows:
            lines.append(f"  {key:<30} {value:>18}   {meaning}")
    if result.warnings:
        lines += ["", "Warnings"]
        for warning in result.warnings:
            lines += textwrap.wrap(warning, 96, initial_indent="  - ", subsequent_indent="    ")
    return "\n".join(lines) + "\n"
