"""Throwaway PKI for TLS tests, made with the ``openssl`` command line (no extra Python package):
a CA, a server certificate it signs for 127.0.0.1 / localhost, and a second, unrelated CA."""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest


@dataclass(frozen=True)
class Pki:
    ca: Path
    server_cert: Path
    server_key: Path
    rogue_ca: Path

    def read(self) -> tuple[bytes, bytes, bytes]:
        """(CA PEM, server certificate PEM, server key PEM)."""
        return self.ca.read_bytes(), self.server_cert.read_bytes(), self.server_key.read_bytes()


def _openssl(*args: str, cwd: Path) -> None:
    proc = subprocess.run(["openssl", *args], cwd=cwd, capture_output=True, text=True, timeout=60, check=False)
    if proc.returncode != 0:
        pytest.fail(f"openssl {' '.join(args)} failed:\n{proc.stderr}")


def _ca(name: str, d: Path) -> Path:
    _openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
             "-keyout", f"{name}.key", "-out", f"{name}.pem", "-days", "2", "-subj", f"/CN={name}",
             "-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign,cRLSign",
             cwd=d)
    return d / f"{name}.pem"


def make_pki(d: Path) -> Pki:
    if shutil.which("openssl") is None:
        pytest.fail("the openssl command line is needed to make test certificates")
    d.mkdir(parents=True, exist_ok=True)
    ca = _ca("toolwitness-test-ca", d)
    rogue = _ca("someone-else-ca", d)
    (d / "server.ext").write_text(
        "subjectAltName=DNS:localhost,IP:127.0.0.1\nbasicConstraints=CA:FALSE\n"
        "keyUsage=critical,digitalSignature,keyEncipherment\nextendedKeyUsage=serverAuth\n"
    )
    _openssl("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes", "-keyout", "server.key",
             "-out", "server.csr", "-subj", "/CN=localhost", cwd=d)
    _openssl("x509", "-req", "-in", "server.csr", "-CA", ca.name, "-CAkey", "toolwitness-test-ca.key",
             "-CAcreateserial", "-out", "server.pem", "-days", "2", "-extfile", "server.ext", cwd=d)
    return Pki(ca=ca, server_cert=d / "server.pem", server_key=d / "server.key", rogue_ca=rogue)
