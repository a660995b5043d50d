"""Content digests as the protocol names them: BLAKE3, 64 lower-case hex digits, plus the size.

Shared by producers (SDK, CLI), the artifact store and the Authority's publication checks, so the
shape of a digest and the artifact stream's chunk size are written once.
"""

from __future__ import annotations

import re

HEX64 = re.compile(r"^[0-9a-f]{64}$")
# The empty blob: always present, never stored (spec: "the empty blob is always present").
EMPTY_BLAKE3 = "af1349b9f5f9a1a6a0404dea36dcc9499bcb25c9adc112b7cc9a93cae41f3262"
# Stream chunk size in both directions (documented in artifact_service.proto).
CHUNK_BYTES = 1024 * 1024
