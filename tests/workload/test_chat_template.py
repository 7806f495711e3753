"""A local tokenizer's own chat template (its ``tokenizer_config.json``), rendered as
``transformers`` renders it, in the client's counts, ``tokens`` and the simulated server.
The expected prompts below are written out by hand, not rendered by the code under test."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("tokenizers")
pytest.importorskip("jinja2")

from inferlab import UsageError
from inferlab.sim.engine.engine import EngineConfig
from inferlab.sim.server.app import ServerConfig
from inferlab.sim.server.launch import EmbeddedServer
from inferlab.workload.tokenizers import CHATML, load_tokenizer

# Gemma-like: a BOS token, turns, no system role. The newline after each ``{% ... %}``
# tag disappears (``trim_blocks``), the indentation before one too (``lstrip_blocks``).
TEMPLATE = (
    "{{ bos_token }}"
    "{% for m in messages %}\n"
    "    {% if m['role'] == 'system' %}{{ raise_exception('System role not supported') }}{% endif %}\n"
    "<start_of_turn>{{ m['role'] }}\n{{ m['content'] | trim }}<end_of_turn>\n"
    "{% endfor %}\n"
    "{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}"
)
MESSAGES = [{"role": "user", "content": "  hello there  "}, {"role": "assistant", "content": "hi"}, {"role": "user", "content": [{"type": "text", "text": "why?"}]}]
RENDERED = (
    "<|endoftext|><start_of_turn>user\nhello there<end_of_turn>\n"
    "<start_of_turn>assistant\nhi<end_of_turn>\n<start_of_turn>user\nwhy?<end_of_turn>\n"
)
GENERATION_PROMPT = "<start_of_turn>model\n"


def _model_dir(tmp_path: Path, tokenizer_path: str, config: object) -> Path:
    d = tmp_path / "model"
    d.mkdir()
    shutil.copy(tokenizer_path, d / "tokenizer.json")
    (d / "tokenizer_config.json").write_text(config if isinstance(config, str) else json.dumps(config))
    return d


@pytest.fixture
def model_dir(tmp_path: Path, tokenizer_path: str) -> Path:
    bos = {"content": "<|endoftext|>", "lstrip": False, "normalized": False, "rstrip": False, "special": True}
    return _model_dir(tmp_path, tokenizer_path, {"bos_token": bos, "eos_token": "<end_of_turn>", "chat_template": TEMPLATE})


def test_the_models_own_template_is_rendered(model_dir: Path) -> None:
    tok = load_tokenizer(str(model_dir))
    assert tok.template_source == str(model_dir / "tokenizer_config.json")
    assert tok.apply_chat_template(MESSAGES) == tok.encode(RENDERED + GENERATION_PROMPT)
    assert tok.apply_chat_template(MESSAGES, add_generation_prompt=False) == tok.encode(RENDERED)


def test_chatml_when_the_tokenizer_has_no_template(tmp_path: Path, tokenizer_path: str) -> None:
    alone = load_tokenizer(tokenizer_path)  # no tokenizer_config.json beside it
    assert alone.template_source == CHATML
    chatml = "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    assert alone.apply_chat_template([{"role": "user", "content": "hi"}]) == alone.encode(chatml)
    no_template = load_tokenizer(str(_model_dir(tmp_path, tokenizer_path, {"bos_token": "<s>"})))
    assert no_template.template_source == CHATML


def test_the_default_of_named_templates(tmp_path: Path, tokenizer_path: str) -> None:
    config = {"bos_token": "<|endoftext|>", "chat_template": [
        {"name": "tool_use", "template": "{{ raise_exception('not this one') }}"},
        {"name": "default", "template": TEMPLATE},
    ]}
    tok = load_tokenizer(str(_model_dir(tmp_path, tokenizer_path, config)))
    assert tok.apply_chat_template(MESSAGES) == tok.encode(RENDERED + GENERATION_PROMPT)


@pytest.mark.parametrize(("config", "message"), [
    ("{not json", r"tokenizer_config\.json: not JSON"),
    (json.dumps({"chat_template": "{% for m in messages %}"}), r"tokenizer_config\.json: its chat_template does not parse"),
])
def test_a_broken_config_is_a_usage_error(tmp_path: Path, tokenizer_path: str, config: str, message: str) -> None:
    with pytest.raises(UsageError, match=message):
        load_tokenizer(str(_model_dir(tmp_path, tokenizer_path, config)))


def test_the_simulated_server_counts_the_models_template(model_dir: Path) -> None:
    httpx = pytest.importorskip("httpx")
    tok = load_tokenizer(str(model_dir))
    with EmbeddedServer(ServerConfig(EngineConfig(), tokenizer=str(model_dir))) as sim:
        body = {"model": sim.server.config.model_name, "messages": MESSAGES, "max_tokens": 2}
        r = httpx.post(f"{sim.url}/v1/chat/completions", json=body, timeout=30)
        assert r.status_code == 200, r.text
        assert r.json()["usage"]["prompt_tokens"] == len(tok.encode(RENDERED + GENERATION_PROMPT))
        r = httpx.post(f"{sim.url}/tokenize", json={"messages": MESSAGES, "add_generation_prompt": False}, timeout=30)
        assert r.json()["count"] == len(tok.encode(RENDERED))
        # the template's own refusal is the client's error, as in vLLM
        system = {**body, "messages": [{"role": "system", "content": "be brief"}, *MESSAGES]}
        r = httpx.post(f"{sim.url}/v1/chat/completions", json=system, timeout=30)
        assert r.status_code == 400 and "System role not supported" in r.json()["error"]["message"]


def test_tokens_says_which_template_it_counted(model_dir: Path) -> None:
    tok = load_tokenizer(str(model_dir))
    cmd = [sys.executable, "-m", "inferlab", "tokens", "--tokenizer", str(model_dir), "--prompt", "hello there", "--json"]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout)
    assert out["chat_template"] == str(model_dir / "tokenizer_config.json")
    expected = "<|endoftext|><start_of_turn>user\nhello there<end_of_turn>\n" + GENERATION_PROMPT
    assert out["total_tokens"] == len(tok.encode(expected))


def test_a_template_saved_as_chat_template_jinja_is_the_models(tmp_path: Path, tokenizer_path: str) -> None:
    """Newer transformers save the template beside the tokenizer as chat_template.jinja
    (tokenizer_config.json keeps the special tokens, no chat_template): it is the one
    rendered and named, not ChatML."""
    d = _model_dir(tmp_path, tokenizer_path, {"bos_token": "<|endoftext|>"})
    (d / "chat_template.jinja").write_text(TEMPLATE)
    tok = load_tokenizer(str(d))
    assert tok.template_source == str(d / "chat_template.jinja")
    assert tok.apply_chat_template(MESSAGES) == tok.encode(RENDERED + GENERATION_PROMPT)
    (d / "tokenizer_config.json").unlink()  # (alone, without the config: still the model's)
    assert load_tokenizer(str(d)).template_source == str(d / "chat_template.jinja")


def test_a_template_that_refuses_the_messages_is_a_usage_error_naming_it(model_dir: Path) -> None:
    """Gemma's template has no system role: `tokens --system ...` says so, exit 2, not an
    internal error."""
    cmd = [sys.executable, "-m", "inferlab", "tokens", "--tokenizer", str(model_dir), "--system", "be brief", "--prompt", "hi"]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert p.returncode == 2, p.stderr
    assert "refuses these messages (system/user): System role not supported" in p.stderr
    assert "internal error" not in p.stderr


def test_tokens_names_the_dataset_row_whose_messages_the_template_refuses(model_dir: Path, tmp_path: Path) -> None:
    """Over a prompt set the refusal names the row that has the system message (it named
    none: which of thousands of rows was it?)."""
    data = tmp_path / "d.jsonl"
    data.write_text('{"prompt": "hi"}\n{"messages": [{"role": "system", "content": "be brief"}, '
                    '{"role": "user", "content": "hi"}]}\n')
    cmd = [sys.executable, "-m", "inferlab", "tokens", "--tokenizer", str(model_dir), "--dataset", str(data)]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert p.returncode == 2 and len(p.stderr.strip().splitlines()) == 1, p.stderr
    assert f"{data}:2: the chat template" in p.stderr and "System role not supported" in p.stderr


def test_a_template_that_joins_texts_counts_no_negative_template_tokens(tmp_path: Path, tokenizer_path: str) -> None:
    """A template that concatenates the messages' texts: BPE merges tokens across the join
    ("im" + "port" is "import"), so the templated prompt is shorter than its parts; the
    chat template was -1 tokens. It is 0, and the merge is said."""
    tok = load_tokenizer(tokenizer_path)
    assert len(tok.encode("import")) < len(tok.encode("im")) + len(tok.encode("port"))  # (the premise)
    d = _model_dir(tmp_path, tokenizer_path, {"chat_template": "{% for m in messages %}{{ m['content'] }}{% endfor %}"})
    cmd = [sys.executable, "-m", "inferlab", "tokens", "--tokenizer", str(d), "--system", "im", "--prompt", "port",
           "--prefill-tps", "1000"]
    p = subprocess.run([*cmd, "--json"], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout)
    assert out["template_tokens"] == 0 and out["merged_tokens"] > 0
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0 and "BPE merges tokens across the join" in " ".join(p.stdout.split()), p.stdout
