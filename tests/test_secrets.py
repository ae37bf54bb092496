"""sparkctl.secrets: which names are secrets, and masking them in argv, env and text."""
import json
import re
from pathlib import Path

import pytest

from sparkctl.secrets import MASK, is_secret_name, mask_argv, mask_env, mask_text

ENGINES = Path(__file__).resolve().parents[1] / "sparkctl" / "engine_flags"


@pytest.mark.parametrize("name", [
    "VLLM_API_KEY", "HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "--api-key", "--hf-token", "--admin-api-key",
    "api-key", "engine_args.api-key", "api_key", "apiKey", "S3_SECRET_ACCESS_KEY", "--ssl-keyfile-password",
    "DB_PASSWORD", "GITHUB_TOKEN", "OPENAI_API_KEY", "token", "MY_SECRET", "PRIVATE_KEY",
])
def test_secret_names(name):
    assert is_secret_name(name)


@pytest.mark.parametrize("name", [
    "--max-num-batched-tokens", "--bucket-time-to-first-token", "--kt-max-deferred-experts-per-token",
    "SGLANG_MAX_NEW_TOKENS_LIMIT", "SGLANG_LOG_DECODE_GRAPH_KEY", "--ssl-keyfile", "--tokenizer",
    "--spec-tokens", "NCCL_SOCKET_IFNAME", "--port", "VLLM_USE_FASTOKENS", "S3_ACCESS_KEY_ID", "", "--",
    "SGLANG_INIT_NEW_TOKEN_RATIO", "--tokenizer-mode", "--allow-credentials",
])
def test_not_secret_names(name):
    assert not is_secret_name(name)


def test_every_real_engine_flag_that_is_secret_is_an_auth_flag():
    # Over the real vLLM 0.33.0 and SGLang 0.5.23 flag lists, exactly the auth flags are secret.
    found = set()
    for path in ENGINES.glob("*.json"):
        if path.name == "parsers.json":
            continue
        text = path.read_text()
        found |= {flag for flag in re.findall(r'"(--[a-z0-9-]+)"', text) if is_secret_name(flag)}
    assert found == {"--api-key", "--hf-token", "--admin-api-key", "--ssl-keyfile-password"}


def test_mask_argv_both_forms_and_assignments():
    argv = ["vllm", "serve", "model", "--api-key", "sk-1", "--hf-token=hf_2", "--port", "8000",
            "-e", "HF_TOKEN=hf_3", "NCCL_DEBUG=INFO", "--max-num-batched-tokens", "8192"]
    masked = mask_argv(argv)
    assert masked == ["vllm", "serve", "model", "--api-key", MASK, f"--hf-token={MASK}", "--port", "8000",
                      "-e", f"HF_TOKEN={MASK}", "NCCL_DEBUG=INFO", "--max-num-batched-tokens", "8192"]
    assert argv[4] == "sk-1"  # a copy: the argv that runs keeps its value
    assert not any(s in json.dumps(masked) for s in ("sk-1", "hf_2", "hf_3"))


def test_mask_argv_secret_option_last_has_nothing_to_mask():
    assert mask_argv(["x", "--api-key"]) == ["x", "--api-key"]


def test_mask_env():
    env = {"VLLM_API_KEY": "sk-1", "HF_TOKEN": "", "NCCL_DEBUG": "INFO"}
    assert mask_env(env) == {"VLLM_API_KEY": MASK, "HF_TOKEN": "", "NCCL_DEBUG": "INFO"}
    assert env["VLLM_API_KEY"] == "sk-1"


@pytest.mark.parametrize("text,secret", [
    ("exec vllm serve m --api-key sk-1 --port 8000", "sk-1"),
    ("x --api-key 'sk 1' --port 8000", "sk 1"),
    ("vllm serve --api-key=sk-1", "sk-1"),
    ("export HF_TOKEN=hf_abc", "hf_abc"),
    ("  api-key: sk-yaml", "sk-yaml"),
])
def test_mask_text(text, secret):
    masked = mask_text(text)
    assert secret not in masked and MASK in masked


def test_mask_text_leaves_other_words():
    text = "vllm serve model --max-num-batched-tokens 8192 --port 8000 NCCL_DEBUG=INFO"
    assert mask_text(text) == text
