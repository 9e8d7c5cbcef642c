from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def _isolated_user_space(tmp_path_factory, monkeypatch):
    """Every test gets an empty user space so ~/.ai on the machine never leaks in."""
    monkeypatch.setenv("AI_USER_SPACE", str(tmp_path_factory.mktemp("user-space")))
