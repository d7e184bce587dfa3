"""Keep credentials out of error messages and logs."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

#: Substrings of a storage option's key that mark its value as a credential.
SECRET_KEY_HINTS = ("secret", "key", "token", "password", "credential", "session")
#: Environment variables whose values are credentials.
SECRET_ENV_VARS = ("AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_ACCESS_KEY_ID", "AWS_SECURITY_TOKEN")
_MIN_LEN = 4  # shorter values would blank out ordinary words


def _secret_values(options: Mapping[str, Any]) -> list[str]:
    found = []
    for key, value in options.items():
        if isinstance(value, Mapping):
            found += _secret_values(value)
        elif isinstance(value, str) and any(h in key.lower() for h in SECRET_KEY_HINTS):
            found.append(value)
    return found


class Redactor:
    """Replaces every known credential in a text with ``***``.

    Credentials are the values of secret-looking keys in ``storage_options`` (at any depth, e.g. ``client_kwargs``)
    and of the AWS credential environment variables.
    """

    def __init__(self, storage_options: Mapping[str, Any] | None = None):
        values = _secret_values(storage_options or {}) + [os.environ.get(v, "") for v in SECRET_ENV_VARS]
        # Longest first, so a secret that contains another is removed whole.
        self._secrets = sorted({v for v in values if len(v) >= _MIN_LEN}, key=len, reverse=True)

    def __call__(self, text: str) -> str:
        for s in self._secrets:
            text = text.replace(s, "***")
        return text
