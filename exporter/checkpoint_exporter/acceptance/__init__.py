"""``checkpoint-exporter acceptance``: the seed article's section 8 checklist, judged from what a
real Prometheus recorded over a time range.

    prom.py     a small Prometheus HTTP API client (urllib) and the time-range arguments
    queries.py  every PromQL expression the report runs, by name
    rows.py     the checklist rows: pure functions of query results -> pass | fail | not measured
    charts.py   the SVG charts, drawn here (no JavaScript, no external assets)
    report.py   the JSON, Markdown and self-contained HTML writers
    run.py      the verb: objectives from the config files, the queries, the report, the exit status

The package reads Prometheus only: it never imports the daemon, the sources or the exposition
(the import contract in pyproject.toml says so), so a laptop with no checkpoint in sight can
judge a cluster.
"""
