"""The cached vLLM environment's scripts run from where it ends up: it is made under a
temporary name and renamed (``cache.venv_made_once``), and a venv's scripts name the
folder they were made in. A tiny venv stands in for vLLM's 3.5 GB one (``pip install``
replaced by writing a console script as pip does: ``#!`` and the venv's python)."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from inferlab.engines import vllm


def pip_like_script(bin_dir: Path) -> None:
    script = bin_dir / "vllm"
    script.write_text(f"#!{bin_dir / 'python'}\nimport sys\nprint('vllm in', sys.prefix)\n")
    script.chmod(0o755)


def fake_runner(log: object) -> Callable[[list[str]], None]:
    def run(argv: list[str]) -> None:
        if argv[1:3] == ["-m", "venv"]:
            subprocess.run([*argv[:3], "--without-pip", *argv[3:]], check=True)
        elif argv[1:4] == ["-m", "pip", "install"]:
            pip_like_script(Path(argv[0]).parent)

    return run


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("INFERLAB_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(vllm, "_runner", fake_runner)
    return tmp_path / "cache"


def test_the_installed_environments_scripts_run_from_its_final_folder(cache: Path) -> None:
    python = vllm.install_vllm()
    env = vllm.env_dir()
    assert python == env / "bin" / "python" and not list(cache.glob("*.tmp-*"))
    out = subprocess.run([str(env / "bin" / "vllm")], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == f"vllm in {env}"
    activated = subprocess.run(["bash", "-c", f". {env / 'bin' / 'activate'} && echo $VIRTUAL_ENV"],
                               capture_output=True, text=True, check=True)
    assert activated.stdout.strip() == str(env)
    assert ".tmp-" not in (env / "pyvenv.cfg").read_text()


def test_an_environment_cached_by_an_earlier_release_is_repaired_in_place(cache: Path) -> None:
    # (made in PATH.tmp-XXXX/NAME and renamed without rewriting its scripts)
    env = vllm.env_dir()
    gone = Path(f"{env}.tmp-758xn897") / env.name
    (env / "bin").mkdir(parents=True)
    os.symlink(sys.executable, env / "bin" / "python")
    (env / "pyvenv.cfg").write_text(f"home = {Path(sys.executable).parent}\ncommand = python -m venv {gone}\n")
    (env / "bin" / "activate").write_text(f'VIRTUAL_ENV="{gone}"\nexport VIRTUAL_ENV\n')
    script = env / "bin" / "vllm"
    script.write_text(f"#!{gone / 'bin' / 'python'}\nimport sys\nprint('vllm in', sys.prefix)\n")
    script.chmod(0o755)
    with pytest.raises(OSError):
        subprocess.run([str(script)], capture_output=True, check=False)
    vllm.install_vllm()  # (nothing is installed again: the runner is never asked)
    out = subprocess.run([str(script)], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == f"vllm in {env}" and os.access(script, os.X_OK)
    assert str(gone) not in (env / "bin" / "activate").read_text() + (env / "pyvenv.cfg").read_text()
