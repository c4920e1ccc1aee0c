"""``mldist env`` never shows a secret: secret-looking variables and proxy credentials read ``<redacted>``."""

from __future__ import annotations

import json

import pytest

from helpers import check, clean_env, mldist
from mldist.base.secrets import REDACTED, is_secret_name, redact, redact_url
from mldist.tools.report import build_report, format_report

SECRET = "hunter2-s3cr3t"
PROXIES = ("http_proxy", "https_proxy", "HTTP_PROXY", "HTTPS_PROXY", "all_proxy", "ALL_PROXY", "grpc_proxy")

#: Shown variables (by prefix) with secret-looking names, each with its own value.
SECRETS = {
    "MLDIST_API_TOKEN": SECRET + "-a",
    "HOROVOD_DB_PASSWORD": SECRET + "-b",
    "NCCL_client_secret": SECRET + "-c",
    "OMP_WANDB_API_KEY": SECRET + "-d",
    "SLURM_AUTH_INFO": SECRET + "-e",
}
PROXY_ENV = {
    "https_proxy": f"http://alice:{SECRET}-f@proxy.example:3128",
    "HTTP_PROXY": f"http://bob:{SECRET}-g@proxy.example:3128/",
    "all_proxy": f"socks5h://{SECRET}-h@socks.example:1080",
    "http_proxy": "http://plain.example:3128",  # no credentials: shown as it is
}
SHOWN = {
    "https_proxy": "http://<redacted>@proxy.example:3128",
    "HTTP_PROXY": "http://<redacted>@proxy.example:3128/",
    "all_proxy": "socks5h://<redacted>@socks.example:1080",
    "http_proxy": "http://plain.example:3128",
    "MLDIST_COMMUNICATION": "ring",
} | dict.fromkeys(SECRETS, REDACTED)


def env_with_secrets() -> dict[str, str]:
    env = {k: v for k, v in clean_env().items() if k not in PROXIES and not k.startswith(("NCCL_", "TF_"))}
    return env | SECRETS | PROXY_ENV | {"MLDIST_COMMUNICATION": "ring"}


def test_mldist_env_json_redacts_secrets_and_proxy_credentials() -> None:
    res = check(mldist(["env", "--json", "--no-tensorflow"], env=env_with_secrets()))
    assert SECRET not in res.stdout + res.stderr
    shown = json.loads(res.stdout)["variables"]
    assert {k: shown[k] for k in SHOWN} == SHOWN


def test_mldist_env_plain_redacts_secrets_and_proxy_credentials() -> None:
    res = check(mldist(["env", "--no-tensorflow"], env=env_with_secrets()))
    assert SECRET not in res.stdout + res.stderr
    lines = res.stdout.splitlines()
    for name, value in SHOWN.items():
        assert f"env       {name}={value}" in lines, res.stdout


def test_build_report_redacts_and_format_report_prints_the_redacted_values() -> None:
    report = build_report({"MLDIST_X_TOKEN": SECRET, "https_proxy": f"http://u:{SECRET}@p:1"}, with_tensorflow=False)
    assert report["variables"] == {"MLDIST_X_TOKEN": REDACTED, "https_proxy": "http://<redacted>@p:1"}
    assert SECRET not in format_report(report) and SECRET not in json.dumps(report)


@pytest.mark.parametrize(
    "name, secret",
    [
        ("WANDB_API_KEY", True),
        ("hf_token", True),
        ("GITHUB_TOKEN", True),
        ("AWS_SECRET_ACCESS_KEY", True),
        ("MYSQL_PASSWORD", True),
        ("Password", True),
        ("HTTP_AUTHORIZATION", True),
        ("ssh_key", True),
        ("HF_TOKEN_FILE", True),  # a path, but its name says token: hidden too (harmless)
        ("NCCL_DEBUG", False),
        ("KEY", False),
        ("AWS_ACCESS_KEY_ID", False),
        ("KEYRING_BACKEND", False),
        ("MONKEY", False),
        ("http_proxy", False),
        ("no_proxy", False),
    ],
)
def test_secret_names(name: str, secret: bool) -> None:
    assert is_secret_name(name) is secret
    assert (redact(name, "value") == REDACTED) is secret


@pytest.mark.parametrize(
    "value, shown",
    [
        ("http://user:pw@proxy:3128", "http://<redacted>@proxy:3128"),
        ("http://user@proxy:3128", "http://<redacted>@proxy:3128"),
        ("http://user:p@ss@proxy:3128/x@y", "http://<redacted>@proxy:3128/x@y"),  # "@" in the password
        ("https://proxy.example:3128", "https://proxy.example:3128"),
        ("proxy.example:3128", "proxy.example:3128"),
        ("socks5://u:pw@a:1 http://v:pw@b:2", "socks5://<redacted>@a:1 http://<redacted>@b:2"),
        ("", ""),
    ],
)
def test_proxy_url_credentials_are_redacted(value: str, shown: str) -> None:
    assert redact_url(value) == shown
    assert redact("https_proxy", value) == shown
