"""Redaction: what ``mldist env``, ``mldist status`` and the job's environment record never print.

A variable is secret by its name (tokens, passwords, API keys); a URL's ``user:password@``
is hidden wherever it appears. ``mldist submit``'s shell record applies the same words.

Example:
    >>> redact("WANDB_API_KEY", "abc"), redact("NCCL_DEBUG", "INFO")
    ('<redacted>', 'INFO')
"""

from __future__ import annotations

import re

#: Shown instead of a secret.
REDACTED = "<redacted>"
#: A variable is secret when its name (any case) contains one of these words ...
SECRET_WORDS = ("TOKEN", "SECRET", "PASSWORD", "AUTH")
#: ... or ends with one of these.
SECRET_SUFFIXES = ("_KEY",)
_SECRET_NAME = re.compile(
    "|".join([*(f".*{w}.*" for w in SECRET_WORDS), *(f".*{s}" for s in SECRET_SUFFIXES)]), re.IGNORECASE | re.DOTALL
)
# scheme://USERINFO@host: the userinfo runs to the last "@" before the path (passwords may hold "@").
_URL_USERINFO = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*://)[^/\s\"]*@")


def is_secret_name(name: str) -> bool:
    """Whether variable ``name`` looks like it holds a secret (token, password, API key, ...).

    Example:
        >>> [is_secret_name(n) for n in ("WANDB_API_KEY", "hf_token", "AWS_SECRET_ACCESS_KEY", "NCCL_DEBUG")]
        [True, True, True, False]
    """
    return bool(_SECRET_NAME.fullmatch(name))


def redact_url(value: str) -> str:
    """``value`` with the ``user:password@`` part of every URL in it replaced (proxy settings).

    Example:
        >>> redact_url("http://alice:s3cret@proxy:3128")
        'http://<redacted>@proxy:3128'
        >>> redact_url("http://proxy:3128")
        'http://proxy:3128'
    """
    return _URL_USERINFO.sub(rf"\1{REDACTED}@", value)


def redact(name: str, value: str) -> str:
    """What may be shown of variable ``name``: nothing of a secret, no credentials in URLs.

    Example:
        >>> redact("WANDB_API_KEY", "abc"), redact("https_proxy", "http://u:p@proxy:3128")
        ('<redacted>', 'http://<redacted>@proxy:3128')
    """
    return REDACTED if is_secret_name(name) else redact_url(value)
