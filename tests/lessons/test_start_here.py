"""Notebook 00's environment check: a different version warns, a missing or too old one fails."""

from __future__ import annotations

import re
import warnings

import pytest
import torch

from attn_helpers.lessons import start_here as lesson


def requirements(tmp_path, torch_version):
    path = tmp_path / "requirements.txt"
    path.write_text(f"# a comment\ntorch=={torch_version}  # why\nsome-tool>=1\n")
    return path


def test_the_shipped_requirements_pin_every_checked_package():
    rows = lesson.check_environment()
    assert all(row["pinned"] for row in rows[1:]), rows


def test_a_different_version_warns_and_matching_ones_are_silent(tmp_path):
    installed = torch.__version__.split("+")[0]
    other = "2.12.0" if not installed.startswith("2.12") else "2.14.0"
    with pytest.warns(UserWarning, match=rf"torch {re.escape(torch.__version__)}.*tested with {other}"):
        rows = lesson.check_environment(requirements(tmp_path, other))
    assert rows[1]["name"] == "torch" and rows[1]["status"] == "different"
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        rows = lesson.check_environment(requirements(tmp_path, installed))
    assert all(row["status"] == "ok" for row in rows)


def test_too_old_fails_naming_the_package_and_a_missing_jupyterlab_only_warns(tmp_path, monkeypatch):
    versions = {"torch": "2.1.0", "numpy": "2.4.6", "matplotlib": "3.11.2", "ipywidgets": "7.8.1"}

    def version(name):
        if name not in versions:
            raise lesson.metadata.PackageNotFoundError(name)
        return versions[name]

    monkeypatch.setattr(lesson.metadata, "version", version)
    with pytest.warns(UserWarning, match="jupyterlab is not installed"), pytest.raises(
            RuntimeError, match=r"torch >= 2.5 \(found 2.1.0\), ipywidgets >= 8.1"):
        lesson.check_environment(tmp_path / "none.txt")
    versions.update(torch="2.13.0", ipywidgets="8.1.9")
    with pytest.warns(UserWarning, match="jupyterlab is not installed"):
        rows = lesson.check_environment(tmp_path / "none.txt")
    assert rows[-1]["name"] == "jupyterlab" and rows[-1]["status"] == "optional"


def test_a_missing_requirements_file_warns_that_only_minimums_were_checked(tmp_path):
    with pytest.warns(UserWarning, match=r"no none.txt at .*only the minimum versions were checked"):
        rows = lesson.check_environment(tmp_path / "none.txt")
    assert not any(row["pinned"] for row in rows)
