"""``plan --measured``: the worksheet's planned numbers beside what a Prometheus measured.

The exporter measures what the worksheet assumes: the checkpoint's size (the newest committed
generation), the time a save takes and the part of it training waits for (the save-duration
histogram's ``total`` and ``pause`` phases), the servers it is written from (the hosts whose
exporters export the job's per-node series), and the objectives it is held to (interval,
deadline, mtbf). This module asks a Prometheus for them over the HTTP API (instant queries,
standard library only) and puts them into the worksheet's own formulas (worksheet.young_interval,
daly_interval, waste_fraction), so a measured Young interval here is the one the recording
rules record.

The queries select the job by ``training_job`` alone, not by the mixin's exporter selector: a
Prometheus that scrapes the exporters under another job name still answers.
"""

from __future__ import annotations

import contextlib
import json
import math
import textwrap
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from checkpoint_exporter.plan import human
from checkpoint_exporter.plan.worksheet import (
    PlanResult,
    daly_interval,
    waste_fraction,
    young_interval,
)

# The recording rule the mixin records the save cost under (mixin/rules.py SAVE_COST; plan does
# not import the mixin, a test holds the two equal).
SAVE_COST_RULE = "training_job:checkpoint_save_cost_seconds:avg1d"
WINDOW = "1d"  # as the recording rule: a day's mean, not the last save's luck


class MeasuredError(Exception):
    """The Prometheus cannot be asked, or has nothing on the job: the message names both."""


@dataclass(frozen=True)
class Measured:
    """What one Prometheus says about one job; None where it has no data."""

    prometheus: str
    training_job: str
    checkpoint_bytes: float | None = None
    files: float | None = None
    servers: int | None = None  # hosts exporting the job's per-node series
    save_seconds: float | None = None  # the training-visible cost: mean pause (or total) a save
    save_cost_source: str = ""  # the recording rule, or the histogram when the rule is absent
    save_total_seconds: float | None = None  # mean start-to-durable-commit time of a save
    interval_seconds: float | None = None
    deadline_seconds: float | None = None
    mtbf_seconds: float | None = None
    queries: dict[str, str] = field(default_factory=dict)  # key -> the PromQL behind it

    @property
    def checkpoint_gb(self) -> float | None:
        return None if self.checkpoint_bytes is None else self.checkpoint_bytes / 1e9

    @property
    def per_server_gb(self) -> float | None:
        if self.checkpoint_gb is None or not self.servers:
            return None
        return self.checkpoint_gb / self.servers

    @property
    def payload_per_job_gbps(self) -> float | None:
        if self.checkpoint_gb is None or not self.save_total_seconds:
            return None
        return self.checkpoint_gb / self.save_total_seconds

    @property
    def payload_per_server_gbps(self) -> float | None:
        if self.payload_per_job_gbps is None or not self.servers:
            return None
        return self.payload_per_job_gbps / self.servers

    def _with_mtbf(self, formula: Callable[[float, float], float]) -> float | None:
        if not self.save_seconds or not self.mtbf_seconds:
            return None
        return formula(self.save_seconds, self.mtbf_seconds)

    @property
    def young_interval_seconds(self) -> float | None:
        return self._with_mtbf(young_interval)

    @property
    def daly_interval_seconds(self) -> float | None:
        return self._with_mtbf(daly_interval)

    @property
    def waste_fraction(self) -> float | None:
        # Restart 0, as the recording rules: no objective gives it.
        if self.interval_seconds is None:
            return None
        interval = self.interval_seconds
        return self._with_mtbf(lambda s, m: waste_fraction(s, interval, m, 0.0))

    @property
    def optimal_waste_fraction(self) -> float | None:
        return self._with_mtbf(lambda s, m: waste_fraction(s, young_interval(s, m), m, 0.0))

    def values(self) -> dict[str, float | int | None]:
        return {key: getattr(self, key) for key, *_ in ROWS}


def _label(value: str) -> str:
    """A PromQL string literal: JSON's escapes are Go's."""
    return json.dumps(value)


def _mean(metric_selector: str, phase: str) -> str:
    sum_, count = (
        f'checkpoint_save_duration_seconds_{part}{{{metric_selector},phase="{phase}"}}'
        for part in ("sum", "count")
    )
    return f"max(rate({sum_}[{WINDOW}]) / (rate({count}[{WINDOW}]) > 0))"


def servers_query(s: str) -> str:
    """The hosts that write the job: those exporting a per-node series of it (its newest save's
    phases, its restores). Not checkpoint_job_info: a node-scope exporter does not export it for
    a job on a shared tree (the cluster shape), the shared scanners do, and they are replicas of
    a shard, not servers. So instances that say they serve the shared scope alone are left out.
    Where no node has saved or restored yet, the job_info count stands in (one process per node
    serving both scopes, the default shape)."""
    shared = 'checkpoint_exporter_shard_info{scope="shared"}'
    nodes = (
        f"count by (instance) (checkpoint_last_save_phase_seconds{{{s}}})\n"
        f"  or count by (instance) (checkpoint_restores_total{{{s}}})"
    )
    info = f"count by (instance) (checkpoint_job_info{{{s}}})"
    return (
        f"count(({nodes}) unless on (instance) {shared})\n"
        f"or\ncount({info} unless on (instance) {shared})"
    )


def queries(job: str) -> dict[str, str]:
    """The PromQL behind each measured value."""
    s = f"training_job={_label(job)}"
    return {
        "checkpoint_bytes": f"max(checkpoint_last_committed_size_bytes{{{s}}})",
        "files": f"max(checkpoint_last_committed_files{{{s}}})",
        "servers": servers_query(s),
        "save_cost_rule": f"max({SAVE_COST_RULE}{{{s}}})",
        "save_cost_histogram": f"{_mean(s, 'pause')}\nor\n{_mean(s, 'total')}",
        "save_total_seconds": _mean(s, "total"),
        "interval_seconds": f"max(checkpoint_interval_seconds{{{s}}})",
        "deadline_seconds": f"max(checkpoint_deadline_seconds{{{s}}})",
        "mtbf_seconds": f"max(checkpoint_mtbf_seconds{{{s}}})",
        "known": f"count(checkpoint_job_info{{{s}}}) or count(checkpoint_interval_seconds{{{s}}})",
    }


def check_url(url: str) -> str:
    """The base URL, or ValueError saying what is wrong with it (bad input: exit 2)."""
    parsed = urllib.parse.urlsplit(url)
    if parsed.scheme not in ("http", "https") or not parsed.netloc:
        raise ValueError(
            f"--measured expects a Prometheus URL such as http://prometheus:9090, got {url!r}"
        )
    return url.rstrip("/")


def _query(base: str, expr: str, timeout: float) -> float | None:
    """One instant query's single value, or None when it returns nothing (or NaN)."""
    address = f"{base}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
    try:
        with urllib.request.urlopen(address, timeout=timeout) as reply:
            answer = json.load(reply)
    except urllib.error.HTTPError as error:
        detail = ""
        with contextlib.suppress(ValueError, OSError, AttributeError):
            detail = ": " + str(json.load(error).get("error", ""))
        raise MeasuredError(f"{base} answered HTTP {error.code} to {expr!r}{detail}") from None
    except (urllib.error.URLError, OSError, ValueError) as error:
        reason = getattr(error, "reason", error)
        raise MeasuredError(f"cannot query Prometheus at {base}: {reason}") from None
    if not isinstance(answer, dict) or answer.get("status") != "success":
        raise MeasuredError(f"{base} did not answer {expr!r} with success: {answer!r:.200}")
    result = answer.get("data", {}).get("result", [])
    if not result:
        return None
    value = float(result[0]["value"][1])
    return value if math.isfinite(value) else None


def measure(url: str, job: str, timeout: float = 10.0) -> Measured:
    """Every measured value of ``job`` from the Prometheus at ``url``.

    MeasuredError when the Prometheus cannot be reached or knows nothing of the job.
    """
    base = check_url(url)
    exprs = queries(job)
    got = {key: _query(base, expr, timeout) for key, expr in exprs.items()}
    if got["known"] is None:
        raise MeasuredError(
            f"Prometheus at {base} has no series for training_job={job!r} "
            "(checkpoint_job_info, checkpoint_interval_seconds): is the job watched, and are its "
            "exporters scraped there?"
        )
    cost, source = got["save_cost_rule"], SAVE_COST_RULE
    if cost is None:  # rules not loaded there: the same mean from the histogram
        cost, source = got["save_cost_histogram"], "checkpoint_save_duration_seconds"
    shown = ("checkpoint_bytes", "files", "servers", "save_total_seconds", "interval_seconds",
             "deadline_seconds", "mtbf_seconds")  # fmt: skip
    used = {key: exprs[key] for key in shown}
    used["save_seconds"] = exprs[
        "save_cost_rule" if source == SAVE_COST_RULE else "save_cost_histogram"
    ]
    servers = got["servers"]
    return Measured(
        prometheus=base,
        training_job=job,
        checkpoint_bytes=got["checkpoint_bytes"],
        files=got["files"],
        servers=None if servers is None else int(servers),
        save_seconds=cost,
        save_cost_source=source if cost is not None else "",
        save_total_seconds=got["save_total_seconds"],
        interval_seconds=got["interval_seconds"],
        deadline_seconds=got["deadline_seconds"],
        mtbf_seconds=got["mtbf_seconds"],
        queries=used,
    )


# --- presentation ------------------------------------------------------------------------------


_size, _rate, _seconds, _ratio = human.size, human.rate, human.seconds_and_duration, human.share


def _count(value: float) -> str:
    return f"{value:,.0f}"


# key, how to print it, what the planned side is, what it means.
ROWS: tuple[tuple[str, Callable[[float], str], Callable[[PlanResult], float | None], str], ...] = (
    ("checkpoint_gb", _size, lambda r: r.checkpoint_gb, "newest committed generation"),
    ("files", _count, lambda r: None, "files in it"),
    ("servers", _count, lambda r: r.inputs.servers_per_job, "hosts writing the job"),
    ("per_server_gb", _size, lambda r: r.per_server_gb, "checkpoint / servers"),
    ("save_seconds", _seconds, lambda r: r.save_cost_seconds,
     "training-visible cost of a save (mean pause)"),
    ("save_total_seconds", _seconds, lambda r: r.planned_deadline_seconds,
     "mean start to durable commit (planned: the deadline)"),
    ("payload_per_job_gbps", _rate, lambda r: r.payload_per_job_gbps,
     "checkpoint / save time"),
    ("payload_per_server_gbps", _rate, lambda r: r.payload_per_server_gbps,
     "one server's share"),
    ("interval_seconds", _seconds, lambda r: r.planned_interval_seconds, "configured interval"),
    ("deadline_seconds", _seconds, lambda r: r.planned_deadline_seconds, "configured deadline"),
    ("mtbf_seconds", _seconds, lambda r: r.job_mtbf_seconds, "configured mtbf"),
    ("young_interval_seconds", _seconds, lambda r: r.young_interval_seconds,
     "sqrt(2 x save x MTBF)"),
    ("daly_interval_seconds", _seconds, lambda r: r.daly_interval_seconds, "Daly's optimum"),
    ("waste_fraction", _ratio, lambda r: r.waste_fraction, "GPU time lost at the interval"),
    ("optimal_waste_fraction", _ratio, lambda r: r.optimal_waste_fraction,
     "GPU time lost at Young's interval"),
)  # fmt: skip


def comparison(result: PlanResult, measured: Measured) -> dict[str, dict[str, Any]]:
    """key -> {planned, measured, query}: the rows of the table, for JSON and YAML."""
    values = measured.values()
    return {
        key: {
            "planned": planned(result),
            "measured": values[key],
            "query": measured.queries.get(key),
        }
        for key, _, planned, _ in ROWS
    }


def to_dict(result: PlanResult, measured: Measured) -> dict[str, Any]:
    """The plan's JSON with a ``measured`` section beside it."""
    out = result.to_dict()
    out["measured"] = {
        "prometheus": measured.prometheus,
        "training_job": measured.training_job,
        "window": WINDOW,
        "save_cost_source": measured.save_cost_source,
        "values": measured.values(),
        "comparison": comparison(result, measured),
    }
    return out


def format_comparison(result: PlanResult, measured: Measured) -> str:
    """The planned and measured columns, appended to the worksheet's table."""

    def show(render: Callable[[float], str], value: float | None) -> str:
        return "—" if value is None else render(value)

    values = measured.values()
    lines = [
        "",
        f"Measured (Prometheus {measured.prometheus}, training_job {measured.training_job}, "
        f"means over {WINDOW})",
        f"  {'':<26} {'planned':>22} {'measured':>22}",
    ]
    for key, render, planned, meaning in ROWS:
        lines.append(
            f"  {key:<26} {show(render, planned(result)):>22} "
            f"{show(render, values[key]):>22}   {meaning}"
        )
    notes = []
    if measured.save_cost_source and measured.save_cost_source != SAVE_COST_RULE:
        notes.append(
            f"The recording rule {SAVE_COST_RULE} has no value there: the save cost is the "
            "histogram's mean over the window."
        )
    if measured.mtbf_seconds is None:
        notes.append("The job has no mtbf objective: no measured interval recommendation.")
    if measured.checkpoint_bytes is None:
        notes.append("No committed generation is exported for the job yet.")
    if measured.save_seconds is None:
        notes.append(f"No save was observed in the last {WINDOW}.")
    for note in notes:
        lines += textwrap.wrap(note, 96, initial_indent="  - ", subsequent_indent="    ")
    return "\n".join(lines) + "\n"


def planned_defaults(measured: Measured, given: Mapping[str, object]) -> dict[str, float]:
    """The job's objectives as the plan inputs the user did not give: the planned column then
    describes the job as configured."""
    objectives = {
        "interval_seconds": measured.interval_seconds,
        "transfer_seconds": measured.deadline_seconds,
        "mtbf_seconds": measured.mtbf_seconds,
    }
    return {
        key: value
        for key, value in objectives.items()
        if value is not None and given.get(key) is None
    }
