"""The client side of ArtifactService.Upload, and the go-ahead both sides agree on.

The client sends the header, then waits for the server's initial metadata: ``mwp-upload: send``
asks for the bytes; anything else means the server has answered already (a refusal, or a blob the
caller may read already). Bytes therefore never race the end of a refused call. That race matters:
when a write of a client-streaming call fails because the server has just ended it, grpc's asyncio
client replaces the server's status with INTERNAL "Internal error from Core", so the caller would
lose the structured refusal (seen through the front door, which forwards the bytes one hop later).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from missionweave.v1 import artifact_service_pb2 as pb

GO_AHEAD_KEY = "mwp-upload"
GO_AHEAD = ((GO_AHEAD_KEY, "send"),)

# BatchUpload / BatchDownload: a request (upload) or the blobs returned (download) at most this
# many bytes, under the transport's 4 MiB message limit (protos/missionweave/v1/artifact_service.proto).
MAX_BATCH_BYTES = 3 * 1024 * 1024
# What a batch entry costs beyond its bytes (digest, tags, lengths): for packing requests under
# MAX_BATCH_BYTES without serializing them twice.
BATCH_ENTRY_OVERHEAD = 128


def asks_for_bytes(metadata: Any) -> bool:
    return any(key == GO_AHEAD_KEY and value == "send" for key, value in metadata or ())


async def upload(
    stub: Any, header: pb.UploadHeader, chunks: Iterable[bytes], **call_options: Any
) -> pb.UploadResponse:
    """Uploads through ``stub`` (an ArtifactService stub): the header, then ``chunks`` in order
    if the server asks for them. Raises the server's refusal as an ``AioRpcError``."""
    call = stub.Upload(**call_options)
    await call.write(pb.UploadRequest(header=header))
    if asks_for_bytes(await call.initial_metadata()):
        offset = 0
        for data in chunks:
            await call.write(pb.UploadRequest(chunk=pb.UploadChunk(offset=offset, data=data)))
            offset += len(data)
        await call.done_writing()
        sent: pb.UploadResponse = await call
        return sent
    try:  # answered on the header: nothing more goes
        answered: pb.UploadResponse = await call
        return answered
    finally:  # the call has ended: this writes nothing, it only ends an intercepted call's request queue
        await call.done_writing()


def slices(data: bytes, chunk_bytes: int) -> Iterable[bytes]:
    if len(data) <= chunk_bytes:
        return (data,) if data else ()  # one chunk: the bytes themselves, not a copy
    view = memoryview(data)
    return (bytes(view[offset : offset + chunk_bytes]) for offset in range(0, len(data), chunk_bytes))
