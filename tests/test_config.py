"""Config loading: defaults, overrides, and every kind of problem reported at once."""

from __future__ import annotations

import dataclasses
import os
import pwd
import subprocess
import tempfile
import time
from pathlib import Path

import pytest
import yaml

from checkpoint_exporter import config as config_module
from checkpoint_exporter.cli import main
from checkpoint_exporter.config import (
    DEFAULT_LISTEN_ADDRESS,
    Config,
    ConfigError,
    DiagnosisThresholds,
    DiscoverConfig,
    JobConfig,
    PathsConfig,
    Policy,
    ScanConfig,
    TelemetryConfig,
    WebConfig,
    _share,
    config_to_dict,
    dumped,
    key_fields,
    load_config,
    load_web_section,
    parse_config,
    parse_listen_address,
)
from checkpoint_exporter.schema import Problems
from tests.conftest import CLI, as_nobody, as_user_env, run_cli, write_config


@pytest.fixture
def ckpt(tmp_path: Path) -> Path:
    for name in ("a", "b", "staging-a"):
        (tmp_path / "ckpt" / name).mkdir(parents=True)
    return tmp_path


def problems_of(text: str, base: Path) -> list[str]:
    with pytest.raises(ConfigError) as caught:
        parse_config(text, "test.yaml", base)
    return [str(problem) for problem in caught.value.problems]


def test_defaults_and_per_job_overrides(ckpt: Path) -> None:
    config = load_config(
        write_config(
            ckpt,
            """
defaults: {interval: 10m, deadline: 45s, retained_generations: 5}
jobs:
  - {name: llama70b, path: ckpt/a, staging: ckpt/staging-a, deadline: 90s, layout: dcp}
  - {name: mixtral, path: ckpt/b}
""",
        )
    )
    first, second = config.jobs
    assert first.path == ckpt / "ckpt" / "a"  # relative to the config file, not the cwd
    assert first.staging == ckpt / "ckpt" / "staging-a"
    assert (first.policy.interval, first.policy.deadline, first.policy.layout) == (600, 90, "dcp")
    assert first.policy.retained_generations == 5
    assert (second.policy.interval, second.policy.deadline, second.staging) == (600, 45, None)
    assert second.policy.capacity_reserve == 0.20  # built-in default
    assert config.web.listen_address == DEFAULT_LISTEN_ADDRESS


def test_empty_file_is_the_default_config(tmp_path: Path) -> None:
    config = load_config(write_config(tmp_path, ""))
    assert config.jobs == () and config.telemetry.sample_interval == 1.0


def test_unknown_key_suggests_the_known_one(ckpt: Path) -> None:
    (problem,) = problems_of("telemetry: {sample_intervall: 2s}\n", ckpt)
    assert problem.startswith("test.yaml:1: telemetry.sample_intervall: unknown key")
    assert "did you mean 'sample_interval'?" in problem


def test_bad_durations(ckpt: Path) -> None:
    found = problems_of(
        """
jobs:
  - {name: a, path: ckpt/a, deadline: 6os}
  - {name: b, path: ckpt/b, interval: "-5m"}
defaults: {restore_drill_max_age: 1m1h}
""",
        ckpt,
    )
    assert any("jobs[0].deadline: invalid duration '6os'" in p for p in found)
    assert any("jobs[1].interval: invalid duration '-5m'" in p for p in found)
    assert any("defaults.restore_drill_max_age" in p and "largest to smallest" in p for p in found)


@pytest.mark.parametrize(
    ("snippet", "expected"),
    [
        ("defaults: {deadline: 0s}", "defaults.deadline: must be greater than zero"),
        ("defaults: {interval: 0}", "defaults.interval: must be greater than zero"),
        ("defaults: {retained_generations: 0}", "must be at least 1, got 0"),
        ("defaults: {capacity_reserve: 1.5}", "defaults.capacity_reserve: must be at least 0"),
        ("defaults: {capacity_reserve: -0.1}", "defaults.capacity_reserve: must be at least 0"),
        ("telemetry: {sample_interval: 0s}", "telemetry.sample_interval: must be greater"),
        ("discover: [{root: ckpt, max_jobs: 0}]", "discover[0].max_jobs: must be at least 1"),
        ("defaults: {retained_generations: 2.5}", "expected a whole number"),
        ("defaults: {layout: pytorch}", "must be one of auto, dcp, torchtitan"),
        ("telemetry: {network_devices: '([a'}", "invalid regular expression"),
        ("telemetry: {infiniband: maybe}", "expected true or false"),
        ("web: {listen_address: 'localhost'}", "expected host:port"),
        ("web: {listen_address: ':99999'}", "port 99999 is above 65535"),
        ("web: {telemetry_path: metrics}", "must start with '/'"),
    ],
)
def test_values_out_of_range(ckpt: Path, snippet: str, expected: str) -> None:
    (problem,) = problems_of(snippet + "\n", ckpt)
    assert expected in problem


def test_spool_owner_is_uids_or_user_names(ckpt: Path) -> None:
    """Whose a job's spool directories are (sources/spool.py): a uid, a user name or a list,
    in defaults, a job or a discover root; check-config shows the uids."""
    nobody = pwd.getpwnam("nobody").pw_uid
    config = parse_config(
        "defaults: {spool_owner: root}\n"
        "jobs: [{name: a, path: ckpt/a, spool_owner: [1000, nobody, '1001', 1000]},"
        " {name: b, path: ckpt/b}]\n"
        "discover: [{root: ckpt, spool_owner: 5}]\n",
        "test.yaml",
        ckpt,
    )
    assert config.jobs[0].policy.spool_owner == tuple(sorted((1000, 1001, nobody)))
    assert config.jobs[1].policy.spool_owner == (0,)
    assert config.discover[0].policy.spool_owner == (5,)
    assert config_to_dict(config)["jobs"][0]["spool_owner"] == sorted([1000, 1001, nobody])
    assert parse_config("", "test.yaml", ckpt).defaults.spool_owner == ()  # the tree's owner
    for value, expected in [
        ("-1", "defaults.spool_owner: expected a uid (0 to 4294967294) or a user name"),
        ("4294967295", "expected a uid"),
        ("{a: 1}", "expected a uid"),
        ("[1000, true]", "expected a uid"),
        ("no-such-user-here", "no user 'no-such-user-here' on this machine: give its uid"),
    ]:
        (problem,) = problems_of(f"defaults: {{spool_owner: {value}}}\n", ckpt)
        assert expected in problem, problem


def test_duplicate_job_names_and_paths(ckpt: Path) -> None:
    found = problems_of(
        """
jobs:
  - {name: a, path: ckpt/a}
  - {name: a, path: ckpt/b}
  - {name: c, path: ./ckpt/a/}
""",
        ckpt,
    )
    assert "test.yaml:4: jobs[1].name: duplicate job name 'a' (also jobs[0])" in found
    assert any("jobs[2].path" in p and "already watched as jobs[0].path" in p for p in found)


def test_missing_paths_and_required_keys(ckpt: Path) -> None:
    (ckpt / "file").write_text("x")
    found = problems_of(
        """
jobs:
  - {name: a, path: /nonexistent/ckpt}
  - {name: b, path: file}
  - {path: ckpt/b}
discover:
  - {max_jobs: 3}
""",
        ckpt,
    )
    assert not any("jobs[0]" in p for p in found)  # not there yet: a warning, below
    assert any("jobs[1].path" in p and "is not a directory" in p for p in found)
    assert "test.yaml:5: jobs[2]: missing required key 'name'" in found
    assert "test.yaml:7: discover[0]: missing required key 'root'" in found


def test_a_directory_not_there_yet_is_a_warning_not_a_failure(ckpt: Path) -> None:
    """Jobs are configured before they make their directories and removed after: a missing
    job path or discover root loads, with a warning naming the file, line and key."""
    config = parse_config(
        """
jobs:
  - {name: a, path: /nonexistent/ckpt, staging: /nonexistent/nvme}
discover:
  - {root: /nonexistent/runs}
""",
        "test.yaml",
        ckpt,
    )
    assert [job.name for job in config.jobs] == ["a"]
    later = "does not exist yet: watched from when it appears"
    assert [str(w) for w in config.warnings] == [
        f"test.yaml:3: jobs[0].path: /nonexistent/ckpt {later}",
        f"test.yaml:3: jobs[0].staging: /nonexistent/nvme {later}",
        f"test.yaml:5: discover[0].root: /nonexistent/runs {later}",
    ]


def test_every_problem_is_reported_at_once(ckpt: Path) -> None:
    (ckpt / "file").write_text("x")
    found = problems_of(
        """
web: {listen_adress: ':1'}
defaults: {deadline: soon}
jobs:
  - {name: a, path: ckpt/a, interval: 0s}
  - {name: 'no/slashes', path: file}
""",
        ckpt,
    )
    assert len(found) == 5, found
    assert [p.split(":")[1] for p in found] == ["2", "3", "5", "6", "6"]  # sorted by line


@pytest.mark.root  # runs check-config as nobody
def test_an_unreadable_job_path_is_a_warning(ckpt: Path) -> None:
    """Checked as an unprivileged user: root can read anything, the daemon's user may not. A
    permission is fixed while the exporter runs (and the scanner reports the tree it cannot
    read): the config loads, with a warning naming the key and the uid."""
    base = Path(tempfile.mkdtemp(prefix="ckpt-perm-"))
    try:
        os.chmod(base, 0o755)
        (base / "open").mkdir(mode=0o755)
        (base / "closed").mkdir(mode=0o700)  # owned by root, not searchable by nobody
        os.chmod(base / "open", 0o755)
        config = write_config(
            base,
            "jobs:\n  - {name: a, path: open}\n  - {name: b, path: closed}\n",
        )
        os.chmod(config, 0o644)
        result = subprocess.run(
            [*as_nobody(), *CLI, "check-config", "--config.file", str(config)],
            capture_output=True,
            text=True,
            timeout=60,
            env=as_user_env({**os.environ, "HOME": "/"}),
        )
        assert result.returncode == 0, result.stderr
        warning = next(line for line in result.stderr.splitlines() if "jobs[1].path" in line)
        assert warning.startswith("warning: ") and "is not readable by uid" in warning
        assert "jobs[0]" not in result.stderr
    finally:
        subprocess.run(["rm", "-rf", str(base)], check=True)


def test_yaml_syntax_error_names_the_line(ckpt: Path) -> None:
    (problem,) = problems_of("jobs:\n  - {name: a, path: ckpt/a\n", ckpt)
    assert problem.startswith("test.yaml:3: invalid YAML")


def test_duplicate_yaml_keys_are_refused(ckpt: Path) -> None:
    (problem,) = problems_of("jobs:\n  - name: a\n    path: ckpt/a\n    name: b\n", ckpt)
    assert problem.startswith("test.yaml:4: jobs[0].name: duplicate key (first defined on line 2)")


def test_merge_keys_and_anchors_work(ckpt: Path) -> None:
    config = parse_config(
        "defaults: &d {interval: 5m}\njobs:\n  - {<<: *d, name: a, path: ckpt/a, deadline: 30s}\n",
        "test.yaml",
        ckpt,
    )
    assert (config.jobs[0].policy.interval, config.jobs[0].policy.deadline) == (300, 30)


@pytest.mark.parametrize(
    "payload",
    [
        "jobs: !!python/object/apply:os.system ['touch /tmp/pwned-by-config']\n",
        "jobs:\n  - {name: a, path: !!python/name:os.system x}\n",
        "defaults: !!python/object:collections.OrderedDict {}\n",
    ],
)
def test_language_tags_are_refused(ckpt: Path, payload: str) -> None:
    found = problems_of(payload, ckpt)
    assert any("not allowed" in p or "could not determine a constructor" in p for p in found), found
    assert not Path("/tmp/pwned-by-config").exists()


def test_alias_bomb_is_refused_quickly(ckpt: Path) -> None:
    lines = ['a0: &a0 ["x", "x", "x", "x", "x", "x", "x", "x", "x", "x"]']
    lines += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 10)}]" for i in range(1, 9)]
    (problem,) = problems_of("\n".join(lines) + "\n", ckpt)
    assert "more than 100000 values" in problem


def test_listen_address_forms() -> None:
    assert parse_listen_address(":25780") == parse_listen_address(":25780")
    assert (parse_listen_address(":25780").host, parse_listen_address(":25780").port) == ("", 25780)
    assert parse_listen_address("[::1]:9").host == "::1"
    assert str(parse_listen_address("[::1]:9")) == "[::1]:9"
    assert parse_listen_address("node-1.example:80").host == "node-1.example"


def test_check_config_prints_the_resolved_config(ckpt: Path) -> None:
    path = write_config(ckpt, "defaults: {interval: 90s}\njobs: [{name: a, path: ckpt/a}]\n")
    result = run_cli("check-config", "--config.file", str(path))
    assert result.returncode == 0, result.stderr
    resolved = yaml.safe_load(result.stdout)
    assert resolved["jobs"][0]["interval"] == "1m30s"
    assert resolved["jobs"][0]["deadline"] == "1m"
    assert resolved["jobs"][0]["path"] == str(ckpt / "ckpt" / "a")
    assert "ok (1 jobs" in result.stderr


def test_check_config_errors_exit_2(ckpt: Path) -> None:
    (ckpt / "file").write_text("x")
    path = write_config(ckpt, "jobs: [{name: a, path: file, deadlin: 5s}]\n")
    result = run_cli("check-config", "--config.file", str(path))
    assert result.returncode == 2
    assert "configuration has 2 problems" in result.stderr
    assert "did you mean 'deadline'?" in result.stderr
    assert result.stdout == ""


def test_check_config_missing_file(tmp_path: Path) -> None:
    result = run_cli("check-config", "--config.file", str(tmp_path / "absent.yaml"))
    assert result.returncode == 2 and "absent.yaml: file does not exist" in result.stderr


def test_check_config_requires_a_file() -> None:
    assert run_cli("check-config").returncode == 2


def test_the_documented_configs_have_only_valid_keys(tmp_path: Path) -> None:
    """The reference config block (docs/configuration.md) and the README's first config stay in
    step with the loader: only their paths are missing here."""
    from tests.conftest import REPO

    reference = (REPO / "docs" / "configuration.md").read_text()
    block = reference.split("## Configuration", 1)[1].split("```yaml\n", 1)[1].split("```", 1)[0]
    readme = (REPO / "README.md").read_text()
    first = readme.split("## A first configuration", 1)[1].split("```yaml\n", 1)[1]
    config = parse_config(first.split("```", 1)[0], "README.md", tmp_path)
    assert [job.name for job in config.jobs] == ["llama70b"] and len(config.discover) == 1
    # As the README says: the configured job pages, the root's runs (no objectives) do not.
    assert config.jobs[0].policy.page and not config.discover[0].policy.page
    config = parse_config(block, "test.yaml", tmp_path)
    notes = [str(note) for note in config.warnings]
    assert notes and all("does not exist yet" in note for note in notes), notes


# --- values that would overflow or crash at run time are refused at load ([tenants] item 6) --


def test_a_nul_in_a_path_is_a_config_error_not_a_traceback(ckpt: Path) -> None:
    """A NUL in a path reached os.stat and ended in a traceback with exit status 1."""
    path = write_config(
        ckpt,
        'spool: "/var/spool\\0x"\n'
        'paths: {procfs: "/proc\\0"}\n'
        'web: {config_file: "web\\0.yaml"}\n'
        "jobs:\n"
        '  - {name: a, path: "ckpt/a\\0/b"}\n'
        '  - {name: b, path: ckpt/b, staging: "\\0"}\n'
        'discover: [{root: "ckpt\\0"}]\n',
    )
    result = run_cli("check-config", "--config.file", str(path))
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    for key, line in [
        ("spool", 1),
        ("paths.procfs", 2),
        ("web.config_file", 3),
        ("jobs[0].path", 5),
        ("jobs[1].staging", 6),
        ("discover[0].root", 7),
    ]:
        assert f"{path}:{line}: {key}: a path cannot contain a NUL character" in result.stderr, (
            key,
            result.stderr,
        )
    # serve refuses the same file the same way, before it listens.
    result = run_cli("serve", "--config.file", str(path), "--web.listen-address", "127.0.0.1:0")
    assert result.returncode == 2 and "Traceback" not in result.stderr


_HUGE = "9" * 400  # an int YAML reads fine, and float() cannot hold


@pytest.mark.parametrize(
    ("snippet", "expected"),
    [
        # sample_interval 1000y passed check-config, then killed the sampler thread at serve
        # time (OverflowError: timeout value is too large).
        (
            "telemetry: {sample_interval: 1000y}",
            "telemetry.sample_interval: duration '1000y' is too long: at most 100y",
        ),
        ("defaults: {deadline: 1.0e+308}", "defaults.deadline: duration 1e+308 is too long"),
        (f"defaults: {{interval: {_HUGE}}}", "defaults.interval: duration 9999999999"),
        (f"defaults: {{settle: {_HUGE}s}}", "defaults.settle: duration '9999999999"),
        ("spool_retention: 101y", "spool_retention: duration '101y' is too long"),
        (
            "scan: {reconcile_interval: 99y1000w}",
            "scan.reconcile_interval: duration '99y1000w' is too long",
        ),
        (
            "discover: [{root: ckpt, forget_after: 200y}]",
            "discover[0].forget_after: duration '200y' is too long",
        ),
        (
            f"defaults: {{retained_generations: {_HUGE}}}",
            "defaults.retained_generations: must be at most 1,000,000",
        ),
        (
            f"discover: [{{root: ckpt, max_jobs: {_HUGE}}}]",
            "discover[0].max_jobs: must be at most 1,000,000",
        ),
        ("scan: {max_depth: 100000}", "scan.max_depth: must be at most 64"),
        (
            f"scan: {{metadata_ops_per_second: {_HUGE}}}",
            "scan.metadata_ops_per_second: must be at most 1e+09",
        ),
        (
            "scan: {checksum_bytes_per_second: 1.0e+300}",
            "scan.checksum_bytes_per_second: must be at most 1e+13",
        ),
        (
            "scan: {checksum_bytes_per_second: .nan}",
            "scan.checksum_bytes_per_second: expected a number, got nan",
        ),
        ("scan: {metadata_ops_per_second: .inf}", "scan.metadata_ops_per_second: must be at most"),
        (
            "telemetry: {sample_interval: 1ms}",
            "telemetry.sample_interval: retention 1h at one sample every 1ms is 3,600,000 samples",
        ),
        (
            "telemetry: {retention: 99y}",
            "telemetry.retention: retention 99y at one sample every 1s",
        ),
        ('web: {listen_address: "local\\0host:1"}', "web.listen_address: invalid listen address"),
        ('web: {telemetry_path: "/met rics"}', "web.telemetry_path: must be a plain URL path"),
    ],
)
def test_values_that_overflow_at_run_time_fail_check_config(
    ckpt: Path, snippet: str, expected: str
) -> None:
    path = write_config(ckpt, snippet + "\n")
    result = run_cli("check-config", "--config.file", str(path))
    assert result.returncode == 2, result.stdout + result.stderr
    assert f"{path}:1: {expected}" in result.stderr, result.stderr
    assert "Traceback" not in result.stderr


def test_the_largest_accepted_values_still_serve(ckpt: Path, exporter) -> None:
    """The bounds are where the run time stops coping, not lower: at the bounds it serves."""
    path = write_config(
        ckpt,
        "telemetry: {sample_interval: 100y, retention: 100y}\n"
        "spool_retention: 100y\n"
        "scan: {reconcile_interval: 100y, max_depth: 64, metadata_ops_per_second: 1.0e+9,\n"
        "       checksum_bytes_per_second: 1.0e+13}\n"
        "defaults: {interval: 100y, deadline: 100y, settle: 100y, poll_interval: 100y,\n"
        "           restore_drill_max_age: 100y, retained_generations: 1000000}\n"
        "jobs: [{name: a, path: ckpt/a}]\n",
    )
    assert run_cli("check-config", "--config.file", str(path)).returncode == 0
    served = exporter("--config.file", str(path))
    time.sleep(1.5)  # the sampler and scanner threads have started their timers
    text = served.metrics()
    assert 'checkpoint_retained_generations_limit{training_job="a"} 1e+06' in text
    assert served.process.poll() is None
    assert not any("Traceback" in line for line in served.drain_log()), served.drain_log()


def test_check_config_checks_the_web_config_it_names(ckpt: Path) -> None:
    web = write_config(
        ckpt,
        'tls_server_config: {cert_file: "server\\0.crt", key_file: server.key}\n'
        "basic_auth_users:\n"
        "  prometheus: $2y$31$" + "a" * 53 + "\n"
        "  'a:b': $2y$10$" + "a" * 53 + "\n"
        "http_server_config:\n"
        "  headers: {Content-Length: '0', X-Frame-Options: allow}\n",
        "web.yaml",
    )
    path = write_config(ckpt, "web: {config_file: web.yaml}\n")
    result = run_cli("check-config", "--config.file", str(path))
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    for expected in (
        f"{web}:1: tls_server_config.cert_file: expected a file path",
        f"{web}:3: basic_auth_users.prometheus: bcrypt cost 31 is outside 4..17",
        f"{web}:4: basic_auth_users.a:b: a user name cannot contain ':'",
        f"{web}:6: http_server_config.headers.Content-Length: cannot be configured",
        f"{web}:6: http_server_config.headers.X-Frame-Options: must be one of deny, sameorigin",
    ):
        assert expected in result.stderr, result.stderr
    # serve refuses the same web config, given on the command line, before it listens.
    result = run_cli("serve", "--web.listen-address", "127.0.0.1:0", "--web.config.file", str(web))
    assert result.returncode == 2 and "bcrypt cost 31 is outside" in result.stderr


# --- liveness and paging ([pager]) ---------------------------------------------------------


def test_liveness_keys_and_their_defaults(ckpt: Path) -> None:
    config = parse_config(
        """
defaults: {deadline: 90s}
jobs:
  - {name: a, path: ckpt}
  - {name: b, path: ckpt/b, abandon_after: 2h, abort_after: 20m, finished: true, page: false}
""",
        "test.yaml",
        ckpt.parent,
    )
    a, b = (job.policy for job in config.jobs)
    assert (a.abandon_after, a.abort_seconds, a.finished, a.page) == (86400, 600, False, True)
    assert (b.abandon_after, b.abort_seconds, b.finished, b.page) == (7200, 1200, True, False)
    shown = config_to_dict(config)["jobs"][1]
    assert (shown["abandon_after"], shown["abort_after"], shown["page"]) == ("2h", "20m", False)


def test_a_discovered_job_pages_only_on_objectives_someone_stated(ckpt: Path) -> None:
    """Every run under a root held to the built-in 15m / 60s would page for runs that save
    hourly: a root pages when its interval and deadline were stated, for it or in defaults."""

    def paging(text: str) -> list[bool]:
        return [d.policy.page for d in parse_config(text, "t.yaml", ckpt.parent).discover]

    assert paging("discover: [{root: ckpt}, {root: ckpt, interval: 1h}]") == [False, False]
    assert paging("discover: [{root: ckpt, interval: 1h, deadline: 5m}]") == [True]
    assert paging("defaults: {interval: 1h, deadline: 5m}\ndiscover: [{root: ckpt}]") == [True]
    assert paging("defaults: {interval: 1h}\ndiscover: [{root: ckpt, deadline: 5m}]") == [True]
    assert paging("discover: [{root: ckpt, page: true}]") == [True]
    assert paging("defaults: {page: true}\ndiscover: [{root: ckpt}]") == [True]


# --- check-config's output, byte for byte --------------------------------------------------------
#
# tests/golden/check-config.txt holds what check-config printed (exit status, stdout, stderr) for
# each config below, and what load_web_section (healthcheck's reader) said: every key of every
# mapping stated, each key given values of the wrong kind, unknown keys at every level, and the
# checks across keys. Config keys, defaults, the dump and the error messages are a contract
# (DESIGN.md); the golden pins all of them at once. UPDATE_GOLDEN=1 rewrites it after a change
# that is meant.

GOLDEN = Path(__file__).parent / "golden" / "check-config.txt"

# Every key of every mapping, as DESIGN.md and the docs name them.
POLICY_KEYS = (
    "interval", "deadline", "retained_generations", "capacity_reserve", "restore_drill_max_age",
    "layout", "watch", "poll_interval", "verify_checksums", "settle", "scope", "mtbf",
    "abandon_after", "abort_after", "finished", "page", "spool_owner",
)  # fmt: skip
SECTION_KEYS = {
    "web": ("listen_address", "telemetry_path", "config_file"),
    "paths": ("procfs", "sysfs", "rootfs"),
    "telemetry": ("sample_interval", "network_devices", "infiniband", "gpu", "retention"),
    "scan": (
        "metadata_ops_per_second", "reconcile_interval", "max_depth",
        "checksum_bytes_per_second", "metadata_memory_bytes",
    ),
    "defaults": POLICY_KEYS,
    "diagnosis": (
        "straggler_share", "straggler_seconds", "commit_share", "commit_seconds",
        "staging_share", "staging_seconds", "staging_network_share",
        "contention_deadline_share", "backlog_saves", "backlog_growth", "backlog_in_flight",
        "backlog_seconds", "gpu_share", "gpu_baseline", "telemetry_grace",
    ),
}  # fmt: skip
JOB_KEYS = ("name", "path", "staging", *POLICY_KEYS, "storage_options")
DISCOVER_KEYS = ("root", "max_jobs", "forget_after", *POLICY_KEYS, "storage_options")
TOP_KEYS = (*SECTION_KEYS, "spool", "spool_retention", "jobs", "discover")

EVERY_KEY = """
web: {listen_address: "127.0.0.1:9999", telemetry_path: /m, config_file: web.yaml}
paths: {procfs: /p, sysfs: rel/sys, rootfs: /r}
spool: spool
spool_retention: 2d
telemetry: {sample_interval: 2s, network_devices: "^eth", infiniband: false, gpu: "off",
            retention: 30m}
scan: {metadata_ops_per_second: 0, reconcile_interval: 2h, max_depth: 3,
       checksum_bytes_per_second: 1.0e+6, metadata_memory_bytes: 134217728}
defaults: {interval: 10m, deadline: 45s, retained_generations: 5, capacity_reserve: 0.1,
           restore_drill_max_age: 3d, layout: dcp, watch: poll, poll_interval: 7s,
           verify_checksums: true, settle: 9s, scope: shared, mtbf: 6h, abandon_after: 2d,
           abort_after: 20m, finished: false, page: true, spool_owner: [0, "root"]}
diagnosis: {straggler_share: 0.3, straggler_seconds: 2s, commit_share: 0.6, commit_seconds: 3s,
            staging_share: 0.4, staging_seconds: 4s, staging_network_share: 0.2,
            contention_deadline_share: 0.7, backlog_saves: 4, backlog_growth: 2,
            backlog_in_flight: 2, backlog_seconds: 5s, gpu_share: 0.6, gpu_baseline: 0.3,
            telemetry_grace: 20s}
jobs:
  - {name: a, path: ckpt/a, staging: ckpt/staging-a, interval: 20m, deadline: 2m, mtbf: 1d,
     abort_after: 1h, page: false, finished: true, layout: megatron, watch: inotify,
     retained_generations: 2, capacity_reserve: 0.3, restore_drill_max_age: 1d,
     poll_interval: 3s, verify_checksums: false, settle: 1s, scope: node, abandon_after: 1h,
     spool_owner: 0}
  - {name: b.2, path: ckpt/b}
  - {name: c, path: not-there-yet}
discover:
  - {root: ckpt, max_jobs: 7, forget_after: 3h, interval: 5m, deadline: 30s}
  - {root: ckpt/b, layout: hf}
  - {root: ckpt/a, page: true}
"""


def _every_key_wrong(value: str) -> str:
    """Every key of every mapping (and of a job and a discover entry) given ``value``."""

    def mapping(keys: tuple[str, ...]) -> str:
        return "{" + ", ".join(f"{key}: {value}" for key in keys) + "}"

    lines = [f"{section}: {mapping(keys)}" for section, keys in SECTION_KEYS.items()]
    lines += [f"spool: {value}", f"spool_retention: {value}"]
    lines += [f"jobs: [{mapping(JOB_KEYS)}]", f"discover: [{mapping(DISCOVER_KEYS)}]"]
    return "\n".join(lines) + "\n"


def _unknown_everywhere() -> str:
    """A misspelt key in every mapping: each says which key it might be."""
    lines = [f"{section}: {{{keys[0]}x: 1}}" for section, keys in SECTION_KEYS.items()]
    lines += ["spoool: /x", "jobs: [{name: a, path: ckpt/a, deadlin: 1m}]"]
    lines += ["discover: [{root: ckpt, max_job: 3}]", "zzz: 1"]
    return "\n".join(lines) + "\n"


GOLDEN_CASES = {
    "empty": "",
    "every key stated": EVERY_KEY,
    "a discovered root pages on stated objectives": (
        "defaults: {interval: 10m}\ndiscover:\n  - {root: ckpt}\n  - {root: ckpt/a, deadline: 1m}\n"
    ),
    "every key a mapping": _every_key_wrong("{k: 1}"),
    "every key a list": _every_key_wrong("[1, 2]"),
    "every key a word": _every_key_wrong("nonsense"),
    "every key negative": _every_key_wrong("-1"),
    "every key zero": _every_key_wrong("0"),
    "every key huge": _every_key_wrong("1e300"),
    "every key true": _every_key_wrong("true"),
    "every key empty": _every_key_wrong('""'),
    "unknown keys everywhere": _unknown_everywhere(),
    "sections of the wrong kind": (
        "web: 1\npaths: [a]\ntelemetry: x\nscan: true\ndefaults: 2\ndiagnosis: []\n"
        "jobs: {a: 1}\ndiscover: x\n"
    ),
    "entries of the wrong kind": "jobs: [1, x, [a]]\ndiscover: [1, {}]\n",
    "missing required keys": (
        "jobs:\n  - {deadline: 1m}\n  - {name: b}\ndiscover:\n  - {max_jobs: 3}\n"
    ),
    "duplicates and directories": (
        "jobs:\n  - {name: a, path: ckpt/a}\n  - {name: a, path: ckpt/b}\n"
        "  - {name: c, path: ckpt/a}\n  - {name: d, path: ckpt/file, staging: ckpt/b}\n"
    ),
    "ring too large": "telemetry: {sample_interval: 1ms, retention: 1d}\n",
    "values out of range": (
        'web: {listen_address: "[::1]:99999", telemetry_path: "/a b"}\n'
        "scan: {max_depth: 65, metadata_memory_bytes: 1, metadata_ops_per_second: 2e9}\n"
        "diagnosis: {backlog_saves: 13, backlog_growth: 0.5, gpu_share: 1.5}\n"
        "defaults: {capacity_reserve: 1, layout: tensorflow, spool_owner: [nosuchuser-xyz, -3]}\n"
        "jobs:\n  - {name: '-bad', path: ckpt/a}\n  - {name: b, path: \"a\\0b\"}\n"
    ),
    "web config that does not exist": "web: {config_file: missing.yaml}\n",
    "web config with problems": "web: {config_file: bad-web.yaml}\n",
    "not a mapping": "- 1\n- 2\n",
    "yaml error": "jobs: [\n",
    "duplicate yaml key": "spool: /a\nspool: /b\n",
}


def _golden_directory(tmp_path: Path) -> Path:
    for name in ("a", "b", "staging-a"):
        (tmp_path / "ckpt" / name).mkdir(parents=True)
    (tmp_path / "ckpt" / "file").write_text("")
    (tmp_path / "web.yaml").write_text("")
    (tmp_path / "bad-web.yaml").write_text("tls_server_config: {cert_file: x}\nbasic_auth: 1\n")
    return tmp_path


def _check_config_transcript(directory: Path, capsys: pytest.CaptureFixture[str]) -> str:
    out = []
    for name, text in GOLDEN_CASES.items():
        path = write_config(directory, text)
        status = main(["check-config", "--config.file", str(path)])
        captured = capsys.readouterr()
        try:
            web = f"{load_web_section(path)}"
        except ConfigError as error:
            web = f"ConfigError:\n{error}"
        out.append(
            f"## {name}\n### exit {status}\n### stdout\n{captured.out}### stderr\n{captured.err}"
            f"### load_web_section\n{web}\n"
        )
    return "".join(out).replace(str(directory), "<dir>")


def test_check_config_output_and_every_error_message_are_unchanged(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    transcript = _check_config_transcript(_golden_directory(tmp_path), capsys)
    if os.environ.get("UPDATE_GOLDEN"):
        GOLDEN.write_text(transcript)
    assert transcript == GOLDEN.read_text()


# --- one declaration per key ---------------------------------------------------------------------

MAPPINGS = {
    "web": (WebConfig, SECTION_KEYS["web"]),
    "paths": (PathsConfig, SECTION_KEYS["paths"]),
    "telemetry": (TelemetryConfig, SECTION_KEYS["telemetry"]),
    "scan": (ScanConfig, SECTION_KEYS["scan"]),
    "defaults": (Policy, SECTION_KEYS["defaults"]),
    "diagnosis": (DiagnosisThresholds, SECTION_KEYS["diagnosis"]),
    "jobs[]": (JobConfig, JOB_KEYS),
    "discover[]": (DiscoverConfig, DISCOVER_KEYS),
    "top": (Config, TOP_KEYS),
}


@pytest.mark.parametrize("mapping", MAPPINGS)
def test_each_mapping_accepts_and_prints_the_keys_its_dataclass_declares(mapping: str) -> None:
    """The parser's table and check-config's view are both read from the dataclass: the keys of
    each equal the keys the fields declare, in field order, and those are the contract's."""
    cls, contract = MAPPINGS[mapping]
    declared = [f.name for f in dataclasses.fields(cls) if config_module._KEY in f.metadata]
    table = [f.key for f in key_fields(cls, path=Path)]
    if cls in (JobConfig, DiscoverConfig):  # a job's policy keys sit in its own mapping
        declared = [
            key for name in declared for key in (POLICY_KEYS if name == "policy" else (name,))
        ]
    assert table == declared
    instance = cls(**{f.key: Path("/x") for f in key_fields(cls, Path) if f.required})
    assert list(dumped(instance)) == table
    assert sorted(table) == sorted(contract)


def test_a_key_declared_on_a_dataclass_is_parsed_checked_and_printed_with_no_other_edit() -> None:
    """A field added with its metadata is a key: accepted, its bad values refused with the
    reason, named in "known keys", and printed -- nothing else names it."""
    extended = dataclasses.make_dataclass(
        "ExtendedTelemetry",
        [
            ("ratio", float, dataclasses.field(default=0.5, metadata=config_module._key(_share))),
            ("window", float, dataclasses.field(default=60.0, metadata=config_module._duration())),
        ],
        bases=(TelemetryConfig,),
        frozen=True,
    )
    problems = Problems("f.yaml")
    values = problems.check(
        {"ratio": 0.75, "window": "2m", "gpu": "on"}, ("t",), key_fields(extended)
    )
    assert problems.found == []
    shown = dumped(extended(**values))
    assert (shown["gpu"], shown["ratio"], shown["window"]) == ("on", 0.75, "2m")
    assert list(shown)[-2:] == ["ratio", "window"]
    problems.check({"windw": "1m", "ratio": 2}, ("t",), key_fields(extended))
    reasons = [f"{p.key}: {p.reason}" for p in problems.found]
    assert reasons[0].startswith("t.windw: unknown key; did you mean 'window'? (known keys: ")
    assert "ratio, retention, sample_interval, window)" in reasons[0]
    assert reasons[1] == "t.ratio: must be above 0 and at most 1, got 2"
