"""Notebook 00's lesson (``lessons.start_here``): the environment check warns for a different
version and fails only for a missing or too old one."""

from __future__ import annotations

import re
import warnings

import pytest
import torch

from attn_helpers.lessons import start_here as lesson


def requirements(tmp_path, **pins):
    path = tmp_path / "requirements.txt"
    path.write_text("# a comment\n" + "".join(f"{k}=={v}  # why\n" for k, v in pins.items())
                    + "some-tool>=1\n")
    return path


def test_pinned_versions_reads_exact_pins(tmp_path):
    path = requirements(tmp_path, torch="2.13.0", jupyterlab_server="2.28.1")
    assert lesson.pinned_versions(path) == {"torch": "2.13.0", "jupyterlab-server": "2.28.1"}
    assert lesson.pinned_versions(tmp_path / "missing.txt") == {}


def test_the_shipped_requirements_pin_every_checked_package():
    pins = lesson.pinned_versions()
    assert set(lesson.PACKAGES) <= set(pins)


def test_release_parses_local_and_pre_release_versions():
    assert lesson._release("2.13.0+cpu") == (2, 13, 0)
    assert lesson._release("8.1.9") == (8, 1, 9)
    assert lesson._release("2.14.0rc1") == (2, 14, 0)
    assert lesson._release("2.12.0.dev20250101") == (2, 12, 0)


def test_a_different_version_warns_and_does_not_fail(tmp_path):
    installed = torch.__version__.split("+")[0]
    other = "2.12.0" if not installed.startswith("2.12") else "2.14.0"
    path = requirements(tmp_path, torch=other)
    with pytest.warns(UserWarning, match=rf"torch {re.escape(torch.__version__)}.*tested with {other}"):
        rows = lesson.check_environment(path)
    assert {row["name"]: row["status"] for row in rows}["torch"] == "different"


def test_matching_versions_are_silent(tmp_path):
    path = requirements(tmp_path, torch=torch.__version__.split("+")[0])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        rows = lesson.check_environment(path)
    assert all(row["status"] == "ok" for row in rows)


def test_too_old_fails_with_a_message_naming_the_package(tmp_path, monkeypatch):
    versions = {"torch": "2.1.0", "numpy": "2.4.6", "matplotlib": "3.11.2", "ipywidgets": "7.8.1",
                "jupyterlab": "4.6.6"}
    monkeypatch.setattr(lesson.metadata, "version", versions.__getitem__)
    with pytest.raises(RuntimeError, match=r"torch >= 2.3 \(found 2.1.0\), ipywidgets >= 8.1"):
        lesson.check_environment(tmp_path / "none.txt")


def test_a_missing_jupyterlab_only_warns(tmp_path, monkeypatch):
    versions = {"torch": "2.13.0", "numpy": "2.4.6", "matplotlib": "3.11.2", "ipywidgets": "8.1.9"}

    def version(name):
        if name not in versions:
            raise lesson.metadata.PackageNotFoundError(name)
        return versions[name]

    monkeypatch.setattr(lesson.metadata, "version", version)
    with pytest.warns(UserWarning, match=r"jupyterlab is not installed"):
        rows = lesson.check_environment(tmp_path / "none.txt")
    assert {row["name"]: row["status"] for row in rows}["jupyterlab"] == "optional"
