"""Entra ID (Azure AD) bearer tokens for :class:`~scoring.evaluation.judges.OpenAIChatTarget`.

``OpenAIChatTarget(api_key=get_azure_openai_auth(endpoint))`` authenticates to an Azure
OpenAI / Azure AI endpoint with the ambient Azure identity instead of a key (PyRIT's
``pyrit.auth.get_azure_openai_auth``). The token comes from azure-identity's
``DefaultAzureCredential`` (environment, workload or managed identity, Azure CLI, …).

azure-identity is not a toolwitness dependency: it is imported when the first token is
requested, and a missing install is reported then, with what to do instead. Building the
provider never fails, so ``get_azure_openai_auth(os.environ.get(...))`` is safe to write
even where the variable is unset.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import urlparse

#: Token scope for Azure AI Foundry hosts (``*.ai.azure.com``).
AZURE_ML_SCOPE = "https://ml.azure.com/.default"
#: Token scope for every other Azure OpenAI / Cognitive Services host.
COGNITIVE_SERVICES_SCOPE = "https://cognitiveservices.azure.com/.default"

#: A token is fetched again when it has less than this long to live.
REFRESH_MARGIN_SECONDS = 300.0


class AzureIdentityNotInstalledError(ImportError):
    """``get_azure_openai_auth`` was used but the azure-identity package is not installed."""


def azure_token_scope(endpoint: str | None) -> str:
    """The Entra ID scope for ``endpoint``: :data:`AZURE_ML_SCOPE` for ``*.ai.azure.com``
    hosts, else :data:`COGNITIVE_SERVICES_SCOPE` (also when the endpoint is unknown)."""
    host = (urlparse(endpoint).hostname or "") if endpoint else ""
    return AZURE_ML_SCOPE if host == "ai.azure.com" or host.endswith(".ai.azure.com") else COGNITIVE_SERVICES_SCOPE


def _default_credential() -> Any:
    try:
        from azure.identity import DefaultAzureCredential
    except ImportError as exc:
        raise AzureIdentityNotInstalledError(
            "get_azure_openai_auth needs the azure-identity package, which toolwitness does not install: "
            "`pip install azure-identity`, or pass the key itself as OpenAIChatTarget(api_key='...') "
            "(or set OPENAI_CHAT_KEY)"
        ) from exc
    return DefaultAzureCredential()


class AzureTokenProvider:
    """An async callable returning a bearer token for one scope, cached until near expiry.

    The credential is created on the first call (that is when azure-identity is imported);
    the token request itself is blocking in azure-identity, so it runs in a worker thread.
    """

    def __init__(self, scope: str, *, credential_factory: Callable[[], Any] = _default_credential) -> None:
        self.scope = scope
        self._credential_factory = credential_factory
        self._credential: Any = None
        self._token: str | None = None
        self._expires_on = 0.0
        self._lock: asyncio.Lock | None = None

    def __repr__(self) -> str:  # never shows the token
        return f"{type(self).__name__}(scope={self.scope!r})"

    async def __call__(self) -> str:
        if self._lock is None:
            self._lock = asyncio.Lock()
        async with self._lock:
            if self._token is None or time.time() >= self._expires_on - REFRESH_MARGIN_SECONDS:
                if self._credential is None:
                    self._credential = self._credential_factory()
                access = await asyncio.to_thread(self._credential.get_token, self.scope)
                self._token = str(access.token)
                self._expires_on = float(access.expires_on)
            return self._token


def get_azure_openai_auth(endpoint: str | None) -> Callable[[], Awaitable[str]]:
    """An async token provider for ``endpoint`` (pass it as ``api_key``).

    ``endpoint`` only chooses the scope (see :func:`azure_token_scope`); None is accepted.
    Calling the provider raises :class:`AzureIdentityNotInstalledError` when azure-identity
    is missing, and azure-identity's own errors when no credential is available.
    """
    return AzureTokenProvider(azure_token_scope(endpoint))


__all__ = [
    "AZURE_ML_SCOPE",
    "COGNITIVE_SERVICES_SCOPE",
    "AzureIdentityNotInstalledError",
    "AzureTokenProvider",
    "azure_token_scope",
    "get_azure_openai_auth",
]
