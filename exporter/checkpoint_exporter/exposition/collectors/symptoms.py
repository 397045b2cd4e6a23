"""Symptoms: the bottleneck-matrix diagnosis of each job's saves (core/diagnosis.py).

The runbook sections docs/runbooks.md#symptom-<name> (with the alerts' runbook links) hold each
symptom's first evidence to collect and its controlled next test.
"""

from __future__ import annotations

from collections.abc import Iterable

from prometheus_client.core import Metric

from checkpoint_exporter.exposition.collectors.base import MetricSpec, SnapshotCollector
from checkpoint_exporter.model import SYMPTOMS, Snapshot, reads_a_tree

_LABELS = ("training_job", "symptom")
_NAMES = ", ".join(SYMPTOMS)
LAST_SAVE_SYMPTOM = MetricSpec(
    "checkpoint_last_save_symptom_info",
    "gauge",
    f"1 for each symptom the newest finished save showed ({_NAMES}); no series when it showed "
    "none. Runbook: /runbooks#symptom-{symptom}.",
    _LABELS,
)
SAVE_SYMPTOMS = MetricSpec(
    "checkpoint_save_symptoms_total",
    "counter",
    "Saves diagnosed with each symptom while the exporter ran (a failed restore marks the save "
    "it was of unrestorable, once per generation).",
    _LABELS,
)


class SymptomsCollector(SnapshotCollector):
    name = "symptoms"
    per_job = True
    specs = (LAST_SAVE_SYMPTOM, SAVE_SYMPTOMS)

    def collect(self, snapshot: Snapshot) -> Iterable[Metric]:
        last, total = (spec.family() for spec in self.specs)
        for job in snapshot.jobs:
            for symptom in job.last_save_symptoms:
                last.add_metric([job.name, symptom], 1)
            counts = dict(job.save_symptoms)
            # Every symptom from 0, so increase() sees the first save diagnosed with it (a
            # series born at 1 is missed): where a tree of the job is read, from the start; in a
            # node-scope process knowing a shared job from its spool alone, once its ranks'
            # save events were read here (before this node's first diagnosis of it), not for
            # every job it merely knows: 7 zeros per job on every node were most of a fleet's
            # series (docs/performance.md, cluster scale). Counted symptoms are always shown.
            every = reads_a_tree(job) or job.saves_timed
            for symptom in SYMPTOMS:
                if every or counts.get(symptom):
                    total.add_metric([job.name, symptom], counts.get(symptom, 0))
        return [last, total]
