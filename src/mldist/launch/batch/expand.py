"""Job-time ``$NAME`` / ``${NAME}`` in ``--env`` values, and nothing else of the shell.

The centre guides set variables from others the job's modules define
(``XLA_FLAGS=--xla_gpu_cuda_data_dir=${CUDA_PATH}``,
``LD_LIBRARY_PATH=$LD_LIBRARY_PATH:/opt/intel/vtune/lib64``). Such a value is
split into literal text and variable references here; the renderer quotes
the text with ``shlex`` and writes each reference as ``"${NAME-}"``, so the
shell expands the variables and nothing else. Command substitution,
backticks, positional and special parameters and ``${NAME:-...}`` forms are
refused; ``$$`` is a literal dollar.

Example:
    >>> shell_word("--xla_gpu_cuda_data_dir=${CUDA_PATH}")
    '--xla_gpu_cuda_data_dir="${CUDA_PATH-}"'
    >>> shell_word("price: $$5"), references("$A:${B}:$A")
    ("'price: $5'", ['A', 'B'])
"""

from __future__ import annotations

import re
import shlex

from ...errors import ConfigError

_NAME = r"[A-Za-z_][A-Za-z0-9_]*"
_REF = re.compile(rf"\$(?:\{{({_NAME})\}}|({_NAME})|(\$))")

#: The rule (docs/guides/batch-jobs.md explains it); every refusal ends with it.
_HINT = "only $NAME and ${NAME} expand when the job starts; write $$ for a literal $"


def pieces(value: str) -> list[tuple[bool, str]]:
    """``value`` as ``(is_variable, text)`` pieces; a ConfigError for any other shell syntax.

    Example:
        >>> pieces("a$B")
        [(False, 'a'), (True, 'B')]
    """
    if "`" in value:
        raise ConfigError(f"--env value {value!r} has a backtick (command substitution) and is refused; {_HINT}")
    out: list[tuple[bool, str]] = []
    text, i = [], 0
    while i < len(value):
        if value[i] != "$":
            text.append(value[i])
            i += 1
            continue
        m = _REF.match(value, i)
        if not m:
            raise ConfigError(f"--env value {value!r}: {_what(value[i:])} is refused; {_HINT}")
        if m.group(3):
            text.append("$")
        else:
            if text:
                out.append((False, "".join(text)))
                text = []
            out.append((True, m.group(1) or m.group(2)))
        i = m.end()
    if text:
        out.append((False, "".join(text)))
    return out


def _what(rest: str) -> str:
    """A name for the shell syntax at the start of ``rest`` (which begins with '$')."""
    if rest.startswith("$("):
        return "command substitution $(...)"
    if rest.startswith("${"):
        return f"the expansion {rest.split('}')[0]}}}"
    return f"{rest[:2]!r}"


def references(value: str) -> list[str]:
    """The variables ``value`` refers to, each once, in order."""
    names = [text for is_var, text in pieces(value) if is_var]
    return list(dict.fromkeys(names))


def shell_word(value: str) -> str:
    """One shell word that gives ``value`` with its variables expanded when the script runs."""
    parts = pieces(value)
    if not parts:
        return "''"
    return "".join(f'"${{{text}-}}"' if is_var else shlex.quote(text) for is_var, text in parts)
