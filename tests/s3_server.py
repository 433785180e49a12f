"""A real S3-compatible server (moto's standalone server) on 127.0.0.1 for the remote-storage tests.

The server runs in a thread of the test process and speaks HTTP like AWS S3; s3fs reaches it
through ``AWS_ENDPOINT_URL``, which subprocesses (gloo ranks, the ``memprofiler`` command)
inherit. Dummy credentials: moto accepts any.
"""

from __future__ import annotations

import os
import socket
import uuid
from collections.abc import Iterator
from dataclasses import dataclass

import pytest


@dataclass(frozen=True)
class S3Server:
    endpoint: str

    def new_bucket(self) -> str:
        """Create a bucket with a fresh name; its ``s3://`` URL."""
        import s3fs

        name = f"b-{uuid.uuid4().hex[:12]}"
        s3fs.S3FileSystem(skip_instance_cache=True).mkdir(name)
        return f"s3://{name}"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


ENV = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
}


@pytest.fixture(scope="session")
def s3_server() -> Iterator[S3Server]:
    """moto's server on a free port, with the AWS variables pointing at it for this process and
    its children; restored afterwards."""
    server_mod = pytest.importorskip("moto.server", reason="moto[server] is in the dev extra")
    pytest.importorskip("s3fs", reason="s3fs is in the dev extra")
    port = _free_port()
    server = server_mod.ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    env = {**ENV, "AWS_ENDPOINT_URL": f"http://127.0.0.1:{port}"}
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        yield S3Server(endpoint=env["AWS_ENDPOINT_URL"])
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        server.stop()


@pytest.fixture
def s3_bucket(s3_server: S3Server) -> str:
    """A fresh, empty bucket's URL (``s3://b-...``)."""
    return s3_server.new_bucket()
