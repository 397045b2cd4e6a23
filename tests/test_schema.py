"""The config-schema helper every config reader uses: fields, key paths, lines and reasons."""

from __future__ import annotations

from pathlib import Path

import pytest

from checkpoint_exporter.schema import (
    ConfigError,
    Field,
    Problems,
    positive_duration,
    read_mapping_file,
    read_yaml,
    whole_number,
)
from checkpoint_exporter.webconfig import load_web_config

JOB_FIELDS = (
    Field("name", required=True),
    Field("deadline", positive_duration),
    Field("retained_generations", whole_number(1, 10), default=3),
)


def checked(text: str) -> tuple[list[dict[str, object]], list[str]]:
    """Each entry of ``jobs`` checked against JOB_FIELDS, and every problem as printed."""
    document = read_yaml(text, "f.yaml")
    problems = Problems.of("f.yaml", document)
    entries = [
        problems.check(entry, ("jobs", i), JOB_FIELDS)
        for i, entry in enumerate(document.data["jobs"])
    ]
    return entries, [str(problem) for problem in problems.found]


def test_values_are_parsed_and_defaults_filled() -> None:
    entries, found = checked("jobs:\n  - {name: a, deadline: 90s}\n  - {name: b}\n")
    assert found == []
    assert entries == [
        {"name": "a", "deadline": 90.0, "retained_generations": 3},
        {"name": "b", "retained_generations": 3},
    ]


def test_a_refused_value_names_its_full_key_path_and_line() -> None:
    _, found = checked("jobs:\n  - name: a\n  - name: b\n    deadline: 0s\n")
    assert found == ["f.yaml:4: jobs[1].deadline: must be greater than zero"]


def test_a_refused_value_is_dropped_and_takes_the_default() -> None:
    entries, found = checked("jobs:\n  - {name: a, retained_generations: 11, deadline: soon}\n")
    assert entries == [{"name": "a", "retained_generations": 3}]
    assert found[0] == "f.yaml:2: jobs[0].retained_generations: must be at most 10, got 11"
    assert found[1].startswith("f.yaml:2: jobs[0].deadline: invalid duration 'soon'")


def test_an_unknown_key_suggests_the_closest_and_lists_the_known_ones() -> None:
    _, found = checked("jobs:\n  - name: a\n    deadlin: 5s\n")
    assert found == [
        "f.yaml:3: jobs[0].deadlin: unknown key; did you mean 'deadline'? "
        "(known keys: deadline, name, retained_generations)"
    ]


def test_the_unknown_key_wording_is_the_readers_choice() -> None:
    problems = Problems("plan.yaml", read_yaml("parametres: 1\nzzz: 2\n", "plan.yaml").lines)
    problems.check(
        {"parametres": 1, "zzz": 2}, (), (Field("parameters"),), noun="input", list_known=False
    )
    assert [str(p) for p in problems.found] == [
        "plan.yaml:1: parametres: unknown input; did you mean 'parameters'?",
        "plan.yaml:2: zzz: unknown input",
    ]


def test_a_missing_required_key_is_placed_at_its_mapping() -> None:
    _, found = checked("jobs:\n  - name: a\n  - deadline: 5s\n")
    assert found == ["f.yaml:3: jobs[1]: missing required key 'name'"]


def test_a_mapping_of_the_wrong_shape() -> None:
    entries, found = checked("jobs:\n  - [name, a]\n  -\n")
    assert entries == [{}, {"retained_generations": 3}]  # an empty entry reads as an empty mapping
    assert found == [
        "f.yaml:2: jobs[0]: expected a mapping, got a list",
        "f.yaml:3: jobs[1]: missing required key 'name'",
    ]


def test_a_key_the_file_lacks_is_placed_at_the_nearest_enclosing_key() -> None:
    problems = Problems("f.yaml", read_yaml("\n\ntls:\n  cert: a\n", "f.yaml").lines)
    problems.add(("tls", "client_ca_file"), "required with RequireAndVerifyClientCert")
    problems.add(("elsewhere",), "no line of its own")
    assert [str(p) for p in problems.found] == [
        "f.yaml:3: tls.client_ca_file: required with RequireAndVerifyClientCert",
        "f.yaml:3: elsewhere: no line of its own",  # the document itself starts on line 3
    ]


def test_problems_under_a_value_the_yaml_reader_refused_are_not_repeated() -> None:
    _, found = checked("jobs:\n  - name: a\n    deadline: !!python/name:os.system x\n")
    assert len(found) == 1 and "could not determine a constructor" in found[0], found


def test_raise_if_any_raises_one_error_with_every_problem() -> None:
    problems = Problems("f.yaml")
    problems.raise_if_any()  # nothing found: nothing raised
    problems.add(("a",), "first")
    problems.add(("b", 0), "second")
    with pytest.raises(ConfigError) as caught:
        problems.raise_if_any()
    assert str(caught.value) == "f.yaml: a: first\nf.yaml: b[0]: second"


def test_read_mapping_file(tmp_path: Path) -> None:
    good = tmp_path / "good.yaml"
    good.write_text("a: 1\nb:\n  c: 2\n")
    data, problems = read_mapping_file(good)
    assert data == {"a": 1, "b": {"c": 2}} and problems.found == []
    assert problems.lines[("b", "c")] == 3

    empty = tmp_path / "empty.yaml"
    empty.write_text("")
    assert read_mapping_file(empty)[0] == {}

    listed = tmp_path / "list.yaml"
    listed.write_text("- a\n")
    with pytest.raises(ConfigError, match=r"^.*list\.yaml: expected a mapping$"):
        read_mapping_file(listed)
    with pytest.raises(ConfigError, match=r"absent\.yaml: file does not exist$"):
        read_mapping_file(tmp_path / "absent.yaml")


def test_a_web_config_user_name_with_a_dot_is_placed_on_its_line(tmp_path: Path) -> None:
    """The web config looked lines up by splitting its dotted key text at '.', so a user named
    jane.doe (or a header with a dot) was reported without a line; the key path finds it."""
    web = tmp_path / "web.yaml"
    web.write_text("basic_auth_users:\n  prometheus: $2y$10$" + "a" * 53 + "\n  jane.doe: secret\n")
    with pytest.raises(ConfigError) as caught:
        load_web_config(web)
    assert [str(p) for p in caught.value.problems] == [
        f"{web}:3: basic_auth_users.jane.doe: expected a bcrypt hash ($2y$..., from htpasswd -B)"
    ]
