"""The command line: every verb's flags, defaults and --help pinned, the contract's verbs and
flags present, the default verb, and the usage errors' exit status."""

from __future__ import annotations

import argparse
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from checkpoint_exporter import cli
from checkpoint_exporter.cli import build_parser, main

# tests/golden/cli.txt: each verb's --help and each of its flags (dest, default, type, choices,
# required). A flag, a default or a help text is a contract (DESIGN.md "CLI verbs"); the golden
# pins all of them at once. UPDATE_GOLDEN=1 rewrites it after a change that is meant.
GOLDEN = Path(__file__).parent / "golden" / "cli.txt"

# DESIGN.md "CLI verbs" and "Config": the names tests outside this repository use.
CONTRACT_VERBS = (
    "serve", "check-config", "plan", "rules", "dashboards", "restore-drill", "demo", "acceptance",
)  # fmt: skip
CONTRACT_FLAGS = {
    "serve": {
        "--config.file", "--web.listen-address", "--web.telemetry-path", "--web.config.file",
        "--path.procfs", "--path.sysfs", "--path.rootfs", "--log.level",
    },
    "check-config": {"--config.file"},
    "restore-drill": {"--config.file", "--job", "--generation", "--full"},
    "plan": {"--config", "--format"},
    "acceptance": {"--config.file"},
}  # fmt: skip


def _verbs(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    (subparsers,) = (a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(subparsers.choices)


def _flags(parser: argparse.ArgumentParser) -> set[str]:
    return {flag for action in parser._actions for flag in action.option_strings}


def _describe(parser: argparse.ArgumentParser) -> Iterator[str]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            continue
        kind = type(action).__name__
        convert = getattr(action.type, "__name__", action.type)
        yield (
            f"{'/'.join(action.option_strings) or action.dest}: {kind} dest={action.dest} "
            f"default={action.default!r} type={convert} choices={action.choices!r} "
            f"required={action.required} nargs={action.nargs!r}"
        )


def _transcript() -> str:
    parser = build_parser()
    out = [f"## checkpoint-exporter\n{parser.format_help()}"]
    for verb, sub in _verbs(parser).items():
        out.append(f"## {verb}\n{sub.format_help()}### flags\n")
        out.extend(f"{line}\n" for line in _describe(sub))
    return "".join(out)


def test_every_verbs_flags_defaults_and_help_are_unchanged(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("COLUMNS", "100")  # argparse wraps to the terminal's width
    transcript = _transcript()
    if os.environ.get("UPDATE_GOLDEN"):
        GOLDEN.write_text(transcript)
    assert transcript == GOLDEN.read_text()


def test_the_contracts_verbs_and_flags_are_there() -> None:
    verbs = _verbs(build_parser())
    assert set(CONTRACT_VERBS) <= set(verbs)
    for verb, flags in CONTRACT_FLAGS.items():
        assert flags <= _flags(verbs[verb]), verb
    plan_format = next(a for a in verbs["plan"]._actions if "--format" in a.option_strings)
    assert set(plan_format.choices) == {"table", "json", "yaml"}
    # healthcheck takes serve's command line as it is: every flag serve has, it has too.
    assert _flags(verbs["serve"]) <= _flags(verbs["healthcheck"])


@pytest.mark.parametrize(
    ("argv", "verb"),
    [
        ([], "serve"),
        (["--config.file", "c.yaml"], "serve"),
        (["--web.listen-address", ":1"], "serve"),
        (["check-config", "--config.file", "c.yaml"], "check-config"),
        (["rules"], "rules"),
    ],
)
def test_without_a_verb_the_command_serves(
    argv: list[str], verb: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The verb's module is what runs: each one's run is replaced by one that says which ran."""
    ran: list[str] = []
    for module in set(cli.VERB_MODULES.values()):
        monkeypatch.setattr(module, "run", lambda args: ran.append(args.verb) or 0)
    assert main(argv) == 0
    assert ran == [verb]


def test_each_verb_is_a_module_with_its_arguments_and_its_run() -> None:
    assert set(cli.VERB_MODULES) == set(_verbs(build_parser()))
    for verb, module in cli.VERB_MODULES.items():
        assert module.__name__.startswith("checkpoint_exporter.cli."), verb
        assert callable(module.add_arguments) and callable(module.run), verb


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["check-config"], "the following arguments are required: --config.file"),
        (["plan", "--formt", "json"], "did you mean --format for --formt?"),
        (["restore-drill", "--config.file", "c.yaml"], "the following arguments are required"),
        (["serve", "--collector.nonesuch"], "unrecognized arguments: --collector.nonesuch"),
        (["acceptance"], "--prometheus.url"),
    ],
)
def test_usage_errors_exit_2_with_the_verbs_usage(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        main(argv)
    assert exited.value.code == 2
    assert message in capsys.readouterr().err


# --- serve: the flags resolved by the CLI, the wiring in daemon/app.py ---------------------------


class _Scanner:
    def __init__(self) -> None:
        self.reloaded: list[object] = []
        self.failed = 0

    def reload(self, config: object) -> None:
        self.reloaded.append(config)

    def reload_failed(self) -> None:
        self.failed += 1


def test_a_reload_that_reads_a_good_file_hands_it_to_the_scanner_and_a_bad_one_keeps_the_old(
    tmp_path: Path,
) -> None:
    from checkpoint_exporter.daemon.app import reload_config

    path = tmp_path / "config.yaml"
    args = build_parser().parse_args(["serve", "--config.file", str(path), "--path.procfs", "/p"])
    scanner = _Scanner()
    path.write_text("spool_retention: 1h\n")
    reload_config(lambda: cli.serve.configuration(args), scanner)
    (config,) = scanner.reloaded
    assert (config.spool_retention, config.paths.procfs) == (3600.0, Path("/p"))  # file + flag
    path.write_text("spool_retention: 1 hour\n")
    reload_config(lambda: cli.serve.configuration(args), scanner)
    bad_flag = build_parser().parse_args(["serve", "--scope", "nowhere"])
    reload_config(lambda: cli.serve.configuration(bad_flag), scanner)
    assert (len(scanner.reloaded), scanner.failed) == (1, 2)
