"""A study's folder (`studies.folder`): its env.json says the study folders' own schema
version, checked on read as a run folder's is (`results.schema_of`)."""

import json

import pandas as pd
import pytest

from convbench.core import results
from convbench.studies import folder


def written(tmp_path, env=None):
    path = tmp_path / "study"
    frame = pd.DataFrame({"batch": [1, 2], "peak_bytes": [10, 20]})
    names = folder.write_study(path, "memplan", "# A study\n", frame,
                               env or {"device": "cpu", "run": {"command": "a test"}})
    return path, names


def test_a_study_folder_says_its_schema_and_reads_back(tmp_path):
    path, names = written(tmp_path)
    assert names == [results.REPORT_MD, "memplan.csv", results.ENV_JSON]
    env = json.loads((path / results.ENV_JSON).read_text())
    assert next(iter(env)) == "schema" and env["schema"] == folder.SCHEMA
    df, read = folder.read_study(path, "memplan")
    assert list(df["peak_bytes"]) == [10, 20] and read == env


def test_a_study_folder_without_a_schema_is_version_0_and_a_newer_one_is_refused(tmp_path):
    path, _ = written(tmp_path)
    env_path = path / results.ENV_JSON
    env = json.loads(env_path.read_text())
    del env["schema"]  # a folder from before versions: read as it is
    env_path.write_text(json.dumps(env))
    assert folder.read_study(path, "memplan")[1] == env
    env_path.write_text(json.dumps({**env, "schema": folder.SCHEMA + 1}))
    with pytest.raises(ValueError) as exc:
        folder.read_study(path, "memplan")
    assert "\n" not in str(exc.value) and "newer than this convbench reads" in str(exc.value)
    with pytest.raises(ValueError, match="is not a scale folder"):
        folder.read_study(path, "scale")
