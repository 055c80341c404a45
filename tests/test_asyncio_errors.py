"""The suite fails a test during which asyncio logs an error (see tests/asyncio_errors.py)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).parents[1]


def test_a_task_whose_exception_nobody_retrieves_fails_the_test(tmp_path: Path) -> None:
    """A test that drops a failed task fails with the task's exception in its report; one
    that awaits its task passes."""
    (tmp_path / "pytest.ini").write_text(
        "[pytest]\nasyncio_mode = auto\nasyncio_default_fixture_loop_scope = function\n")
    (tmp_path / "test_tasks.py").write_text(textwrap.dedent("""\
        import asyncio
        import gc

        async def boom():
            raise RuntimeError("nobody looked at me")

        async def test_drops_a_failed_task():
            task = asyncio.get_running_loop().create_task(boom())
            await asyncio.sleep(0)
            del task
            gc.collect()

        async def test_awaits_its_task():
            try:
                await asyncio.get_running_loop().create_task(boom())
            except RuntimeError:
                pass
    """))
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "tests.asyncio_errors", "-p", "no:cacheprovider",
         "-rf", "test_tasks.py"],
        check=False, cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True, text=True, timeout=120)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "1 failed, 1 passed" in done.stdout, done.stdout
    assert "FAILED test_tasks.py::test_drops_a_failed_task" in done.stdout, done.stdout
    assert "Task exception was never retrieved" in done.stdout
    assert "RuntimeError: nobody looked at me" in done.stdout
