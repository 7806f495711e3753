"""``inferlab gateway`` failing to start says why in one line, with the exit code of a
runtime failure, and leaves nothing behind: a port in use, an access log folder that
holds a run."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path


def gateway(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "inferlab", "gateway", "--upstream", "http://127.0.0.1:9",
                           *args], capture_output=True, text=True, timeout=120, env={**os.environ, "COLUMNS": "250"})


def test_a_port_in_use_is_one_line_and_exit_1_and_leaves_no_access_log(tmp_path: Path) -> None:
    log = tmp_path / "log"
    config = tmp_path / "gw.toml"
    config.write_text(f'[gateway]\naccess_log = "{log}"\n')
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        p = gateway("--port", str(port), "--config", str(config))
    assert p.returncode == 1
    assert p.stderr.strip().splitlines() == [f"inferlab: error: cannot listen on 127.0.0.1:{port}: Address already in use"]
    assert not log.exists()  # (a second try with a free port is not refused for a run it never wrote)


def test_an_access_log_folder_with_a_run_names_the_setting(tmp_path: Path) -> None:
    log = tmp_path / "log"
    log.mkdir()
    (log / "requests.jsonl").write_text("")
    config = tmp_path / "gw.toml"
    config.write_text(f'[gateway]\naccess_log = "{log}"\n')
    p = gateway("--port", "0", "--config", str(config))
    assert p.returncode == 2
    [line] = p.stderr.strip().splitlines()
    assert line == (f"inferlab: error: [gateway] access_log {log} already holds a run (requests.jsonl): give another "
                    "folder, or move that run away")


def test_the_start_line_says_how_prompts_are_counted(tmp_path: Path) -> None:
    one = '[[keys]]\nname = "a"\nkey = "sk-a"\n'  # (one key, one request in flight: singular words)
    for tokenizer, said, more in (("upstream", "prompts counted by each upstream's /tokenize", ""),
                                  ("estimate", "admission requests (1 request per upstream; prompts counted by 4 "
                                   "characters a token); 1 client key;",
                                   'mode = "requests"\nmax_requests_in_flight = 1\n' + one),
                                  # (an upstream's own budget beside the default: the line said 65536 per upstream alone)
                                  ("estimate", "admission tokens (65,536 tokens per upstream, 32,768 on 127.0.0.1:10; prompts",
                                   '[[upstreams]]\nurl = "http://127.0.0.1:10"\nmax_tokens_in_flight = 32768\n')):
        config = tmp_path / f"{tokenizer}.toml"
        config.write_text(f'[admission]\ntokenizer = "{tokenizer}"\n' + more)
        p = subprocess.Popen([sys.executable, "-m", "inferlab", "gateway", "--upstream", "http://127.0.0.1:9",
                              "--port", "0", "--announce", "--config", str(config)],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            assert p.stdout is not None and p.stderr is not None
            assert p.stdout.readline().startswith("http://127.0.0.1:")
            # (the line after any warning the start logged: the upstream does not answer)
            # (it follows the announced URL at once; a gateway that died ends the pipe: "")
            line = ""
            while not line.startswith("inferlab gateway on"):
                line = p.stderr.readline()
                if not line:
                    break
        finally:
            p.terminate()
            p.wait(timeout=30)
        assert said in line, line
