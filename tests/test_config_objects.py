"""Object URLs in the config file: s3:// accepted as a job's path or staging without an existence
check (gs:// and az:// too), its storage_options free of secrets and each for its own store."""

from __future__ import annotations

import pytest

from checkpoint_exporter.config import OBJECT_POLL_INTERVAL, ConfigError, parse_config


def _problems(text: str) -> list[str]:
    with pytest.raises(ConfigError) as raised:
        parse_config(text, "f.yaml")
    return [str(problem) for problem in raised.value.problems]


def test_an_s3_url_is_a_path_and_staging_polled_every_30_seconds() -> None:
    config = parse_config(
        "jobs:\n"
        "  - {name: a, path: 's3://bucket//run/', storage_options: {endpoint_url: 'http://x:9000',"
        " allow_http: true, region: eu-west-1}}\n"
        "  - {name: b, path: 's3://bucket/b', poll_interval: 1m}\n"
    )
    a, b = config.jobs
    assert str(a.path) == "s3://bucket/run"
    assert dict(a.storage_options) == {
        "endpoint_url": "http://x:9000", "allow_http": True, "region": "eu-west-1",
    }  # fmt: skip
    assert a.policy.poll_interval == OBJECT_POLL_INTERVAL
    assert b.policy.poll_interval == 60.0  # stated: kept
    assert config.warnings == ()  # no existence check, no note


@pytest.mark.parametrize("key", ["aws_secret_access_key", "session_token", "password"])
def test_a_secret_in_storage_options_is_refused_naming_file_and_key(key: str) -> None:
    (problem,) = _problems(
        f"jobs:\n  - {{name: a, path: 's3://b/x', storage_options: {{{key}: hunter2}}}}"
    )
    assert problem.startswith("f.yaml:2: jobs[0].storage_options: ")
    assert f"{key} looks like a secret" in problem
    assert "hunter2" not in problem  # the value itself is never repeated


@pytest.mark.parametrize("scheme", ["gs", "az"])
def test_gcs_and_azure_urls_are_paths_polled_every_30_seconds(scheme: str) -> None:
    (job,) = parse_config(f"jobs:\n  - {{name: a, path: '{scheme}://b//x/'}}").jobs
    assert str(job.path) == f"{scheme}://b/x"
    assert job.policy.poll_interval == OBJECT_POLL_INTERVAL


def test_an_option_of_another_store_is_refused_naming_the_store_it_is_for() -> None:
    (problem,) = _problems(
        "jobs:\n  - {name: a, path: 'gs://b/x', storage_options: {account_name: acct}}"
    )
    assert problem == (
        "f.yaml:2: jobs[0].storage_options.account_name: is for az:// only; "
        "the object URLs here are gs://"
    )
    (job,) = parse_config(
        "jobs:\n  - {name: a, path: 'az://c/x', storage_options: {account_name: acct}}"
    ).jobs
    assert dict(job.storage_options) == {"account_name": "acct"}
    (problem,) = _problems(
        "jobs:\n  - {name: a, path: 'az://c/x', storage_options: {account_name: Not_Valid}}"
    )
    assert "account_name: expected 3 to 24 lower-case letters and digits" in problem


def test_an_object_discover_root_is_polled_every_30_seconds_with_its_options() -> None:
    (entry,) = parse_config(
        "discover:\n  - {root: 's3://b//runs/', storage_options: {endpoint_url: 'http://s:9000'}}"
    ).discover
    assert str(entry.root) == "s3://b/runs"
    assert entry.policy.poll_interval == OBJECT_POLL_INTERVAL
    assert dict(entry.storage_options) == {"endpoint_url": "http://s:9000"}
    (problem,) = _problems(
        "discover:\n  - {root: 'gs://b/runs', storage_options: {account_name: acct}}"
    )
    assert problem.endswith("discover[0].storage_options.account_name: is for az:// only; "
                            "the object URLs here are gs://")  # fmt: skip


def test_storage_options_beside_a_directory_are_refused() -> None:
    (problem,) = _problems("jobs:\n  - {name: a, path: /tmp, storage_options: {region: x}}")
    assert "storage_options: is for object URLs" in problem
    (problem,) = _problems("discover:\n  - {root: /tmp, storage_options: {region: x}}")
    assert "discover[0].storage_options: is for object URLs" in problem


@pytest.mark.parametrize(
    "endpoint",
    ["http://user:hunter2@store:9000", "https://store/?X-Amz-Signature=hunter2", "store"],
)
def test_an_endpoint_with_credentials_or_no_scheme_is_refused(endpoint: str) -> None:
    """The endpoint names the store's worker in logs and labels: no secret may ride in it."""
    (problem,) = _problems(
        f"jobs:\n  - {{name: a, path: 's3://b/x', storage_options: {{endpoint_url: '{endpoint}'}}}}"
    )
    assert "storage_options: endpoint_url: " in problem
    assert "hunter2" not in problem
