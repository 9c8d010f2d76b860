"""The records store's message headers."""

from __future__ import annotations

import base64
import json

from cotal_trio.natsio import Connection


async def ttl_header(conn: Connection, bucket: str, key: str) -> int:
    """The ``Nats-TTL`` the row under ``key`` was written with (a raw ``STREAM.MSG.GET``)."""
    request = json.dumps({"last_by_subj": f"$KV.{bucket}.{key}"}).encode()
    message = json.loads((await conn.request(f"$JS.API.STREAM.MSG.GET.KV_{bucket}", request)).data)["message"]
    headers = base64.b64decode(message["hdrs"]).decode().split("\r\n")
    return int(next(line.split(":", 1)[1] for line in headers if line.lower().startswith("nats-ttl:")))
